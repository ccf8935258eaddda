"""Strong augmentation pool of CLSA and CoCor: numpy samplers + torch reference applies.

A strong view is a chain of `n_ops` slots. Slot k of sample i applies op
``OPS[strong_op[i, k]]`` with magnitude ``strong_mag[i, k]`` iff ``strong_on[i, k]``; slots run
in order. Everything random is drawn in numpy by `sample_strong`; `apply_strong_torch` (here) and
`strong_dali.apply_strong_dali` only apply the recorded parameters.

Ops and the units of their magnitude (what `torch_op` does with `mag`)
--------------------------------------------------------------------------
  Identity                  -                           nothing
  ShearX / ShearY           shear factor s (signed)     x_src = x + s*(y - cy)  /  y_src = y + s*(x - cx)
  TranslateX / TranslateY   fraction f of W / H         x_src = x + f*W         /  y_src = y + f*H
  Rotate                    degrees (signed)            counter-clockwise on screen for mag > 0 (PIL)
  AutoContrast, Invert,     -                           on/off ops (Table 1's "0 or 1")
  Equalize
  Solarize                  threshold t on 0..256       pixel q (0..255 integer) -> 255 - q iff q >= t
  Posterize                 bits b in 4..8              keep the top b bits of q
  Contrast, Color,          enhance factor e            blend(degenerate, img, e), PIL ImageEnhance
  Brightness, Sharpness

Semantics follow PIL (ImageOps / ImageEnhance / Image.transform) on 8-bit images, as the
CLSA / FixMatch / CoCor code does, expressed on float CHW images in [0, 1]:
  * Affine ops: inverse map in continuous pixel coordinates (pixel (i, j) has its centre at
    (j + 0.5, i + 0.5)), about the image centre (cx, cy) = (W/2, H/2), fill grey 128, bilinear
    resampling where neighbours outside the image count as the fill value. (FixMatch's code
    uses PIL's default NEAREST and shears about the top-left corner; we shear about the centre
    as asked, and use bilinear so the op is differentiable and DALI agrees closely.)
  * AutoContrast: each channel's min..max -> 0..1 (channels with max == min unchanged); PIL
    truncates the LUT to integers, we do not (<= 1 level).
  * Equalize: PIL's per-channel LUT on the image quantised to 0..255:
    step = (N - count of the largest present value) // 255; identity if step == 0;
    lut[v] = (step // 2 + #pixels < v) // step, clipped to 255. Not differentiable.
  * Solarize / Posterize / Equalize act on q = the 0..255 level of x, rounded to nearest with
    ties (to within TIE_GUARD = 1/64 level) rounded down, so DALI and torch agree on ties.
    Solarize's output is 1 - x where q >= t (differentiable in x), Posterize's is the masked
    q / 255.
  * Contrast: degenerate = mean of the grayscale image (float mean; PIL rounds it to an
    integer); Color: degenerate = grayscale image; Brightness: degenerate = black;
    Sharpness: degenerate = 3x3 smooth ([[1,1,1],[1,5,1],[1,1,1]] / 13) of the interior, the
    1-pixel border unchanged. Grayscale uses PIL's "L" weights (0.299, 0.587, 0.114).
    Results are clamped to [0, 1] as PIL clips to 0..255, but not rounded, so these stay
    differentiable w.r.t. the image.

Pools (an op's position in the pool is its entry in CoCor's count vector v(A))
-----------------------------------------------------------------------------
  "clsa":     the CLSA paper's pool, with Invert (14 ops, in Table 1's order).
  "fixmatch": CoCor Appendix C order, with Identity instead of Invert (CLSA's and CoCor's code use
              FixMatch's pool). NB: CoCor's code indexes v(A) by FixMatch's list order
              (AutoContrast, Brightness, Color, Contrast, Equalize, Identity, Posterize, Rotate,
              ...); Appendix C lists Rotate after Contrast, and we follow Appendix C.

Magnitude laws
--------------
  "paper": CLSA Table 1 ranges, each drawn uniformly: shear and translate U[-0.3, 0.3], rotate
           U[-30, 30] degrees, Solarize threshold U[0, 256] (continuous; only ceil(t) matters),
           Posterize bits uniform on the integers {4, ..., 8}, Contrast / Color / Brightness /
           Sharpness U[0.05, 0.95]. The paper says neither the law nor the units; uniform over
           the signed range, translate as a fraction of the size (as FixMatch) are our reading.
  "code":  CLSA's code (FixMatch RandAugmentMC): v = randint(1, 10) in {1..9} per slot;
           enhance factors 0.09 v + 0.05; shear and translate +-0.03 v; rotate +-3 v degrees
           (int(30 v / 10)); Posterize int(4 v / 10) + 4 bits; Solarize threshold
           256 - int(256 v / 10); the sign of shear / translate / rotate is +- with prob. 1/2.
  "fixed": CoCor's code, v = m = 10 fixed: enhance factors 0.95, shear / translate +-0.3,
           rotate +-30, Posterize 8 bits (a no-op), Solarize threshold 0 (full inversion),
           random sign as above.
  On/off ops (Identity, AutoContrast, Invert, Equalize) get magnitude 0 under every law.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as tnf

OPS: tuple[str, ...] = (
    "Identity",
    "ShearX",
    "ShearY",
    "TranslateX",
    "TranslateY",
    "Rotate",
    "AutoContrast",
    "Invert",
    "Equalize",
    "Solarize",
    "Posterize",
    "Contrast",
    "Color",
    "Brightness",
    "Sharpness",
)
OP_ID: dict[str, int] = {name: i for i, name in enumerate(OPS)}
AFFINE_OPS = ("ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate")  # ids 1..5, contiguous
SIGNED_OPS = AFFINE_OPS
ENHANCE_OPS = ("Contrast", "Color", "Brightness", "Sharpness")
NO_MAG_OPS = ("Identity", "AutoContrast", "Invert", "Equalize")

POOLS: dict[str, tuple[str, ...]] = {
    "clsa": (
        "ShearX",
        "ShearY",
        "TranslateX",
        "TranslateY",
        "Rotate",
        "AutoContrast",
        "Invert",
        "Equalize",
        "Solarize",
        "Posterize",
        "Contrast",
        "Color",
        "Brightness",
        "Sharpness",
    ),
    "fixmatch": (
        "AutoContrast",
        "Brightness",
        "Color",
        "Contrast",
        "Rotate",
        "Equalize",
        "Identity",
        "Posterize",
        "Sharpness",
        "ShearX",
        "ShearY",
        "Solarize",
        "TranslateX",
        "TranslateY",
    ),
}
LAWS = ("paper", "code", "fixed")

FILL = 128  # grey fill of the affine ops, on the 0..255 scale (FixMatch's fillcolor)
GRAY_WEIGHTS = (0.299, 0.587, 0.114)  # PIL's "L" conversion

# Table 1 ranges for the "paper" law (continuous ops; Posterize is handled apart).
PAPER_RANGES: dict[str, tuple[float, float]] = {
    **{n: (-0.3, 0.3) for n in ("ShearX", "ShearY", "TranslateX", "TranslateY")},
    "Rotate": (-30.0, 30.0),
    "Solarize": (0.0, 256.0),
    **{n: (0.05, 0.95) for n in ENHANCE_OPS},
}
POSTERIZE_BITS = (4, 8)  # inclusive
# Quantisation rounds k + 0.5 - TIE_GUARD and below down (levels on the 0..255 scale). "Nice"
# magnitudes (shear 0.3, rotate 30) make bilinear outputs land exactly on k + 0.5 for many pixels;
# float32 DALI and torch then round them apart by float noise (< 0.01 level), and Equalize turns
# such a 1-level split into a different LUT. A guard above that noise makes both round alike.
TIE_GUARD = 1.0 / 64.0


def _code_value(name: str, v: np.ndarray) -> np.ndarray:
    """FixMatch's magnitude for level v (int array, 1..10), before the random sign."""
    if name in ENHANCE_OPS:
        return v * 0.9 / 10 + 0.05
    if name in ("ShearX", "ShearY", "TranslateX", "TranslateY"):
        return v * 0.3 / 10
    if name == "Rotate":
        return (30 * v) // 10
    if name == "Posterize":
        return (4 * v) // 10 + 4
    if name == "Solarize":
        return 256 - (256 * v) // 10
    return np.zeros_like(v, dtype=np.float64)


def resolve_pool(pool: str | Sequence[str]) -> tuple[str, ...]:
    names = POOLS[pool] if isinstance(pool, str) else tuple(pool)
    unknown = [n for n in names if n not in OP_ID]
    if unknown or not names:
        raise ValueError(f"bad pool {pool!r}: unknown ops {unknown}")
    return names


def sample_strong(
    n: int, n_ops: int, pool: str | Sequence[str], p_apply: float, law: str, rng: np.random.Generator
) -> dict[str, np.ndarray]:
    """Strong-aug parameters for n samples, n_ops slots each.

    Ops are drawn uniformly with replacement from `pool` (a POOLS key or a list of OPS names);
    each slot is gated by an independent Bernoulli(p_apply) (CLSA 0.5, CoCor 1). Magnitudes follow
    `law` (see the module docstring) and are drawn for every slot, gated or not.

    Returns strong_op int32 [n, n_ops] (ids into OPS), strong_on uint8 [n, n_ops],
    strong_mag float32 [n, n_ops], counts float32 [n, len(pool)]: CoCor's v(A), the number of
    applied (gate on) slots of each pool op, in pool order.
    """
    names = resolve_pool(pool)
    if law not in LAWS:
        raise ValueError(f"law must be one of {LAWS}, got {law!r}")
    if not 0.0 <= p_apply <= 1.0:
        raise ValueError(f"p_apply must be in [0, 1], got {p_apply}")
    shape = (int(n), int(n_ops))
    pos = rng.integers(0, len(names), size=shape)
    on = rng.random(shape) < p_apply
    u = rng.random(shape)  # "paper": uniform position in the range
    level = rng.integers(1, 10, size=shape)  # "code": v in {1..9}
    sign = np.where(rng.random(shape) < 0.5, -1.0, 1.0)  # "code" / "fixed": sign of signed ops
    ids = np.asarray([OP_ID[n_] for n_ in names])[pos]

    mag = np.zeros(shape, dtype=np.float64)
    lo: float  # Posterize's bits are ints, the other ranges floats
    hi: float
    for name in dict.fromkeys(names):  # each op fills its own slots
        sel = ids == OP_ID[name]
        if name in NO_MAG_OPS or not sel.any():
            continue
        if law == "paper":
            if name == "Posterize":
                lo, hi = POSTERIZE_BITS
                value = lo + np.minimum(np.floor(u * (hi - lo + 1)), hi - lo)
            else:
                lo, hi = PAPER_RANGES[name]
                value = lo + u * (hi - lo)
        else:
            v = level if law == "code" else np.full(shape, 10)
            value = _code_value(name, v)
            if name in SIGNED_OPS:
                value = value * sign
        mag[sel] = value[sel]

    counts = np.zeros((shape[0], len(names)), dtype=np.float32)
    rows = np.repeat(np.arange(shape[0]), shape[1])
    np.add.at(counts, (rows, pos.ravel()), on.ravel().astype(np.float32))
    return {
        "strong_op": ids.astype(np.int32),
        "strong_on": on.astype(np.uint8),
        "strong_mag": mag.astype(np.float32),
        "counts": counts,
    }


# ----------------------------------------------------------------------------- geometry
def affine_matrix(name: str, mag: float, h: int, w: int) -> np.ndarray:
    """2x3 inverse map (output pixel -> source point) in continuous pixel coordinates.

    [x_src, y_src] = M @ [x, y, 1] with pixel centres at +0.5; the same convention as PIL's
    Image.transform(AFFINE, data=M.ravel()) and DALI's warp_affine(inverse_map=True).
    """
    m = float(mag)
    cx, cy = w / 2.0, h / 2.0
    if name == "ShearX":
        a = np.array([[1.0, m], [0.0, 1.0]])
        t = np.zeros(2)
    elif name == "ShearY":
        a = np.array([[1.0, 0.0], [m, 1.0]])
        t = np.zeros(2)
    elif name == "TranslateX":
        a, t = np.eye(2), np.array([m * w, 0.0])
    elif name == "TranslateY":
        a, t = np.eye(2), np.array([0.0, m * h])
    elif name == "Rotate":
        th = math.radians(m)
        c, s = math.cos(th), math.sin(th)
        a, t = np.array([[c, -s], [s, c]]), np.zeros(2)
    else:
        raise ValueError(f"{name} is not an affine op")
    centre = np.array([cx, cy])
    offset = centre - a @ centre + t
    return np.concatenate([a, offset[:, None]], axis=1)


def warp_affine(x: torch.Tensor, mtx: torch.Tensor) -> torch.Tensor:
    """Batched inverse-map warp: x float [N, 3, H, W], mtx float64 [N, 2, 3] (affine_matrix's convention, one
    matrix per sample); bilinear, out-of-image neighbours count as the grey FILL."""
    n, _, h, w = x.shape
    mtx = mtx.to(device=x.device, dtype=torch.float64)
    ys = torch.arange(h, dtype=torch.float64, device=x.device) + 0.5
    xs = torch.arange(w, dtype=torch.float64, device=x.device) + 0.5
    gy, gx = torch.meshgrid(ys, xs, indexing="ij")
    m = mtx[:, :, :, None, None]  # [N, 2, 3, 1, 1]: broadcast over the pixel grid
    sx = m[:, 0, 0] * gx + m[:, 0, 1] * gy + m[:, 0, 2]
    sy = m[:, 1, 0] * gx + m[:, 1, 1] * gy + m[:, 1, 2]
    # grid_sample, align_corners=False: -1 and +1 are the outer edges of the border pixels.
    grid = torch.stack([2.0 * sx / w - 1.0, 2.0 * sy / h - 1.0], dim=-1).to(x.dtype)
    both = torch.cat([x, torch.ones_like(x[:, :1])], dim=1)  # extra channel: weight inside
    out = tnf.grid_sample(both, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
    inside = out[:, 3:]
    return out[:, :3] + (1.0 - inside) * (FILL / 255.0)


def _affine(img: torch.Tensor, name: str, mag: float) -> torch.Tensor:
    _, h, w = img.shape
    mtx = torch.as_tensor(affine_matrix(name, mag, h, w), dtype=torch.float64)
    return warp_affine(img[None], mtx[None])[0]


# ----------------------------------------------------------------------------- colour
def _quantise(img: torch.Tensor) -> torch.Tensor:
    """0..255 integer levels (as float) of a [0, 1] image: round to nearest, ties (to within
    TIE_GUARD) down; see TIE_GUARD."""
    return torch.floor(img.clamp(0.0, 1.0) * 255.0 + (0.5 - TIE_GUARD))


def _gray(img: torch.Tensor) -> torch.Tensor:
    """PIL "L" of [..., 3, H, W] -> [..., 1, H, W]."""
    r, g, b = img[..., 0, :, :], img[..., 1, :, :], img[..., 2, :, :]
    return (GRAY_WEIGHTS[0] * r + GRAY_WEIGHTS[1] * g + GRAY_WEIGHTS[2] * b).unsqueeze(-3)


def _blend(degenerate: torch.Tensor, img: torch.Tensor, factor: float | torch.Tensor) -> torch.Tensor:
    """PIL Image.blend(degenerate, img, factor), clipped to [0, 1]."""
    return (degenerate + factor * (img - degenerate)).clamp(0.0, 1.0)


def _autocontrast(img: torch.Tensor) -> torch.Tensor:
    """Per channel ([..., 3, H, W]: also a batch)."""
    lo = img.amin(dim=(-2, -1), keepdim=True)
    hi = img.amax(dim=(-2, -1), keepdim=True)
    valid = hi > lo  # flat channels stay as they are
    span = torch.where(valid, hi - lo, torch.ones_like(hi))
    lo = torch.where(valid, lo, torch.zeros_like(lo))
    return ((img - lo) / span).clamp(0.0, 1.0)


def _equalize(img: torch.Tensor) -> torch.Tensor:
    q = _quantise(img.detach()).long()
    out = torch.empty_like(img)
    for c in range(q.shape[0]):
        hist = torch.bincount(q[c].flatten(), minlength=256)
        present = hist[hist > 0]
        step = int((hist.sum() - present[-1]).item()) // 255
        if step == 0:
            lut = torch.arange(256, device=img.device)
        else:
            before = torch.cumsum(hist, 0) - hist
            lut = ((step // 2 + before) // step).clamp(max=255)
        out[c] = lut[q[c]].to(img.dtype)
    return out / 255.0


def _solarize(img: torch.Tensor, threshold: float | torch.Tensor) -> torch.Tensor:
    flip = _quantise(img.detach()) >= threshold
    return torch.where(flip, 1.0 - img, img)


def _posterize(img: torch.Tensor, bits: float) -> torch.Tensor:
    step = float(2 ** (8 - int(round(bits))))
    return torch.floor(_quantise(img) / step) * step / 255.0


def _sharpness(img: torch.Tensor, factor: float) -> torch.Tensor:
    _, h, w = img.shape
    if h < 3 or w < 3:
        return img
    kernel = torch.ones(3, 3, dtype=img.dtype, device=img.device)
    kernel[1, 1] = 5.0
    kernel = (kernel / 13.0)[None, None]
    smooth = tnf.conv2d(img[:, None], kernel)[:, 0]  # valid part: [3, H-2, W-2]
    inner = _blend(smooth, img[:, 1:-1, 1:-1], factor)
    rows = torch.cat([img[:, 1:-1, :1], inner, img[:, 1:-1, -1:]], dim=2)
    return torch.cat([img[:, :1], rows, img[:, -1:]], dim=1)


def torch_op(name: str, img: torch.Tensor, mag: float = 0.0) -> torch.Tensor:
    """Apply one op to a float [3, H, W] image in [0, 1]; pure (the input is not modified)."""
    mag = float(mag)
    if name == "Identity":
        return img
    if name in AFFINE_OPS:
        return _affine(img, name, mag)
    if name == "AutoContrast":
        return _autocontrast(img)
    if name == "Invert":
        return 1.0 - img
    if name == "Equalize":
        return _equalize(img)
    if name == "Solarize":
        return _solarize(img, mag)
    if name == "Posterize":
        return _posterize(img, mag)
    if name == "Contrast":
        return _blend(_gray(img).mean(), img, mag)
    if name == "Color":
        return _blend(_gray(img), img, mag)
    if name == "Brightness":
        return _blend(torch.zeros_like(img), img, mag)
    if name == "Sharpness":
        return _sharpness(img, mag)
    raise ValueError(f"unknown op {name!r}")


def apply_strong_torch(
    img: torch.Tensor,
    ops: Sequence[int] | np.ndarray | torch.Tensor,
    on: Sequence[int] | np.ndarray | torch.Tensor,
    mags: Sequence[float] | np.ndarray | torch.Tensor,
) -> torch.Tensor:
    """One sample: float [3, H, W] in [0, 1] -> same, applying the gated slots in order.
    `ops`, `on`, `mags` are this sample's rows of strong_op, strong_on, strong_mag."""
    for op, active, mag in zip(np.asarray(ops).tolist(), np.asarray(on).tolist(), np.asarray(mags).tolist()):
        if active:
            img = torch_op(OPS[int(op)], img, mag)
    return img
