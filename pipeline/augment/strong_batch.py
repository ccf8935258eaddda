"""The strong pool (strong.py) on a whole batch at once: one op, one magnitude per sample.

`batch_op(name, x, mags)` equals `torch.stack([strong.torch_op(name, x[i], mags[i]) ...])` (same arithmetic
per sample; reductions may differ in float rounding, ~1e-7) and runs as a few batched kernels, on whatever
device x lives. `apply_strong_batch` applies the recorded slots of strong_op / strong_on / strong_mag: slot by
slot, for each op present among the samples whose slot is on, the batched op on that subset, scattered back.
The grouping is computed on the host from the numpy parameters, so a CUDA batch does not synchronise on it.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as tnf
from torch import Tensor

from .strong import AFFINE_OPS, OPS, _autocontrast, _blend, _gray, _quantise, _solarize, affine_matrix, warp_affine


def host_array(a: Tensor | np.ndarray | Sequence) -> np.ndarray:
    return a.detach().cpu().numpy() if isinstance(a, Tensor) else np.asarray(a)


def _per_sample(mags: np.ndarray, x: Tensor) -> Tensor:
    """[N] host magnitudes -> [N, 1, 1, 1] on x's device, in x's dtype (float32 magnitudes stay exact)."""
    return torch.as_tensor(np.asarray(mags, dtype=np.float32), device=x.device).to(x.dtype).view(-1, 1, 1, 1)


def affine(x: Tensor, name: str, mags: np.ndarray) -> Tensor:
    _, _, h, w = x.shape
    mtx = np.stack([affine_matrix(name, float(m), h, w) for m in mags])  # float64 [N, 2, 3]
    return warp_affine(x, torch.from_numpy(mtx))


def equalize(x: Tensor) -> Tensor:
    """strong._equalize per sample and channel, with one histogram call for the batch: every (sample, channel)
    plane gets its own 256 bins (offset plane * 256) in a single bincount."""
    q = _quantise(x.detach()).long()
    planes = q.shape[0] * q.shape[1]
    flat = q.reshape(planes, -1)
    offsets = torch.arange(planes, device=x.device).unsqueeze(1) * 256
    hist = torch.bincount((flat + offsets).flatten(), minlength=planes * 256).view(planes, 256)
    levels = torch.arange(256, device=x.device)
    top = torch.where(hist > 0, levels, -1).amax(1, keepdim=True)  # the largest level present
    step = (hist.sum(1, keepdim=True) - hist.gather(1, top)) // 255
    before = torch.cumsum(hist, 1) - hist
    lut = torch.where(step > 0, ((step // 2 + before) // step.clamp(min=1)).clamp(max=255), levels)
    return lut.gather(1, flat).view_as(q).to(x.dtype) / 255.0


def posterize(x: Tensor, bits: np.ndarray) -> Tensor:
    step = 2.0 ** (8 - np.round(np.asarray(bits, dtype=np.float64)).astype(np.int64))  # round() as strong's
    return torch.floor(_quantise(x) / _per_sample(step, x)) * _per_sample(step, x) / 255.0


def sharpness(x: Tensor, f: Tensor) -> Tensor:
    n, c, h, w = x.shape
    if h < 3 or w < 3:
        return x
    kernel = torch.ones(3, 3, dtype=x.dtype, device=x.device)
    kernel[1, 1] = 5.0
    kernel = (kernel / 13.0)[None, None]
    smooth = tnf.conv2d(x.reshape(n * c, 1, h, w), kernel).view(n, c, h - 2, w - 2)  # valid part
    inner = _blend(smooth, x[..., 1:-1, 1:-1], f)
    rows = torch.cat([x[..., 1:-1, :1], inner, x[..., 1:-1, -1:]], dim=3)
    return torch.cat([x[..., :1, :], rows, x[..., -1:, :]], dim=2)


def batch_op(name: str, x: Tensor, mags: Tensor | np.ndarray | Sequence[float]) -> Tensor:
    """strong.torch_op(name, x[i], mags[i]) for every i of a float [N, 3, H, W] batch in [0, 1]; pure."""
    mags = host_array(mags).astype(np.float32).reshape(-1)
    if len(mags) != x.shape[0]:
        raise ValueError(f"{len(mags)} magnitudes for a batch of {x.shape[0]}")
    if name == "Identity":
        return x
    if name in AFFINE_OPS:
        return affine(x, name, mags)
    if name == "AutoContrast":
        return _autocontrast(x)
    if name == "Invert":
        return 1.0 - x
    if name == "Equalize":
        return equalize(x)
    if name == "Solarize":
        return _solarize(x, _per_sample(mags, x))
    if name == "Posterize":
        return posterize(x, mags)
    f = _per_sample(mags, x)
    if name == "Contrast":
        return _blend(_gray(x).mean(dim=(1, 2, 3), keepdim=True), x, f)
    if name == "Color":
        return _blend(_gray(x), x, f)
    if name == "Brightness":
        return _blend(torch.zeros_like(x), x, f)
    if name == "Sharpness":
        return sharpness(x, f)
    raise ValueError(f"unknown op {name!r}")


def apply_strong_batch(
    x: Tensor, ops: Tensor | np.ndarray, on: Tensor | np.ndarray, mags: Tensor | np.ndarray
) -> Tensor:
    """strong.apply_strong_torch for every sample of x [N, 3, H, W]; ops / on / mags: [N, n_slots] (the
    strong_op / strong_on / strong_mag rows of these samples, numpy preferred: no device sync)."""
    ops, on = host_array(ops).astype(np.int64), host_array(on).astype(bool)
    mags = host_array(mags).astype(np.float32)
    for k in range(ops.shape[1] if ops.ndim == 2 else 0):
        for op in np.unique(ops[on[:, k], k]):
            if OPS[int(op)] == "Identity":
                continue
            rows = np.flatnonzero(on[:, k] & (ops[:, k] == op))
            idx = torch.as_tensor(rows, device=x.device)
            x = x.index_copy(0, idx, batch_op(OPS[int(op)], x.index_select(0, idx), mags[rows, k]))
    return x
