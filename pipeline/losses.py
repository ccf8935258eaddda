"""Loss functions, one per equation, as pure functions of tensors.

Each is tested against a direct float64 computation of its paper's equation (tests/test_losses.py).
"""

from __future__ import annotations

import functools
from typing import cast

import torch
import torch.nn.functional as F


def _f32(x):
    if torch.is_tensor(x):
        return x.float() if x.dtype in (torch.bfloat16, torch.float16) else x  # float64 stays float64
    if isinstance(x, (list, tuple)):
        return type(x)(_f32(v) for v in x)
    return x


def float32(fn):
    """Run a loss in float32 whatever the step's autocast says: under bf16 autocast the similarity matmuls would
    otherwise run in bf16 (about 3 significant digits: at τ = 0.1 a logit of 10 is off by up to 0.06) and some
    losses would come out in bf16. Float32 and float64 inputs pass through as the same tensors, so autograd.grad
    w.r.t. them still works."""

    @functools.wraps(fn)
    def run(*args, **kwargs):
        device = next((t.device.type for t in (*args, *kwargs.values()) if torch.is_tensor(t)), "cpu")
        with torch.autocast(device_type=device, enabled=False):
            return fn(*_f32(args), **{k: _f32(v) for k, v in kwargs.items()})

    return run


@float32
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


@float32
def nt_xent(z1: torch.Tensor, z2: torch.Tensor, temperature: float) -> torch.Tensor:
    """SimCLR's NT-Xent (Chen et al. 2020, Eq. 1) over the 2B views, symmetric, mean over the 2B anchors.

    z1, z2: [B, D] projections of the two views (normalised here). Each anchor has one positive (its twin)
    and 2B-2 negatives (every other view, from either side).
    """
    return nt_xent_anchors(z1, z2, z1, z2, temperature)


@float32
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


# ---------------------------------------------------------------------------------------------------------------
# Plug-in regularisers: CO2 (Wei et al. 2021), CLSA's DDM (Wang & Qi 2021), InvCLR (Foster et al. 2021).
# Tested in tests/test_plugin_losses.py.
# ---------------------------------------------------------------------------------------------------------------


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

    q: [B, D] L2-normalised queries; k: [B, D] L2-normalised positive keys (the paper's p); queue: [K, D]
    L2-normalised negatives n_1..n_K. Both distributions run over the K negatives ONLY (the positive logit is not in
    either softmax, sums k=1..K):
        Q(i) = softmax_i(q·n_i/τ_con)   (Eq. 2, the prediction)
        P(i) = softmax_i(p·n_i/τ_con)   (Eq. 3, the pseudo label)
        L_con = ½ KL(P‖Q) + ½ KL(Q‖P)   (Eq. 4; a half-sum, not a plain sum)
    P is a constant target: k and the queue are detached (MoCo: "only q can propagate gradients", §1.3), so the
    gradient reaches q only. The batch reduction is not stated in the paper; per-sample divergence averaged over the
    batch, like L_ins (§6 item 2). `divergence="forward"|"reverse"` gives the Table 4 ablations KL(P‖Q) / KL(Q‖P).
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

    z1, z2: [B, D] projections of the two views (normalised here, as in `nt_xent`). Every one of the 2B views is a
    query once; its twin is the positive p. Q and P are softmaxes over the SAME negatives, those of `nt_xent`: the
    2B-2 other views (both sides) of the other images. L = mean over anchors of ½KL(P‖Q) + ½KL(Q‖P) (Eq. 4).

    The paper leaves the SimCLR negative set and the stop-gradient unspecified (§1.3, §6 item 4). Choices: negatives
    as in NT-Xent; by default P is NOT detached ("p and q are exchangeable" with an end-to-end encoder).
    `detach_target=True` treats each anchor's P as a constant. Because the negative set of anchor (view 1, i) equals
    that of (view 2, i) and Eq. 4 is symmetric, both choices give the same value; with `detach_target=True` the
    gradient is exactly half that of the default.
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
    `nt_xent_anchors` layout): a1, a2 [b, D] this rank's views, c1, c2 [N, D] all ranks' views with this rank's rows
    at offset..offset+b. Negatives of an anchor: the 2N-2 candidates other than itself and its twin. With one rank
    (offset 0, a == c) this is exactly `co2_consistency_inbatch`; averaged over ranks it is the global loss."""
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

    q, k: [b, D] L2-normalised queries and their positive keys; bank: [N, D] every worker's keys of the key view,
    row offset + i being q_i's positive. The negatives of q_i are the N - 1 other rows; Q (from q_i) and P (from k_i)
    are softmaxes over them at tau_con; L = ½KL(P‖Q) + ½KL(Q‖P) per query, as `co2_consistency` with the bank in
    place of the queue. Keys are detached (only q propagates gradients, as on MoCo)."""
    k, bank = k.detach(), bank.detach()
    b, n = q.shape[0], bank.shape[0]
    own = F.one_hot(torch.arange(b, device=q.device) + offset, n).bool()
    log_q = F.log_softmax((q @ bank.t() / temperature)[~own].view(b, n - 1), dim=1)
    log_p = F.log_softmax((k @ bank.t() / temperature)[~own].view(b, n - 1), dim=1)
    return _kl_terms(log_p, log_q, divergence).mean()


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

    q_weak: [B, D] weak queries z'; q_strong: [B, D] strong queries z''; k: [B, D] positive keys z; queue: [K, D];
    all L2-normalised. Over the support {z_i} ∪ queue (K+1 entries, positive first; Eqs. 3 and 5, k=1..K):
        L_D = mean_i [ -Σ_j p(z_j|z'_i) log p(z_j|z''_i) ],  p(·|z) = softmax([z·z_i, z·queue] / τ).
    The weak distribution includes the positive, uses the same τ as the strong one (no sharpening) and is
    stop-gradient ("the gradient is only propagated through p(·|z''_i)"); k and the queue are keys and carry no
    gradient either. For CLSA* (several strong views) the paper SUMS L_D over them (§1.6): call once per view.

    Paper vs code (§5 [CODE] 1, §6 item 2): the official code scores every query against ALL the batch's keys (label =
    own index) plus the queue, so other images' current keys are extra negatives. Default follows the paper (own
    positive + queue); `batch_keys=True` gives the code's support [k_1..k_B, queue] (B+K entries, not gathered across
    ranks here).
    """
    k = k.detach()
    queue = queue.detach()
    q_weak = q_weak.detach()

    def logits(z):
        pos = z @ k.t() if batch_keys else (z * k).sum(dim=1, keepdim=True)
        return torch.cat([pos, z @ queue.t()], dim=1) / temperature

    target = F.softmax(logits(q_weak), dim=1)
    return -(target * F.log_softmax(logits(q_strong), dim=1)).sum(dim=1).mean()


@float32
def scalar_projection(z: torch.Tensor, e: torch.Tensor, *, normalize: bool = True) -> torch.Tensor:
    """InvCLR's F (Foster et al. 2021, Eq. 5; docs/methods/invclr.md §1.1): F = e · z/‖z‖₂.

    z: [K, D] (one view per sample) or [K, L, D] (L augmentations per sample); e: [K, D], one direction per sample,
    shared by that sample's L views (Eq. 7 fixes x_i, β_i, e_i and varies α). Returns [K] or [K, L].
    `normalize=False` drops the L2 normalisation (the code's --no-gp-normalization; the paper normalises).
    """
    if z.dim() == e.dim() + 1:
        e = e.unsqueeze(-2)
    if normalize:
        z = F.normalize(z, dim=-1)
    return (e * z).sum(dim=-1)


def rademacher(shape, *, generator: torch.Generator | None = None, dtype=torch.float32, device=None) -> torch.Tensor:
    """Independent ±1 entries with probability ½ each (InvCLR's p(e), docs/methods/invclr.md §1.1)."""
    bits = torch.randint(0, 2, tuple(shape), generator=generator, device=device)
    return (2 * bits - 1).to(dtype)


@float32
def conditional_variance(F_values: torch.Tensor) -> torch.Tensor:
    """InvCLR's nested Monte Carlo estimate of V (Foster et al. 2021, Eq. 7; docs/methods/invclr.md §1.1).

    F_values: [K, L], F(α_ij, β_i, x_i, e_i) for L draws of α per sample (build it with `scalar_projection`).
        V ≈ (1/K) Σ_i [ (1/(L-1)) Σ_j F_ij² - (1/(L(L-1))) (Σ_j F_ij)² ],
    i.e. the unbiased (Bessel-corrected) within-sample variance, averaged over samples. Needs L >= 2.
    """
    if F_values.dim() != 2 or F_values.shape[1] < 2:
        raise ValueError(f"F_values must be [K, L] with L >= 2, got {tuple(F_values.shape)}")
    return F_values.var(dim=1, correction=1).mean()


@float32
def projection_alpha_grad(
    z: torch.Tensor, alpha: torch.Tensor, e: torch.Tensor, *, normalize: bool = True, create_graph: bool = True
) -> torch.Tensor:
    """Per-sample ∇_α F(α_i) for F_i = e_i · z_i/‖z_i‖ (docs/methods/invclr.md §1.2, "random vector" trick), [K, d_α].

    One reverse pass of the scalar Σ_i e_i·ẑ_i w.r.t. the batch tensor alpha [K, d_α] gives row i = e_iᵀ ∂ẑ_i/∂α_i,
    a vector-Jacobian product, PROVIDED z_i depends on α_i only. BatchNorm in training mode (or anything else that
    mixes samples) breaks this: the batched gradient then carries cross-sample terms and is not the per-sample
    ∇_α F_i (§7 item 5; the paper and the code ignore this). If z does not depend on alpha the gradient is zero.
    `create_graph=True` keeps the graph so a penalty on the result back-propagates into the network (double backprop).
    """
    total = scalar_projection(z, e, normalize=normalize).sum()
    if not total.requires_grad:
        return torch.zeros_like(alpha)
    (grad,) = torch.autograd.grad(total, alpha, create_graph=create_graph, retain_graph=True, allow_unused=True)
    return torch.zeros_like(alpha) if grad is None else grad


@float32
def gradient_penalty(
    z: torch.Tensor,
    alpha: torch.Tensor,
    alpha_prime: torch.Tensor,
    e: torch.Tensor | None = None,
    *,
    generator: torch.Generator | None = None,
    clip: float | None = 1.0,
    lam: float = 0.1,
    normalize: bool = True,
    halve: bool = False,
) -> torch.Tensor:
    """InvCLR's gradient regulariser, the λ term of Eq. 13 (Foster et al. 2021; docs/methods/invclr.md §1.2):
        λ · clip( (1/(LK)) Σ_i Σ_j [ ∇_α F(α_i) · (α'_ij - α_i) ]² ),   F_i = e_i · z_i/‖z_i‖  (Eq. 5).

    z: [K, D] representations (the encoder output, not the projection head's) of views rendered from alpha [K, d_α];
    alpha must require grad and z must depend on it differentiably. alpha_prime: [K, L, d_α] fresh draws from the
    same augmentation law (never encoded). e: [K, D] Rademacher directions, one per sample; drawn here with
    `generator` when None. The gradient comes from `projection_alpha_grad` (one batched backward with
    create_graph=True, so the result is differentiable w.r.t. the network): exact only if z_i depends on α_i alone,
    so BatchNorm in training mode couples samples and makes it approximate (§7 item 5).

    Choices (§1.2, §7 items 2-3):
    - No ½: Eq. 13 (the training loss) and the code use λ/(LK); Eq. 12, the estimator of V, has 1/(2L).
      `halve=True` gives Eq. 12's scale.
    - Clipping: the paper "clip[s] the penalty from above"; the batch-mean penalty (before λ) is clamped at `clip`
      (the code's `.clamp(max=gp_upper_limit)`), so while it is above `clip` its gradient is zero. clip=1 (CIFAR),
      1000 (Spirograph); None disables it. λ = 0.1 (CIFAR), 0.01 (Spirograph).
    - `normalize=False` drops ‖z‖ from F (code flag --no-gp-normalization; the paper normalises).
    Which view to regularise is the caller's choice (the code penalises view 1 only, §7 item 4).
    """
    if e is None:
        e = rademacher(z.shape, generator=generator, dtype=z.dtype, device=z.device)
    grad = projection_alpha_grad(z, alpha, e, normalize=normalize, create_graph=True)  # [K, d_α]
    proj = ((alpha_prime - alpha.unsqueeze(1)) * grad.unsqueeze(1)).sum(dim=-1)  # [K, L]
    penalty = proj.pow(2).mean()
    if halve:
        penalty = 0.5 * penalty
    if clip is not None:
        penalty = penalty.clamp(max=clip)
    return lam * penalty


COCOR_FORMS = ("code", "eq11", "eq7", "eq2")


@float32
def cocor_consistency(sims: list[torch.Tensor], targets: list[torch.Tensor], form: str = "code") -> torch.Tensor:
    """CoCor's consistency loss over composite lengths (docs/methods/cocor.md §1.3-§1.4, §7 item 2).

    sims[l], targets[l]: [B] latent similarities f(x)ᵀf(A_l(x)) and targets g(v(A_l)) of the composites of the
    l-th length. The paper writes the loss three ways; `form` picks one:
    - "code" (default): Σ_l softplus(mean_i g − mean_i s). A similarity below its target is pulled up; one above
      it gets a small gradient, so the less distorted views are not pushed away from the original: the reading of
      Appendix A's motivation and the only sign under which the target is a monotone floor (stronger composite,
      lower target, weaker constraint).
    - "eq11": mean_l softplus(mean_i s − mean_i g) (Appendix B as printed: pushes similarities down to the target).
    - "eq7": mean_l softplus(mean_i |s − g|) (Appendix A).
    - "eq2": mean_l mean_i |s − g| (the DA consistency level, Eq. 1-2).
    """
    if form not in COCOR_FORMS:
        raise ValueError(f"unknown CoCor consistency form {form!r}; choose from {COCOR_FORMS}")
    if form == "code":
        return cast(torch.Tensor, sum(F.softplus(g.mean() - s.mean()) for s, g in zip(sims, targets)))  # tensors' sum
    if form == "eq11":
        terms = [F.softplus(s.mean() - g.mean()) for s, g in zip(sims, targets)]
    elif form == "eq7":
        terms = [F.softplus((s - g).abs().mean()) for s, g in zip(sims, targets)]
    else:
        terms = [(s - g).abs().mean() for s, g in zip(sims, targets)]
    return cast(torch.Tensor, sum(terms) / len(terms))  # a sum of tensors


@float32
def cocor_target_surrogate(
    g_bar: torch.Tensor,
    s_before: torch.Tensor,
    s_after: torch.Tensor,
    ce_before: float,
    ce_after: float,
    lu_before: float,
    lu_after: float,
    *,
    min_denominator: float = 1e-4,
    sign: float = -1.0,
) -> torch.Tensor:
    """A scalar whose gradient w.r.t. the target network is CoCor's finite-difference hypergradient (Eq. 20):
        ∇θd CE ≈ sign · Σ_l σ'(k_l) · (CE' − CE)/(L_u' − L_u) · (s'_l − s_l) · ∂ḡ_l/∂θd,   k_l = s'_l − ḡ_l,
    σ'(k) = e^k/(1+e^k)². g_bar [L] carries the graph to θd; everything else is a detached scalar (or [L]) from the
    forward passes before (θe) and after (θe') the encoder step. The denominator is clamped to |·| >= min_denominator,
    keeping its sign (the code's guard).

    sign: differentiating the one-step update θe' = θe − η∇L_u exactly gives ∂θe'/∂θd = +η σ'(k) ∂s/∂θe ∂ḡ/∂θd for
    either softplus form (Eq. 13 prints a minus), and the secant estimates then give sign = −1: if a step that raised
    s also lowered CE, the target should rise. sign = +1 is Eq. 20 as printed (and the code).
    """
    denom = float(lu_after) - float(lu_before)
    if abs(denom) < min_denominator:
        denom = min_denominator if denom >= 0 else -min_denominator
    ratio = (float(ce_after) - float(ce_before)) / denom
    k = (s_after - g_bar).detach()
    slope = torch.sigmoid(k) * (1 - torch.sigmoid(k))
    coef = (sign * slope * ratio * (s_after - s_before)).detach()
    return (coef * g_bar).sum()


# ---------------------------------------------------------------------------------------------------------------
# Non-contrastive and supervised frameworks: BYOL (Grill et al. 2020), SimSiam (Chen & He 2021),
# SupCon (Khosla et al. 2020). Tested in tests/methods/test_frameworks.py.
# ---------------------------------------------------------------------------------------------------------------


@float32
def mocov3_loss(q: torch.Tensor, keys: torch.Tensor, offset: int, temperature: float) -> torch.Tensor:
    """MoCo v3's contrastive loss for one direction (Chen, Xie, He 2021, Alg. 1 `ctr`), mean over the batch.

    q: [b, D] L2-normalised queries (predictor outputs); keys: [N, D] L2-normalised momentum-encoder keys of the
    other view from every worker, q_i's positive at row offset + i, the other N - 1 rows its negatives (no queue).
        ctr(q, k) = 2τ · CE(q kᵀ / τ, positives)
    The factor 2τ is the paper's: it makes the gradient's scale independent of τ (Alg. 1's comment). The full loss
    is ctr(q1, k2) + ctr(q2, k1). Keys carry no gradient."""
    keys = keys.detach()
    labels = torch.arange(q.shape[0], device=q.device) + offset
    return 2 * temperature * F.cross_entropy(q @ keys.t() / temperature, labels)


@float32
def dino_loss(
    student: list[torch.Tensor],
    teacher: list[torch.Tensor],
    center: torch.Tensor,
    student_temperature: float,
    teacher_temperature: float,
) -> torch.Tensor:
    """DINO's loss (Caron et al. 2021, Eq. 3 with multi-crop, and Alg. 1), mean over the pairs and the batch.

    student: per crop, the student's outputs [B, K] (every global and local crop); teacher: per global crop, the
    teacher's outputs [B, K], in the same order as the student's first crops; center: [K] (or [1, K]).
        P_t = softmax((g_t(x) − c) / τ_t),  P_s = softmax(g_s(x') / τ_s)
        L = mean over pairs (t, s), s ≠ t, of mean over the batch of −Σ_k P_t(k) log P_s(k)
    The teacher's side is a constant (stop-gradient); centering and sharpening are what avoid collapse."""
    targets = [F.softmax((t.detach() - center) / teacher_temperature, dim=-1) for t in teacher]
    logs = [F.log_softmax(s / student_temperature, dim=-1) for s in student]
    terms = [-(p * logs[j]).sum(dim=-1).mean() for i, p in enumerate(targets) for j in range(len(logs)) if j != i]
    return cast(torch.Tensor, sum(terms) / len(terms))  # a sum of tensors


@float32
def byol_loss(p: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """BYOL's regression loss (Grill et al. 2020, Eq. 2), mean over the batch.

    p: [B, D] online predictions q_θ(z_θ); z: [B, D] target projections z'_ξ of the other view (not necessarily
    normalised; both are L2-normalised here).
        L = ‖p̄ − z̄'‖² = 2 − 2·⟨p, z'⟩ / (‖p‖·‖z'‖).
    The target is a stop-gradient (z is detached): only the online side is trained. The symmetric BYOL loss is
    byol_loss(p1, z2') + byol_loss(p2, z1') (Eq. 2's L + L̃).
    """
    p = F.normalize(p, dim=1)
    z = F.normalize(z.detach(), dim=1)
    return (2 - 2 * (p * z).sum(dim=1)).mean()


@float32
def negative_cosine(p: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """SimSiam's D(p, stopgrad(z)) (Chen & He 2021, Eqs. 1 and 3), mean over the batch.

    p: [B, D] predictions; z: [B, D] projections of the other view. D(p, z) = −⟨p/‖p‖, z/‖z‖⟩; z is detached
    (the stop-gradient that prevents collapse). The symmetric SimSiam loss is
    ½ negative_cosine(p1, z2) + ½ negative_cosine(p2, z1) (Eq. 2/3), minimum −1.
    """
    p = F.normalize(p, dim=1)
    z = F.normalize(z.detach(), dim=1)
    return -(p * z).sum(dim=1).mean()


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

    z: [M, D] anchor embeddings (every view of every image, e.g. cat([view1, view2]); normalised here);
    labels: [M] int class of each anchor. Over candidates A(i) = every embedding except the anchor itself and
    positives P(i) = the candidates of A(i) that share i's label (the other views of the same image included):
        L_i = −1/|P(i)| Σ_{p∈P(i)} log( exp(z_i·z_p/τ) / Σ_{a∈A(i)} exp(z_i·z_a/τ) ).
    The paper sums L_i over anchors; here they are averaged (as the authors' code does, without its extra
    τ/base_τ factor) so the value does not grow with the batch. An anchor with no positive contributes 0.

    Gathered negatives: candidates [N, D] / candidate_labels [N] hold every worker's embeddings, and self_index [M]
    gives each local anchor's own row in candidates (excluded from A(i)). Defaults: candidates = z,
    self_index = arange(M). Averaged over equal-sized workers this is the loss of the global batch.
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
