"""The strong pool (strong.py) on a whole batch at once: one op, one magnitude per sample.

`batch_op(name, x, mags)` equals `torch.stack([strong.torch_op(name, x[i], mags[i]) ...])` (same arithmetic
per sample; reductions may differ in float rounding, ~1e-7) and runs as a few batched kernels, on whatever
device x lives. `apply_strong_batch` applies the recorded slots of strong_op / strong_on / strong_mag: slot by
slot, for each op present among the samples whose slot is on, the batched op on that subset, scattered back.
Everything that depends on the parameters (the grouping, each step's rows, magnitudes, Posterize's step, the affine
matrices) is worked out on the host from numpy and sent in one non_blocking copy (host_pack.py), and no op reads a
value back (Equalize's histogram is a scatter-add into a fixed 256 bins, not a bincount that sizes itself), so a CUDA
batch does not synchronise on the pool.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as tnf
from torch import Tensor

from .host_pack import HostPack
from .strong import AFFINE_OPS, OPS, _autocontrast, _blend, _gray, _quantise, _solarize, affine_matrix, warp_affine


def host_array(a: Tensor | np.ndarray | Sequence) -> np.ndarray:
    return a.detach().cpu().numpy() if isinstance(a, Tensor) else np.asarray(a)


@dataclass(frozen=True)
class Step:
    """One batched op on some rows: `value` is the per-sample magnitude (Posterize: its quantisation step; the
    affine ops: unused, their inverse maps are `matrix`)."""

    name: str
    rows: np.ndarray
    value: np.ndarray
    matrix: np.ndarray | None


def plan_steps(ops: np.ndarray, on: np.ndarray, mags: np.ndarray, h: int, w: int) -> list[Step]:
    """The steps of strong_op / strong_on / strong_mag rows ([N, n_slots]) on images of h x w, in order."""
    ops, on, mags = np.asarray(ops, np.int64), np.asarray(on).astype(bool), np.asarray(mags, np.float32)
    steps = []
    for k in range(ops.shape[1] if ops.ndim == 2 else 0):
        for op in np.unique(ops[on[:, k], k]):
            name = OPS[int(op)]
            if name == "Identity":
                continue
            rows = np.flatnonzero(on[:, k] & (ops[:, k] == op))
            steps.append(_step(name, rows, mags[rows, k], h, w))
    return steps


def _step(name: str, rows: np.ndarray, mags: np.ndarray, h: int, w: int) -> Step:
    matrix = None
    value = np.asarray(mags, np.float32).reshape(-1)
    if name in AFFINE_OPS:
        matrix = np.stack([affine_matrix(name, float(m), h, w) for m in value]).reshape(-1, 2, 3)
    if name == "Posterize":  # the step of 2 ** (8 - bits), bits rounded as strong.py rounds them
        value = (2.0 ** (8 - np.round(value.astype(np.float64)).astype(np.int64))).astype(np.float32)
    return Step(name, np.asarray(rows, np.int64), value, matrix)


def upload(steps: Sequence[Step], device: torch.device) -> list[dict[str, Tensor]]:
    """Every step's rows, values and matrices on `device`, in one copy."""
    pack = HostPack()
    for i, st in enumerate(steps):
        pack.add(f"{i}.rows", st.rows)
        pack.add(f"{i}.value", st.value.reshape(-1, 1, 1, 1))
        if st.matrix is not None:
            pack.add(f"{i}.matrix", st.matrix, np.float64)
    d = pack.to(device) if steps else {}
    return [{k.split(".", 1)[1]: v for k, v in d.items() if k.startswith(f"{i}.")} for i in range(len(steps))]


def equalize(x: Tensor) -> Tensor:
    """strong._equalize per sample and channel, with one histogram for the batch: every (sample, channel) plane
    gets its own 256 bins (offset plane * 256), counted by one scatter-add into a tensor of known size."""
    q = _quantise(x.detach()).long()
    planes = q.shape[0] * q.shape[1]
    flat = q.reshape(planes, -1)
    offsets = torch.arange(planes, device=x.device).unsqueeze(1) * 256
    hist = torch.zeros(planes * 256, dtype=torch.long, device=x.device)
    hist = hist.scatter_add_(0, (flat + offsets).flatten(), torch.ones_like(flat).flatten()).view(planes, 256)
    levels = torch.arange(256, device=x.device)
    top = torch.where(hist > 0, levels, -1).amax(1, keepdim=True)  # the largest level present
    step = (hist.sum(1, keepdim=True) - hist.gather(1, top)) // 255
    before = torch.cumsum(hist, 1) - hist
    lut = torch.where(step > 0, ((step // 2 + before) // step.clamp(min=1)).clamp(max=255), levels)
    return lut.gather(1, flat).view_as(q).to(x.dtype) / 255.0


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


def run_step(name: str, x: Tensor, t: dict[str, Tensor]) -> Tensor:
    """One step on the rows of x it applies to; t: its `value` [n, 1, 1, 1] (and `matrix`) on x's device."""
    if name in AFFINE_OPS:
        return warp_affine(x, t["matrix"])
    if name == "AutoContrast":
        return _autocontrast(x)
    if name == "Invert":
        return 1.0 - x
    if name == "Equalize":
        return equalize(x)
    f = t["value"].to(x.dtype)
    if name == "Solarize":
        return _solarize(x, f)
    if name == "Posterize":
        return torch.floor(_quantise(x) / f) * f / 255.0
    if name == "Contrast":
        return _blend(_gray(x).mean(dim=(1, 2, 3), keepdim=True), x, f)
    if name == "Color":
        return _blend(_gray(x), x, f)
    if name == "Brightness":
        return _blend(torch.zeros_like(x), x, f)
    if name == "Sharpness":
        return sharpness(x, f)
    raise ValueError(f"unknown op {name!r}")


def batch_op(name: str, x: Tensor, mags: Tensor | np.ndarray | Sequence[float]) -> Tensor:
    """strong.torch_op(name, x[i], mags[i]) for every i of a float [N, 3, H, W] batch in [0, 1]; pure."""
    mags = host_array(mags).astype(np.float32).reshape(-1)
    if len(mags) != x.shape[0]:
        raise ValueError(f"{len(mags)} magnitudes for a batch of {x.shape[0]}")
    if name not in OPS:
        raise ValueError(f"unknown op {name!r}")
    if name == "Identity":
        return x
    step = _step(name, np.arange(len(mags)), mags, x.shape[2], x.shape[3])
    return run_step(name, x, upload([step], x.device)[0])


def apply_strong_batch(
    x: Tensor, ops: Tensor | np.ndarray, on: Tensor | np.ndarray, mags: Tensor | np.ndarray
) -> Tensor:
    """strong.apply_strong_torch for every sample of x [N, 3, H, W]; ops / on / mags: [N, n_slots] (the
    strong_op / strong_on / strong_mag rows of these samples, numpy preferred: no device sync)."""
    steps = plan_steps(host_array(ops), host_array(on), host_array(mags), x.shape[2], x.shape[3])
    for st, t in zip(steps, upload(steps, x.device)):
        x = x.index_copy(0, t["rows"], run_step(st.name, x.index_select(0, t["rows"]), t))
    return x
