"""DALI graph fragment for the strong augmentation pool (strong.py holds the semantics).

Feeding convention
------------------
Three per-sample arrays of length n_ops, one external source each (`strong_inputs` makes them):
  {prefix}strong_op   int32 [n_ops]   ids into strong.OPS
  {prefix}strong_on   bool  [n_ops]   slot gate
  {prefix}strong_mag  float [n_ops]   magnitude in strong.py's units
`strong_feed(params, idx, prefix)` turns rows `idx` of `sample_strong`'s output into exactly these
arrays (first axis = batch), ready for `pipe.feed_input(name, array)`. `counts` stays on the host.

The affine matrices are NOT fed: each slot builds its 2x3 inverse map in the graph from the op id,
the magnitude and the image's own shape (`img.shape()`), with the same formula as
strong.affine_matrix. So the host needs no image size and the feed does not depend on the view
size; the torch-vs-DALI tests check the two formulas agree.

Graph
-----
`apply_strong_dali(img, op, on, mag, n_ops)` must be called inside
`@pipeline_def(enable_conditionals=True)`; `img` is float HWC in [0, 255] (e.g. after
`fn.resize(..., dtype=FLOAT)`), at least 3x3. Per slot k: `if on[k]:` then an if/elif chain on
op[k], one branch per op, so gated-off slots and non-chosen ops are exact identities:
  affine ops          one fn.warp_affine per slot (matrix from the slot's op and magnitude),
                      bilinear, fill_value 128 (neighbours outside the image count as 128)
  Invert, Solarize,   DALI arithmetic on the image quantised with floor(x + 0.5)
  Posterize
  Brightness, Color,  arithmetic; Contrast's mean and AutoContrast's per-channel min / max come
  Contrast,           from fn.reductions
  AutoContrast
  Sharpness           the 3x3 smooth as a sum of 9 shifted slices of the image, blended, and the
                      1-pixel border re-attached with fn.cat
  Equalize            fn.python_function (numpy, PIL's LUT) - the only python op. DALI's native
                      fn.equalize does run on CPU, but uses the OpenCV LUT
                      round((cdf - cdf_min) * 255 / (N - cdf_min)) instead of PIL's: measured up
                      to 23 levels away (mean 3.7) on photo-like 48x64 images. equalize="native"
                      selects it anyway (no GIL, faster, not equal to the torch reference).

CPU backend only (that is what runs and is tested here). A GPU version would need `mag` moved to
the GPU for the arithmetic (`mag.gpu()`, as dali_graph does) and equalize="native", since a
python_function cannot bring GPU data back to the CPU; a GPU image is rejected for now.
"""

from __future__ import annotations

import math

import numpy as np
import nvidia.dali.fn as fn
import nvidia.dali.math as dmath
from nvidia.dali.types import DALIDataType, DALIInterpType  # types.INT32 etc. are not in DALI's types.pyi

from .strong import FILL, GRAY_WEIGHTS, OP_ID, TIE_GUARD

_INPUTS = {"strong_op": DALIDataType.INT32, "strong_on": DALIDataType.BOOL, "strong_mag": DALIDataType.FLOAT}


def strong_inputs(prefix: str = ""):
    """(op, on, mag) external-source nodes following the feeding convention."""
    return tuple(fn.external_source(name=prefix + key, dtype=dtype, ndim=1) for key, dtype in _INPUTS.items())


def strong_feed(params: dict[str, np.ndarray], idx: np.ndarray, prefix: str = "") -> dict[str, np.ndarray]:
    """Host arrays for `strong_inputs(prefix)`, rows `idx` of sample_strong's output."""
    idx = np.asarray(idx)
    return {
        prefix + "strong_op": np.ascontiguousarray(params["strong_op"][idx], dtype=np.int32),
        prefix + "strong_on": np.ascontiguousarray(params["strong_on"][idx] > 0),
        prefix + "strong_mag": np.ascontiguousarray(params["strong_mag"][idx], dtype=np.float32),
    }


# ----------------------------------------------------------------------------- python op
def equalize_pil_numpy(img: np.ndarray) -> np.ndarray:
    """PIL ImageOps.equalize on a float HWC [0, 255] array (quantised first); float32 out.
    Module-level on purpose: AutoGraph must not rewrite python_function's callee."""
    q = np.floor(np.clip(img, 0.0, 255.0) + (0.5 - TIE_GUARD)).astype(np.int64)
    out = np.empty(q.shape, dtype=np.float32)
    for c in range(q.shape[-1]):
        hist = np.bincount(q[..., c].ravel(), minlength=256)
        present = hist[hist > 0]
        step = (int(hist.sum()) - int(present[-1])) // 255
        if step == 0:
            lut = np.arange(256)
        else:
            lut = np.minimum((step // 2 + np.cumsum(hist) - hist) // step, 255)
        out[..., c] = lut[q[..., c]]
    return out


# ----------------------------------------------------------------------------- graph pieces
def _clamp(x):
    return dmath.clamp(x, 0.0, 255.0)


def _quantise(x):
    return dmath.floor(_clamp(x) + (0.5 - TIE_GUARD))  # strong.TIE_GUARD explains the guard


def _gray(img):
    """[H, W, 1] grayscale (PIL weights)."""
    g = img[:, :, 0] * GRAY_WEIGHTS[0] + img[:, :, 1] * GRAY_WEIGHTS[1] + img[:, :, 2] * GRAY_WEIGHTS[2]
    return fn.expand_dims(g, axes=[2], new_axis_names="C")


def _blend(degenerate, img, factor):
    return _clamp(degenerate + factor * (img - degenerate))


def _affine(img, op, mag):
    """warp_affine with strong.affine_matrix built from this sample's op / mag / shape."""
    shape = fn.cast(img.shape(), dtype=DALIDataType.FLOAT)
    h, w = shape[0], shape[1]
    cx, cy = w * 0.5, h * 0.5
    theta = mag * (op == OP_ID["Rotate"]) * (math.pi / 180.0)
    cos, sin = dmath.cos(theta), dmath.sin(theta)
    a00, a11 = cos, cos
    a01 = mag * (op == OP_ID["ShearX"]) - sin
    a10 = mag * (op == OP_ID["ShearY"]) + sin
    tx = mag * (op == OP_ID["TranslateX"]) * w
    ty = mag * (op == OP_ID["TranslateY"]) * h
    t0 = cx - (a00 * cx + a01 * cy) + tx
    t1 = cy - (a10 * cx + a11 * cy) + ty
    mtx = fn.reshape(fn.stack(a00, a01, t0, a10, a11, t1), shape=[2, 3])
    return fn.warp_affine(
        img, matrix=mtx, fill_value=float(FILL), interp_type=DALIInterpType.INTERP_LINEAR, inverse_map=True
    )


def _autocontrast(img):
    lo = fn.reductions.min(img, axes=[0, 1])  # [3]
    hi = fn.reductions.max(img, axes=[0, 1])
    valid = hi > lo
    invalid = hi <= lo
    scale = (valid * 255.0 + invalid * 1.0) / ((hi - lo) * valid + invalid * 1.0)
    return _clamp((img - lo * valid) * scale)


def _solarize(img, threshold):
    return img + (_quantise(img) >= threshold) * (255.0 - 2.0 * img)


def _posterize(img, bits):
    step = dmath.pow(2.0, 8.0 - bits)
    return dmath.floor(_quantise(img) / step) * step


def _sharpness(img, factor):
    centre = img[1:-1, 1:-1]
    smooth = (
        img[:-2, :-2]
        + img[:-2, 1:-1]
        + img[:-2, 2:]
        + img[1:-1, :-2]
        + centre * 5.0
        + img[1:-1, 2:]
        + img[2:, :-2]
        + img[2:, 1:-1]
        + img[2:, 2:]
    ) * (1.0 / 13.0)
    inner = _blend(smooth, centre, factor)
    rows = fn.cat(img[1:-1, 0:1], inner, img[1:-1, -1:], axis=1)
    return fn.cat(img[0:1], rows, img[-1:], axis=0)


def _equalize(img, mode: str):
    if mode == "native":
        q = fn.cast(_quantise(img), dtype=DALIDataType.UINT8)
        return fn.cast(fn.equalize(q), dtype=DALIDataType.FLOAT)
    return fn.python_function(img, function=equalize_pil_numpy, output_layouts="HWC")


def _slot(img, op, mag, equalize: str):
    """One gated-on slot: an if/elif chain over the op id (Identity falls through)."""
    if (op >= OP_ID["ShearX"]) & (op <= OP_ID["Rotate"]):
        img = _affine(img, op, mag)
    elif op == OP_ID["AutoContrast"]:
        img = _autocontrast(img)
    elif op == OP_ID["Invert"]:
        img = 255.0 - img
    elif op == OP_ID["Equalize"]:
        img = _equalize(img, equalize)
    elif op == OP_ID["Solarize"]:
        img = _solarize(img, mag)
    elif op == OP_ID["Posterize"]:
        img = _posterize(img, mag)
    elif op == OP_ID["Contrast"]:
        img = _blend(fn.reductions.mean(_gray(img)), img, mag)
    elif op == OP_ID["Color"]:
        img = _blend(_gray(img), img, mag)
    elif op == OP_ID["Brightness"]:
        img = _clamp(img * mag)
    elif op == OP_ID["Sharpness"]:
        img = _sharpness(img, mag)
    return img


def apply_strong_dali(img, op, on, mag, n_ops: int, equalize: str = "pil"):
    """Strong-aug slots 0..n_ops-1 on a float HWC [0, 255] DataNode (see the module docstring).
    `op`, `on`, `mag` are the per-sample length-n_ops arrays of `strong_inputs`."""
    if equalize not in ("pil", "native"):
        raise ValueError(f"equalize must be 'pil' or 'native', got {equalize!r}")
    if getattr(img, "device", "cpu") != "cpu":
        raise NotImplementedError("strong aug is a CPU graph fragment (see the module docstring)")
    for k in range(int(n_ops)):
        if on[k]:
            img = _slot(img, op[k], mag[k], equalize)
    return img
