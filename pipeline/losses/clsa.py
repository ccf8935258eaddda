"""CLSA's distributional divergence minimisation L_D (Wang & Qi 2021; docs/methods/clsa.md), a plug-in term: the
weak view's similarity distribution supervises the strong view's. Tested against a direct float64 computation in
tests/test_plugin_losses.py."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pipeline.losses.precision import float32


@float32
def ddm(
    q_weak: torch.Tensor,
    q_strong: torch.Tensor,
    k: torch.Tensor,
    queue: torch.Tensor,
    temperature: float,
    *,
    batch_keys: bool = False,
) -> torch.Tensor:
    """CLSA's distributional divergence minimisation L_D (Wang & Qi 2021, Eq. 6; docs/methods/clsa.md §1.5), batch mean.

    Over the support {z_i} ∪ queue (K+1 entries, positive first; Eqs. 3 and 5, k=1..K):
        L_D = mean_i [ -Σ_j p(z_j|z'_i) log p(z_j|z''_i) ],  p(·|z) = softmax([z·z_i, z·queue] / τ).
    The weak distribution includes the positive, uses the same τ as the strong one (no sharpening) and is
    stop-gradient ("the gradient is only propagated through p(·|z''_i)"); k and the queue are keys and carry no
    gradient either. For CLSA* (several strong views) the paper SUMS L_D over them (§1.6): call once per view.

    Paper vs code (§5 [CODE] 1, §6 item 2): the official code scores every query against ALL the batch's keys (label =
    own index) plus the queue, so other images' current keys are extra negatives. Default follows the paper (own
    positive + queue); `batch_keys=True` gives the code's support [k_1..k_B, queue] (B+K entries, not gathered across
    ranks here).

    Args:
        q_weak: [B, D] L2-normalised weak queries z' (detached).
        q_strong: [B, D] L2-normalised strong queries z''.
        k: [B, D] L2-normalised positive keys z (detached).
        queue: [K, D] L2-normalised negatives (detached).
        temperature: τ, of both distributions.
        batch_keys: the code's support [k_1..k_B, queue] instead of the paper's [k_i, queue].

    Example: `loss = ddm(q_weak, q_strong, k, queue, 0.2)`
    """
    k, queue = k.detach(), queue.detach()
    target = F.softmax(_logits(q_weak.detach(), k, queue, temperature, batch_keys), dim=1)
    return -(target * F.log_softmax(_logits(q_strong, k, queue, temperature, batch_keys), dim=1)).sum(dim=1).mean()


@float32
def strong_infonce(
    q_strong: torch.Tensor,
    k: torch.Tensor,
    queue: torch.Tensor,
    temperature: float,
    *,
    batch_keys: bool = False,
    offset: int = 0,
) -> torch.Tensor:
    """The plain contrastive loss on the strong views that CLSA's Table 5 sets against DDM ("CLSA with contrastive
    loss"): InfoNCE of each strong query over the same support as `ddm` (its own key first, then the queue; with
    `batch_keys` every key of the batch, its own at its index), batch mean: ddm with a one-hot target on the
    positive in place of the weak query's distribution. `offset`: where this worker's own keys start in `k` (MoCo
    v3's bank of every worker's keys).
        L = mean_i [ -log p(z_i | z''_i) ],  p(·|z) = softmax([z·z_i, z·queue] / τ).
    """
    k, queue = k.detach(), queue.detach()
    logits = _logits(q_strong, k, queue, temperature, batch_keys)
    own = torch.arange(len(q_strong), device=logits.device)
    labels = own + offset if batch_keys else torch.zeros_like(own)
    return F.cross_entropy(logits, labels)


def _logits(
    z: torch.Tensor, k: torch.Tensor, queue: torch.Tensor, temperature: float, batch_keys: bool
) -> torch.Tensor:
    """[z·positive (or z·every key of the batch), z·queue] / τ."""
    pos = z @ k.t() if batch_keys else (z * k).sum(dim=1, keepdim=True)
    return torch.cat([pos, z @ queue.t()], dim=1) / temperature
