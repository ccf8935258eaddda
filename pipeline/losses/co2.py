"""CO2's consistency regulariser (Wei et al. 2021; docs/methods/co2.md), a plug-in term: the divergence between the
query's and its positive's similarity distributions over the same negatives. One function per negative set: a
MoCo queue, SimCLR's in-batch views (and their slice of views gathered across ranks), MoCo v3's key bank.

Tested against direct float64 computations in tests/test_plugin_losses.py and tests/methods/test_vit_methods.py.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pipeline.losses.precision import float32


def _kl_terms(log_p: torch.Tensor, log_q: torch.Tensor, divergence: str) -> torch.Tensor:
    """Per-row divergence between two log-distributions: "symmetric" = ½KL(P‖Q) + ½KL(Q‖P), "forward" = KL(P‖Q),
    "reverse" = KL(Q‖P)."""
    fwd = lambda: (log_p.exp() * (log_p - log_q)).sum(dim=1)  # noqa: E731
    rev = lambda: (log_q.exp() * (log_q - log_p)).sum(dim=1)  # noqa: E731
    if divergence == "symmetric":
        return 0.5 * fwd() + 0.5 * rev()
    if divergence == "forward":
        return fwd()
    if divergence == "reverse":
        return rev()
    raise ValueError(f"divergence must be 'symmetric', 'forward' or 'reverse', got {divergence!r}")


@float32
def co2_consistency(
    q: torch.Tensor, k: torch.Tensor, queue: torch.Tensor, temperature: float, *, divergence: str = "symmetric"
) -> torch.Tensor:
    """CO2's consistency term (Wei et al. 2021, Eqs. 2-4; docs/methods/co2.md §1.3), mean over the batch.

    Both distributions run over the K negatives n_1..n_K ONLY (the positive logit is not in either softmax, sums
    k=1..K):
        Q(i) = softmax_i(q·n_i/τ_con)   (Eq. 2, the prediction)
        P(i) = softmax_i(p·n_i/τ_con)   (Eq. 3, the pseudo label)
        L_con = ½ KL(P‖Q) + ½ KL(Q‖P)   (Eq. 4; a half-sum, not a plain sum)
    P is a constant target: k and the queue are detached (MoCo: "only q can propagate gradients", §1.3), so the
    gradient reaches q only. The batch reduction is not stated in the paper; per-sample divergence averaged over the
    batch, like L_ins (§6 item 2).

    Args:
        q: [B, D] L2-normalised queries.
        k: [B, D] L2-normalised positive keys (the paper's p).
        queue: [K, D] L2-normalised negatives n_1..n_K.
        temperature: τ_con.
        divergence: "symmetric" (Eq. 4); "forward" | "reverse" give the Table 4 ablations KL(P‖Q) / KL(Q‖P).

    Example: `loss = co2_consistency(q, k, queue, 0.05)`
    """
    k = k.detach()
    queue = queue.detach()
    log_q = F.log_softmax(q @ queue.t() / temperature, dim=1)
    log_p = F.log_softmax(k @ queue.t() / temperature, dim=1)
    return _kl_terms(log_p, log_q, divergence).mean()


@float32
def co2_consistency_inbatch(
    z1: torch.Tensor,
    z2: torch.Tensor,
    temperature: float,
    *,
    detach_target: bool = False,
    divergence: str = "symmetric",
) -> torch.Tensor:
    """CO2's consistency term on SimCLR (docs/methods/co2.md §5 "SimCLR + CO2 variant"), mean over the 2B anchors.

    Every one of the 2B views is a query once; its twin is the positive p. Q and P are softmaxes over the SAME
    negatives, those of `nt_xent`: the 2B-2 other views (both sides) of the other images. L = mean over anchors of
    ½KL(P‖Q) + ½KL(Q‖P) (Eq. 4).

    The paper leaves the SimCLR negative set and the stop-gradient unspecified (§1.3, §6 item 4). Choices: negatives
    as in NT-Xent; by default P is NOT detached ("p and q are exchangeable" with an end-to-end encoder).
    `detach_target=True` treats each anchor's P as a constant. Because the negative set of anchor (view 1, i) equals
    that of (view 2, i) and Eq. 4 is symmetric, both choices give the same value; with `detach_target=True` the
    gradient is exactly half that of the default.

    Args:
        z1, z2: [B, D] projections of the two views (normalised here, as in `nt_xent`).
        temperature: τ_con.
        detach_target: treat each anchor's P as a constant.
        divergence: "symmetric" (Eq. 4), "forward" = KL(P‖Q) or "reverse" = KL(Q‖P).

    Example: `loss = co2_consistency_inbatch(z1, z2, 0.1)`
    """
    b = z1.shape[0]
    z = F.normalize(torch.cat([z1, z2]), dim=1)
    n = 2 * b
    idx = torch.arange(n, device=z.device)
    twin = (idx + b) % n
    keep = ~(F.one_hot(idx, n).bool() | F.one_hot(twin, n).bool())  # drop self and twin
    neg_logits = (z @ z.t() / temperature)[keep].view(n, n - 2)  # column order is the same for i and its twin
    log_q = F.log_softmax(neg_logits, dim=1)
    log_p = log_q[twin]
    if detach_target:
        log_p = log_p.detach()
    return _kl_terms(log_p, log_q, divergence).mean()


@float32
def co2_consistency_anchors(
    a1: torch.Tensor,
    a2: torch.Tensor,
    c1: torch.Tensor,
    c2: torch.Tensor,
    temperature: float,
    offset: int = 0,
    *,
    detach_target: bool = False,
    divergence: str = "symmetric",
) -> torch.Tensor:
    """`co2_consistency_inbatch` for a slice of anchors against candidates gathered from every worker (the
    `nt_xent_anchors` layout). Negatives of an anchor: the 2N-2 candidates other than itself and its twin. With one
    rank (offset 0, a == c) this is exactly `co2_consistency_inbatch`; averaged over ranks it is the global loss.

    Args:
        a1, a2: [b, D] this rank's views.
        c1, c2: [N, D] all ranks' views, with this rank's rows at offset..offset+b.
        temperature: τ_con.
        offset: the row of this rank's first view in c1 and c2.
        detach_target: treat each anchor's P as a constant (as in `co2_consistency_inbatch`).
        divergence: "symmetric" (Eq. 4), "forward" = KL(P‖Q) or "reverse" = KL(Q‖P).

    Example: `loss = co2_consistency_anchors(z1, z2, c1, c2, 0.1, offset)`
    """
    b, n = a1.shape[0], c1.shape[0]
    anchors = F.normalize(torch.cat([a1, a2]), dim=1)
    cands = F.normalize(torch.cat([c1, c2]), dim=1)
    local = torch.arange(b, device=a1.device) + offset
    self_cols, twin_cols = torch.cat([local, local + n]), torch.cat([local + n, local])
    drop = F.one_hot(self_cols, 2 * n).bool() | F.one_hot(twin_cols, 2 * n).bool()
    neg_logits = (anchors @ cands.t() / temperature)[~drop].view(2 * b, 2 * n - 2)
    log_q = F.log_softmax(neg_logits, dim=1)
    twin_rows = torch.cat([torch.arange(b, 2 * b), torch.arange(b)]).to(a1.device)
    log_p = log_q[twin_rows]  # an anchor and its twin share the negative set, in the same column order
    if detach_target:
        log_p = log_p.detach()
    return _kl_terms(log_p, log_q, divergence).mean()


@float32
def co2_consistency_bank(
    q: torch.Tensor,
    k: torch.Tensor,
    bank: torch.Tensor,
    offset: int,
    temperature: float,
    *,
    divergence: str = "symmetric",
) -> torch.Tensor:
    """CO2's consistency term (Eqs. 2-4) with in-batch negatives (MoCo v3, which has no queue), mean over the batch.

    The negatives of q_i are the N - 1 bank rows other than its positive; Q (from q_i) and P (from k_i) are softmaxes
    over them at tau_con; L = ½KL(P‖Q) + ½KL(Q‖P) per query, as `co2_consistency` with the bank in place of the
    queue. Keys are detached (only q propagates gradients, as on MoCo).

    Args:
        q: [b, D] L2-normalised queries.
        k: [b, D] L2-normalised positive keys (detached).
        bank: [N, D] every worker's keys of the key view, row offset + i being q_i's positive (detached).
        offset: the row of q_0's positive in bank.
        temperature: tau_con.
        divergence: "symmetric" (Eq. 4), "forward" = KL(P‖Q) or "reverse" = KL(Q‖P).

    Example: `loss = co2_consistency_bank(q, k, bank, offset, 0.2)`
    """
    k, bank = k.detach(), bank.detach()
    b, n = q.shape[0], bank.shape[0]
    own = F.one_hot(torch.arange(b, device=q.device) + offset, n).bool()
    log_q = F.log_softmax((q @ bank.t() / temperature)[~own].view(b, n - 1), dim=1)
    log_p = F.log_softmax((k @ bank.t() / temperature)[~own].view(b, n - 1), dim=1)
    return _kl_terms(log_p, log_q, divergence).mean()
