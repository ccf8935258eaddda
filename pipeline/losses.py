"""Loss functions, one per equation, as pure functions of tensors.

Each is tested against a direct float64 computation of its paper's equation (tests/test_losses.py).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def info_nce(q: torch.Tensor, k: torch.Tensor, queue: torch.Tensor, temperature: float) -> torch.Tensor:
    """MoCo's InfoNCE (He et al. 2020, Eq. 1), mean over the batch.

    q, k: [B, D] L2-normalised queries and positive keys; queue: [K, D] L2-normalised negatives.
    L = -log exp(q.k/T) / (exp(q.k/T) + sum_j exp(q.queue_j/T)). Keys carry no gradient.
    """
    k = k.detach()
    queue = queue.detach()
    pos = (q * k).sum(dim=1, keepdim=True)
    neg = q @ queue.t()
    logits = torch.cat([pos, neg], dim=1) / temperature
    labels = torch.zeros(q.shape[0], dtype=torch.long, device=q.device)
    return F.cross_entropy(logits, labels)


def nt_xent(z1: torch.Tensor, z2: torch.Tensor, temperature: float) -> torch.Tensor:
    """SimCLR's NT-Xent (Chen et al. 2020, Eq. 1) over the 2B views, symmetric, mean over the 2B anchors.

    z1, z2: [B, D] projections of the two views (normalised here). Each anchor has one positive (its twin)
    and 2B-2 negatives (every other view, from either side).
    """
    return nt_xent_anchors(z1, z2, z1, z2, temperature)


def nt_xent_anchors(
    a1: torch.Tensor, a2: torch.Tensor, c1: torch.Tensor, c2: torch.Tensor, temperature: float, offset: int = 0
) -> torch.Tensor:
    """NT-Xent for a slice of anchors against all candidates, for negatives gathered across ranks.

    a1, a2: [b, D] this rank's views; c1, c2: [N, D] every rank's views, where this rank's rows sit at
    c*[offset:offset+b]. With one rank (offset 0, a == c) this is exactly `nt_xent`.
    """
    b, n = a1.shape[0], c1.shape[0]
    anchors = F.normalize(torch.cat([a1, a2]), dim=1)
    cands = F.normalize(torch.cat([c1, c2]), dim=1)
    logits = anchors @ cands.t() / temperature
    local = torch.arange(b, device=a1.device) + offset
    self_cols = torch.cat([local, local + n])
    pos_cols = torch.cat([local + n, local])
    logits = logits.masked_fill(F.one_hot(self_cols, 2 * n).bool(), float("-inf"))
    return F.cross_entropy(logits, pos_cols)
