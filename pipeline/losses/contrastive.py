"""Contrastive losses: a softmax over similarities that picks each anchor's positive among negatives. MoCo's
InfoNCE (negatives from a queue), SimCLR's NT-Xent (the other views of the batch), MoCo v3's ctr (the other keys of
the batch) and SupCon (positives by label).

Each is tested against a direct float64 computation of its paper's equation: tests/test_losses.py (InfoNCE,
NT-Xent), tests/methods/test_vit_methods.py (MoCo v3), tests/methods/test_frameworks.py (SupCon).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pipeline.losses.precision import float32


@float32
def info_nce(q: torch.Tensor, k: torch.Tensor, queue: torch.Tensor, temperature: float) -> torch.Tensor:
    """MoCo's InfoNCE (He et al. 2020, Eq. 1), mean over the batch.

    L = -log exp(q.k/T) / (exp(q.k/T) + sum_j exp(q.queue_j/T)). Keys carry no gradient.

    Args:
        q: [B, D] L2-normalised queries.
        k: [B, D] L2-normalised positive keys (detached).
        queue: [K, D] L2-normalised negatives (detached).
        temperature: T.

    Example: `loss = info_nce(q, k, queue, 0.2)`
    """
    k = k.detach()
    queue = queue.detach()
    pos = (q * k).sum(dim=1, keepdim=True)
    neg = q @ queue.t()
    logits = torch.cat([pos, neg], dim=1) / temperature
    labels = torch.zeros(q.shape[0], dtype=torch.long, device=q.device)
    return F.cross_entropy(logits, labels)


@float32
def nt_xent(z1: torch.Tensor, z2: torch.Tensor, temperature: float) -> torch.Tensor:
    """SimCLR's NT-Xent (Chen et al. 2020, Eq. 1) over the 2B views, symmetric, mean over the 2B anchors.

    Each anchor has one positive (its twin) and 2B-2 negatives (every other view, from either side).

    Args:
        z1, z2: [B, D] projections of the two views (normalised here).
        temperature: τ.

    Example: `loss = nt_xent(z1, z2, 0.1)`
    """
    return nt_xent_anchors(z1, z2, z1, z2, temperature)


@float32
def nt_xent_anchors(
    a1: torch.Tensor, a2: torch.Tensor, c1: torch.Tensor, c2: torch.Tensor, temperature: float, offset: int = 0
) -> torch.Tensor:
    """NT-Xent for a slice of anchors against all candidates, for negatives gathered across ranks.

    With one rank (offset 0, a == c) this is exactly `nt_xent`.

    Args:
        a1, a2: [b, D] this rank's views.
        c1, c2: [N, D] every rank's views, where this rank's rows sit at c*[offset:offset+b].
        temperature: τ.
        offset: the row of this rank's first view in c1 and c2.

    Example: `loss = nt_xent_anchors(z1, z2, c1, c2, 0.1, offset=rank * b)`
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


@float32
def mocov3_loss(q: torch.Tensor, keys: torch.Tensor, offset: int, temperature: float) -> torch.Tensor:
    """MoCo v3's contrastive loss for one direction (Chen, Xie, He 2021, Alg. 1 `ctr`), mean over the batch.

        ctr(q, k) = 2τ · CE(q kᵀ / τ, positives)
    The factor 2τ is the paper's: it makes the gradient's scale independent of τ (Alg. 1's comment). The full loss
    is ctr(q1, k2) + ctr(q2, k1). Keys carry no gradient.

    Args:
        q: [b, D] L2-normalised queries (predictor outputs).
        keys: [N, D] L2-normalised momentum-encoder keys of the other view from every worker, q_i's positive at row
            offset + i, the other N - 1 rows its negatives (no queue); detached.
        offset: the row of q_0's positive in keys.
        temperature: τ.

    Example: `loss = mocov3_loss(q1, keys2, rank * b, 0.2) + mocov3_loss(q2, keys1, rank * b, 0.2)`
    """
    keys = keys.detach()
    labels = torch.arange(q.shape[0], device=q.device) + offset
    return 2 * temperature * F.cross_entropy(q @ keys.t() / temperature, labels)


@float32
def supcon_loss(
    z: torch.Tensor,
    labels: torch.Tensor,
    temperature: float,
    *,
    candidates: torch.Tensor | None = None,
    candidate_labels: torch.Tensor | None = None,
    self_index: torch.Tensor | None = None,
) -> torch.Tensor:
    """SupCon's L^sup_out (Khosla et al. 2020, Eq. 2), mean over the anchors.

    Over candidates A(i) = every embedding except the anchor itself and positives P(i) = the candidates of A(i) that
    share i's label (the other views of the same image included):
        L_i = −1/|P(i)| Σ_{p∈P(i)} log( exp(z_i·z_p/τ) / Σ_{a∈A(i)} exp(z_i·z_a/τ) ).
    The paper sums L_i over anchors; here they are averaged (as the authors' code does, without its extra
    τ/base_τ factor) so the value does not grow with the batch. An anchor with no positive contributes 0.
    Averaged over equal-sized workers the loss with gathered candidates is the loss of the global batch.

    Args:
        z: [M, D] anchor embeddings (every view of every image, e.g. cat([view1, view2]); normalised here).
        labels: [M] int class of each anchor.
        temperature: τ.
        candidates: [N, D] every worker's embeddings, for gathered negatives; default z.
        candidate_labels: [N] their classes; needed with candidates (default labels when candidates is None).
        self_index: [M] each local anchor's own row in candidates (excluded from A(i)); default arange(M).

    Example: `loss = supcon_loss(torch.cat([z1, z2]), torch.cat([y, y]), 0.1)`
    """
    if candidates is None:
        candidates, candidate_labels = z, labels
    if candidate_labels is None:
        raise ValueError("candidate_labels are needed with candidates")
    if self_index is None:
        self_index = torch.arange(z.shape[0], device=z.device)
    anchors = F.normalize(z, dim=1)
    cands = F.normalize(candidates, dim=1)
    is_self = F.one_hot(self_index, cands.shape[0]).bool()
    logits = (anchors @ cands.t() / temperature).masked_fill(is_self, float("-inf"))
    log_prob = F.log_softmax(logits, dim=1)  # the softmax runs over A(i): the anchor itself is -inf
    positive = (labels.view(-1, 1) == candidate_labels.view(1, -1)) & ~is_self
    pos_log_prob = torch.where(positive, log_prob, torch.zeros_like(log_prob)).sum(dim=1)
    return (-pos_log_prob / positive.sum(dim=1).clamp(min=1)).mean()
