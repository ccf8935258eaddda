"""InvCLR's gradient regulariser (Foster et al. 2021; docs/methods/invclr.md), a plug-in term, and the pieces it is
built from: the scalar projection F = e · z/‖z‖ (Eq. 5), Rademacher directions e, and the per-sample gradient of F
w.r.t. the augmentation parameters α. Tested against direct float64 computations in tests/test_plugin_losses.py.

The evaluation metric built on the same F, the conditional variance V (Eq. 7), is in pipeline/eval/invariance.py.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pipeline.losses.precision import float32


@float32
def scalar_projection(z: torch.Tensor, e: torch.Tensor, *, normalize: bool = True) -> torch.Tensor:
    """InvCLR's F (Foster et al. 2021, Eq. 5; docs/methods/invclr.md §1.1): F = e · z/‖z‖₂.

    Returns [K] or [K, L].

    Args:
        z: [K, D] (one view per sample) or [K, L, D] (L augmentations per sample).
        e: [K, D], one direction per sample, shared by that sample's L views (Eq. 7 fixes x_i, β_i, e_i and
            varies α).
        normalize: False drops the L2 normalisation (the code's --no-gp-normalization; the paper normalises).

    Example: `F_values = scalar_projection(z, rademacher((K, D)))`
    """
    if z.dim() == e.dim() + 1:
        e = e.unsqueeze(-2)
    if normalize:
        z = F.normalize(z, dim=-1)
    return (e * z).sum(dim=-1)


def rademacher(shape, *, generator: torch.Generator | None = None, dtype=torch.float32, device=None) -> torch.Tensor:
    """Independent ±1 entries with probability ½ each (InvCLR's p(e), docs/methods/invclr.md §1.1).

    Args:
        shape: the shape of the result.
        generator: the random generator to draw from (torch's default when None).
        dtype: the result's dtype.
        device: the result's device.

    Example: `e = rademacher((K, D), generator=torch.Generator().manual_seed(0))`
    """
    bits = torch.randint(0, 2, tuple(shape), generator=generator, device=device)
    return (2 * bits - 1).to(dtype)


@float32
def projection_alpha_grad(
    z: torch.Tensor, alpha: torch.Tensor, e: torch.Tensor, *, normalize: bool = True, create_graph: bool = True
) -> torch.Tensor:
    """Per-sample ∇_α F(α_i) for F_i = e_i · z_i/‖z_i‖ (docs/methods/invclr.md §1.2, "random vector" trick), [K, d_α].

    One reverse pass of the scalar Σ_i e_i·ẑ_i w.r.t. the batch tensor alpha [K, d_α] gives row i = e_iᵀ ∂ẑ_i/∂α_i,
    a vector-Jacobian product, PROVIDED z_i depends on α_i only. BatchNorm in training mode (or anything else that
    mixes samples) breaks this: the batched gradient then carries cross-sample terms and is not the per-sample
    ∇_α F_i (§7 item 5; the paper and the code ignore this). If z does not depend on alpha the gradient is zero.

    Args:
        z: [K, D] representations of views rendered from alpha.
        alpha: [K, d_α] augmentation parameters, requiring grad.
        e: [K, D] directions, one per sample.
        normalize: False drops ‖z‖ from F (as in `scalar_projection`).
        create_graph: keep the graph so a penalty on the result back-propagates into the network (double backprop).

    Example: `grad = projection_alpha_grad(z, alpha, rademacher(z.shape))`
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

    The gradient comes from `projection_alpha_grad` (one batched backward with create_graph=True, so the result is
    differentiable w.r.t. the network): exact only if z_i depends on α_i alone, so BatchNorm in training mode couples
    samples and makes it approximate (§7 item 5).

    Choices (§1.2, §7 items 2-3):
    - No ½: Eq. 13 (the training loss) and the code use λ/(LK); Eq. 12, the estimator of V, has 1/(2L).
      `halve=True` gives Eq. 12's scale.
    - Clipping: the paper "clip[s] the penalty from above"; the batch-mean penalty (before λ) is clamped at `clip`
      (the code's `.clamp(max=gp_upper_limit)`), so while it is above `clip` its gradient is zero. clip=1 (CIFAR),
      1000 (Spirograph); None disables it. λ = 0.1 (CIFAR), 0.01 (Spirograph).
    - `normalize=False` drops ‖z‖ from F (code flag --no-gp-normalization; the paper normalises).
    Which view to regularise is the caller's choice (the code penalises view 1 only, §7 item 4).

    Args:
        z: [K, D] representations (the encoder output, not the projection head's) of views rendered from alpha;
            z must depend on alpha differentiably.
        alpha: [K, d_α] the views' augmentation parameters; must require grad.
        alpha_prime: [K, L, d_α] fresh draws from the same augmentation law (never encoded).
        e: [K, D] Rademacher directions, one per sample; drawn here with `generator` when None.
        generator: the random generator for e.
        clip: the upper clamp of the batch-mean penalty before λ; None disables it.
        lam: λ.
        normalize: False drops ‖z‖ from F.
        halve: Eq. 12's scale (a factor ½).

    Example: `penalty = gradient_penalty(h, alpha, alpha_prime, clip=1.0, lam=0.1)`
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
