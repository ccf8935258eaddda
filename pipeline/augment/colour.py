"""Batched, differentiable colour ops on float images in [0, 1], one factor per sample.

These are the torch executor's colour ops and InvCLR's differentiable colour distortion
(docs/methods/invclr.md §3.2): every output is differentiable in the image and in the factors, so a
method can take d(image)/d(alpha). With hue_mode="hsv" they equal torchvision's adjust_* (tests hold
them to it); "yiq" is InvCLR's linear hue rotation (its Eqs. 44-47).

x: [B, 3, H, W]; factors: [B] tensors. A factor of 1 (brightness, contrast, saturation) or 0 (hue)
is the identity.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import Tensor

LUMA = (0.2989, 0.587, 0.114)  # torchvision's rgb_to_grayscale weights
# InvCLR's paper matrices (Eqs. 44-47); its code rounds them slightly differently (docs/methods/invclr.md §3.2).
YIQ = ((0.299, 0.587, 0.114), (0.5959, -0.2746, -0.3213), (0.2115, -0.5227, 0.3112))
YIQ_TO_RGB = ((1.0, 0.956, 0.619), (1.0, -0.272, -0.647), (1.0, -1.106, 1.703))
JITTER_OPS = ("brightness", "contrast", "saturation", "hue")


def _per_sample(f: Tensor, x: Tensor) -> Tensor:
    return f.to(x.dtype).reshape(-1, 1, 1, 1)


def grayscale(x: Tensor) -> Tensor:
    """[B, 1, H, W] luma."""
    w = x.new_tensor(LUMA).view(1, 3, 1, 1)
    return (x * w).sum(1, keepdim=True)


def brightness(x: Tensor, f: Tensor) -> Tensor:
    return (x * _per_sample(f, x)).clamp(0, 1)


def contrast(x: Tensor, f: Tensor) -> Tensor:
    mean = grayscale(x).mean(dim=(1, 2, 3), keepdim=True)
    f = _per_sample(f, x)
    return (f * x + (1 - f) * mean).clamp(0, 1)


def saturation(x: Tensor, f: Tensor) -> Tensor:
    f = _per_sample(f, x)
    return (f * x + (1 - f) * grayscale(x)).clamp(0, 1)


def hue_hsv(x: Tensor, turns: Tensor) -> Tensor:
    """torchvision's adjust_hue (RGB -> HSV, h += turns, back) in closed form:
    channel_n = V - C * clamp(min(k, 4 - k), 0, 1), k = (n + 6h) mod 6, n = 5, 3, 1 for R, G, B."""
    r, g, b = x.unbind(1)
    mx, mn = x.amax(1), x.amin(1)
    chroma = mx - mn
    div = torch.where(chroma > 0, chroma, torch.ones_like(chroma))
    rc, gc, bc = (mx - r) / div, (mx - g) / div, (mx - b) / div
    is_r = mx == r
    is_g = (mx == g) & ~is_r
    h6 = torch.where(is_r, bc - gc, torch.where(is_g, 2.0 + rc - bc, 4.0 + gc - rc))
    h6 = torch.where(chroma > 0, h6, torch.zeros_like(h6)) + 6.0 * turns.to(x.dtype).view(-1, 1, 1)
    out = []
    for n in (5.0, 3.0, 1.0):
        k = torch.remainder(h6 + n, 6.0)
        out.append(mx - chroma * torch.clamp(torch.minimum(k, 4.0 - k), 0.0, 1.0))
    return torch.stack(out, 1)


def hue_yiq(x: Tensor, turns: Tensor, clip: bool = True) -> Tensor:
    """InvCLR's hue: RGB -> YIQ, rotate the IQ plane by 2*pi*turns, back to RGB. The paper clips to [0, 1]
    after every op; its code does not clip after hue (`clip=False`)."""
    theta = 2 * math.pi * turns.to(x.dtype)
    cos, sin = torch.cos(theta), torch.sin(theta)
    one, zero = torch.ones_like(cos), torch.zeros_like(cos)
    rot = torch.stack(
        [torch.stack([one, zero, zero], -1), torch.stack([zero, cos, -sin], -1), torch.stack([zero, sin, cos], -1)], -2
    )  # [B, 3, 3]
    m = x.new_tensor(YIQ_TO_RGB) @ rot @ x.new_tensor(YIQ)  # [B, 3, 3]
    out = torch.einsum("bij,bjhw->bihw", m, x)
    return out.clamp(0, 1) if clip else out


def jitter(
    x: Tensor, b: Tensor, c: Tensor, s: Tensor, h: Tensor, order: Tensor | None = None, hue_mode: str = "hsv"
) -> Tensor:
    """Brightness, contrast, saturation, hue in this order, or per sample in `order` ([B, 4] permutations
    of 0..3 indexing JITTER_OPS). Samples whose factors are the identity come out unchanged (exactly)."""
    ops = {
        0: lambda y, idx: brightness(y, b[idx]),
        1: lambda y, idx: contrast(y, c[idx]),
        2: lambda y, idx: saturation(y, s[idx]),
        3: lambda y, idx: hue_hsv(y, h[idx]) if hue_mode == "hsv" else hue_yiq(y, h[idx]),
    }
    if order is None:
        idx = torch.arange(x.shape[0], device=x.device)
        for k in range(4):
            x = ops[k](x, idx)
        return x
    # Random order: group the samples that share a permutation (at most 24 groups).
    out = torch.empty_like(x)
    perms = order.to(torch.long)
    for perm in torch.unique(perms, dim=0):
        idx = torch.nonzero((perms == perm).all(1)).flatten()
        y = x[idx]
        for k in perm.tolist():
            y = ops[k](y, idx)
        out = out.index_copy(0, idx, y.to(out.dtype))
    return out


def gate(on: Tensor, applied: Tensor, x: Tensor) -> Tensor:
    """Per-sample choice: `applied` where on, else `x` (InvCLR's y*ind + (1-ind)*x, exact for ind in {0,1})."""
    return torch.where(on.to(torch.bool).view(-1, 1, 1, 1), applied, x)


def solarize(x: Tensor, threshold: float) -> Tensor:
    """Invert pixels >= threshold (torchvision's solarize on [0, 1] images)."""
    return torch.where(x >= threshold, 1.0 - x, x)


def colour_distort(x: Tensor, params: dict[str, Tensor], hue_mode: str = "hsv") -> Tensor:
    """The view's jitter (gated by jitter_on) then grayscale (gated by gray), differentiable in the factors:
    what the executors skip for views with color_stage=model. Only the gated-on samples are computed (the
    others are passed through), which is also InvCLR's y*ind + (1-ind)*x for ind in {0, 1}.

    Always in x's own precision: under a training step's bf16 autocast, CUDA would run the YIQ einsum in bf16
    (and index_copy refuses to mix dtypes); InvCLR differentiates these ops, so they stay float32."""
    with torch.autocast(device_type=x.device.type, enabled=False):
        return _colour_distort(x, params, hue_mode)


def _colour_distort(x: Tensor, params: dict[str, Tensor], hue_mode: str) -> Tensor:
    on = params["jitter_on"].to(torch.bool).to(x.device)
    if bool(on.any()):
        idx = torch.nonzero(on).flatten()
        f = {k: params[k].to(x.device)[idx] for k in JITTER_OPS}
        order = params.get("jitter_order")
        j = jitter(
            x[idx],
            f["brightness"],
            f["contrast"],
            f["saturation"],
            f["hue"],
            None if order is None else order.to(x.device)[idx],
            hue_mode,
        )
        x = x.index_copy(0, idx, j.to(x.dtype))
    gray = params["gray"].to(torch.bool).to(x.device)
    if bool(gray.any()):
        idx = torch.nonzero(gray).flatten()
        x = x.index_copy(0, idx, grayscale(x[idx]).expand(-1, 3, -1, -1).to(x.dtype))
    return x


def normalize(x: Tensor, mean: Sequence[float], std: Sequence[float]) -> Tensor:
    m = x.new_tensor(mean).view(1, 3, 1, 1)
    s = x.new_tensor(std).view(1, 3, 1, 1)
    return (x - m) / s


ALPHA_KEYS = ("brightness", "contrast", "saturation", "hue")  # InvCLR's differentiable alpha, in this order


class ModelColourStage:
    """The colour stage of views whose recipe leaves it to the method (color_stage=model, InvCLR): jitter and
    grayscale from each view's recorded parameters, then normalisation, inside the training step. With
    `grad_views`, those views' alpha = (brightness, contrast, saturation, hue) is a leaf tensor requiring grad,
    so the loss can be differentiated with respect to it."""

    def __init__(self, recipe):
        self.views = [(v, spec.hue_mode) for v, spec in enumerate(recipe.views) if spec.color_stage == "model"]
        self.mean, self.std = recipe.mean, recipe.std

    def __bool__(self) -> bool:
        return bool(self.views)

    def __call__(
        self, images: list[Tensor], params: list[dict], grad_views: Sequence[int] = ()
    ) -> tuple[list[Tensor], dict[int, Tensor]]:
        images, alphas = list(images), {}
        for v, hue_mode in self.views:
            x, p = images[v], params[v]
            p = {k: t.to(x.device) for k, t in p.items()}
            alpha = torch.stack([p[k].float() for k in ALPHA_KEYS], 1)
            if v in grad_views:
                alpha = alpha.clone().requires_grad_(True)
                alphas[v] = alpha
            p.update(zip(ALPHA_KEYS, alpha.unbind(1)))
            images[v] = normalize(colour_distort(x, p, hue_mode), self.mean, self.std)
        return images, alphas
