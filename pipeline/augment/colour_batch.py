"""The colour stage on a whole batch with no per-sample Python and no grouping on the device: what
colour.colour_distort computes sample by sample (torchvision's ColorJitter in fixed or random order, then
grayscale), with every choice made on the host (jitter_passes) and sent as per-sample factors and masks.

Brightness, contrast and saturation are one blend, y = clamp(f * x + (1 - f) * ref), with ref = 0, the image's
mean grey or the grey image; each keeps colour.py's arithmetic to the bit. Hue sits at one slot of each sample's
order: the ops before it run as "pre" passes, hue runs once on the batch, the ops after it as "post" passes
(at most 3 + 1 + 3 passes in random order, 3 + 1 in fixed order, the same for any batch size). A sample with no op
in a pass, or its jitter off, passes through `where` untouched, bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from .colour import JITTER_OPS

HUE = JITTER_OPS.index("hue")
CONTRAST, SATURATION = JITTER_OPS.index("contrast"), JITTER_OPS.index("saturation")


@dataclass(frozen=True)
class Pass:
    """One blend pass, per sample: factor f, 1 - f, whether ref is the grey image (ws) or its mean (wc), active."""

    f: np.ndarray
    omf: np.ndarray
    ws: np.ndarray
    wc: np.ndarray
    active: np.ndarray
    uses_gray: bool
    uses_mean: bool


def jitter_passes(
    on: np.ndarray, factors: np.ndarray, order: np.ndarray | None, static: bool = False
) -> tuple[list[Pass], list[Pass]]:
    """(pre, post) blend passes for N samples: on [N], factors [N, 3] (brightness, contrast, saturation),
    order [N, 4] (permutations of 0..3) or None for the fixed order. Passes no sample uses are left out, unless
    static: then the same passes for every batch (3 + 3 in random order, 3 in fixed), each blending against the
    grey image and its mean where a sample asks, so that a compiled stage sees one shape of work."""
    on = np.asarray(on).reshape(-1) > 0
    n = len(on)
    fixed = order is None
    order = np.tile(np.arange(4), (n, 1)) if order is None else np.asarray(order, np.int64).reshape(n, 4)
    hue_at = np.argmax(order == HUE, axis=1)
    rows = np.arange(n)

    def blend(slot: np.ndarray, valid: np.ndarray) -> Pass:
        op = order[rows, np.clip(slot, 0, 3)]
        act = on & valid
        f = np.where(act, factors[rows, np.clip(op, 0, 2)], 1.0).astype(np.float32)
        con, sat = act & (op == CONTRAST), act & (op == SATURATION)
        gray, mean = (True, True) if static else (bool((con | sat).any()), bool(con.any()))
        return Pass(f, np.float32(1.0) - f, sat.astype(np.float32), con, act, gray, mean)

    if static:
        n_pre, n_post = (3, 0) if fixed else (3, 3)
    else:
        n_pre = int(hue_at[on].max()) if on.any() else 0
        n_post = int((3 - hue_at[on]).max()) if on.any() else 0
    pre = [blend(np.full(n, t), t < hue_at) for t in range(n_pre)]
    post = [blend(hue_at + 1 + t, hue_at + 1 + t <= 3) for t in range(n_post)]
    return pre, post


def grey(x: Tensor, luma: Tensor) -> Tensor:
    """[N, 1, H, W]: colour.grayscale with the weights as a [1, 3, 1, 1] tensor."""
    return (x * luma).sum(1, keepdim=True)


def blend_pass(x: Tensor, luma: Tensor, p: dict[str, Tensor], uses_gray: bool, uses_mean: bool) -> Tensor:
    """One pass: p holds [N, 1, 1, 1] rows f, omf, ws (float) and wc, active (bool)."""
    if uses_gray:
        g = grey(x, luma)
        ref = g * p["ws"]
        if uses_mean:
            ref = torch.where(p["wc"], g.mean(dim=(1, 2, 3), keepdim=True), ref)
        y = (p["f"] * x + p["omf"] * ref).clamp(0, 1)
    else:  # brightness only: colour.brightness's x * f
        y = (x * p["f"]).clamp(0, 1)
    return torch.where(p["active"], y, x)


def hue_batch(x: Tensor, turns6: Tensor, consts: dict[str, Tensor]) -> Tensor:
    """colour.hue_hsv for every sample, in about 25 batched ops: torchvision's branch rule (red if it is the
    maximum, else green, else blue) is the first index of the channel maximum; the three branch formulas are one
    op on the channel stack. turns6: 6 * hue turns, [N, 1, 1, 1]; consts: the index and offset tensors."""
    mx, arg = x.max(1, keepdim=True)
    chroma = mx - x.amin(1, keepdim=True)
    pos = chroma > 0
    d = (mx - x) / torch.where(pos, chroma, 1.0)  # rc, gc, bc
    # (0 + bc) - gc, (2 + rc) - bc, (4 + gc) - rc: colour.hue_hsv's three branches, evaluated in its order
    cand = (d.index_select(1, consts["hue_first"]) + consts["hue_offset"]) - d.index_select(1, consts["hue_second"])
    h6 = torch.where(pos, cand.gather(1, arg), 0.0) + turns6
    k = torch.remainder(h6 + consts["hue_n"], 6.0)
    return mx - chroma * torch.clamp(torch.minimum(k, 4.0 - k), 0.0, 1.0)


# hue_batch's constants: which of rc, gc, bc each branch adds and subtracts, its offset, and the channels' n
HUE_CONSTS: dict[str, np.ndarray] = {
    "hue_first": np.array([2, 0, 1], np.int64),
    "hue_second": np.array([1, 2, 0], np.int64),
    "hue_offset": np.array([0.0, 2.0, 4.0], np.float32).reshape(1, 3, 1, 1),
    "hue_n": np.array([5.0, 3.0, 1.0], np.float32).reshape(1, 3, 1, 1),
}
