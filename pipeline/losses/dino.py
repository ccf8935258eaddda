"""DINO's self-distillation loss (Caron et al. 2021): the cross-entropy from a centred, sharpened teacher to the
student over pairs of crops. Tested against a direct float64 computation in tests/methods/test_vit_methods.py."""

from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F

from pipeline.losses.precision import float32


@float32
def dino_loss(
    student: list[torch.Tensor],
    teacher: list[torch.Tensor],
    center: torch.Tensor,
    student_temperature: float,
    teacher_temperature: float,
) -> torch.Tensor:
    """DINO's loss (Caron et al. 2021, Eq. 3 with multi-crop, and Alg. 1), mean over the pairs and the batch.

        P_t = softmax((g_t(x) − c) / τ_t),  P_s = softmax(g_s(x') / τ_s)
        L = mean over pairs (t, s), s ≠ t, of mean over the batch of −Σ_k P_t(k) log P_s(k)
    The teacher's side is a constant (stop-gradient); centering and sharpening are what avoid collapse.

    Args:
        student: per crop, the student's outputs [B, K] (every global and local crop).
        teacher: per global crop, the teacher's outputs [B, K], in the same order as the student's first crops
            (detached).
        center: c, [K] (or [1, K]).
        student_temperature: τ_s.
        teacher_temperature: τ_t.

    Example: `loss = dino_loss([s1, s2, *s_local], [t1, t2], center, 0.1, 0.04)`
    """
    targets = [F.softmax((t.detach() - center) / teacher_temperature, dim=-1) for t in teacher]
    logs = [F.log_softmax(s / student_temperature, dim=-1) for s in student]
    terms = [-(p * logs[j]).sum(dim=-1).mean() for i, p in enumerate(targets) for j in range(len(logs)) if j != i]
    return cast(torch.Tensor, sum(terms) / len(terms))  # a sum of tensors
