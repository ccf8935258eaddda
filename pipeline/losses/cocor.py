"""CoCor's consistency regulariser (docs/methods/cocor.md), a plug-in term: latent similarities of composite
augmentations held against their learned targets, and the surrogate whose gradient is the targets' finite-difference
hypergradient. Tested in tests/plugins/test_cocor.py."""

from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F

from pipeline.losses.precision import float32

COCOR_FORMS = ("code", "eq11", "eq7", "eq2")


@float32
def cocor_consistency(sims: list[torch.Tensor], targets: list[torch.Tensor], form: str = "code") -> torch.Tensor:
    """CoCor's consistency loss over composite lengths (docs/methods/cocor.md §1.3-§1.4, §7 item 2).

    The paper writes the loss three ways; `form` picks one (`COCOR_FORMS`):
    - "code" (default): Σ_l softplus(mean_i g − mean_i s). A similarity below its target is pulled up; one above
      it gets a small gradient, so the less distorted views are not pushed away from the original: the reading of
      Appendix A's motivation and the only sign under which the target is a monotone floor (stronger composite,
      lower target, weaker constraint).
    - "eq11": mean_l softplus(mean_i s − mean_i g) (Appendix B as printed: pushes similarities down to the target).
    - "eq7": mean_l softplus(mean_i |s − g|) (Appendix A).
    - "eq2": mean_l mean_i |s − g| (the DA consistency level, Eq. 1-2).

    Args:
        sims: per composite length l, the [B] latent similarities f(x)ᵀf(A_l(x)) of the l-th length's composites.
        targets: per composite length l, their [B] targets g(v(A_l)).
        form: "code", "eq11", "eq7" or "eq2".

    Example: `loss = cocor_consistency(sims, targets, "code")`
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
    ce_before: float | torch.Tensor,
    ce_after: float | torch.Tensor,
    lu_before: float | torch.Tensor,
    lu_after: float | torch.Tensor,
    *,
    min_denominator: float = 1e-4,
    sign: float = -1.0,
) -> torch.Tensor:
    """A scalar whose gradient w.r.t. the target network is CoCor's finite-difference hypergradient (Eq. 20):
        ∇θd CE ≈ sign · Σ_l σ'(k_l) · (CE' − CE)/(L_u' − L_u) · (s'_l − s_l) · ∂ḡ_l/∂θd,   k_l = s'_l − ḡ_l,
    σ'(k) = e^k/(1+e^k)². g_bar carries the graph to θd; everything else is a detached scalar (or [L]) from the
    forward passes before (θe) and after (θe') the encoder step. The denominator is clamped to |·| >= min_denominator,
    keeping its sign (the code's guard).

    sign: differentiating the one-step update θe' = θe − η∇L_u exactly gives ∂θe'/∂θd = +η σ'(k) ∂s/∂θe ∂ḡ/∂θd for
    either softplus form (Eq. 13 prints a minus), and the secant estimates then give sign = −1: if a step that raised
    s also lowered CE, the target should rise. sign = +1 is Eq. 20 as printed (and the code).

    Args:
        g_bar: [L] ḡ_l, the targets per composite length, with the graph to θd.
        s_before, s_after: [L] (or scalar) s_l and s'_l, the similarities before and after the encoder step.
        ce_before, ce_after: CE and CE', the classification losses before and after the encoder step.
        lu_before, lu_after: L_u and L_u', the unsupervised losses before and after the encoder step.
        min_denominator: the smallest |L_u' − L_u| divided by.
        sign: −1 (the derivation above) or +1 (Eq. 20 as printed, and the code).

    Example: `cocor_target_surrogate(g_bar, s_before, s_after, ce, ce_after, lu, lu_after).backward()`
    """
    # in float64 on g_bar's device, from tensors or numbers: no value is read back to the host (on a GPU that would
    # stall the step), and the arithmetic is the float64 arithmetic of Python numbers
    lu_before, lu_after, ce_before, ce_after = (
        torch.as_tensor(v, dtype=torch.float64, device=g_bar.device).detach()
        for v in (lu_before, lu_after, ce_before, ce_after)
    )
    denom = lu_after - lu_before
    floor = torch.where(denom >= 0, 1.0, -1.0).to(torch.float64) * min_denominator  # keeps the difference's sign
    denom = torch.where(denom.abs() < min_denominator, floor, denom)
    ratio = ((ce_after - ce_before) / denom).to(s_after.dtype)
    k = (s_after - g_bar).detach()
    slope = torch.sigmoid(k) * (1 - torch.sigmoid(k))
    coef = (sign * slope * ratio * (s_after - s_before)).detach()
    return (coef * g_bar).sum()
