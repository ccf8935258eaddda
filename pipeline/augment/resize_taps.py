"""PyTorch's antialiased bilinear resize weights, computed on the host for a whole batch of crops at once.

`F.resize(x, [S, S], BILINEAR, antialias=True)` on a float image is `_upsample_bilinear2d_aa`: a separable filter
whose output pixel i takes the weighted taps xmin..xmin+xsize-1 of its input axis. The arithmetic below follows
ATen's `_compute_weights_aa` step by step, float32 where it computes in float and float64 where C++ promotes to
double, so the taps are PyTorch's own (the batched executor's resize equals the reference's to summation order):

    scale   = float(in) / out                      support = scale if scale >= 1 else 1     (triangle filter)
    center  = float(scale * (i + 0.5))             invscale = 1 / scale if scale >= 1 else 1
    xmin    = max(int(float(center - support) + 0.5), 0)
    xsize   = min(int(float(center + support) + 0.5), in) - xmin
    w_j     = tri((float(j + xmin) - center + 0.5) * invscale),  normalised over j < xsize

One axis of a view is "resize the segment [start, start + length) of the padded image to out_len pixels and keep
the outputs first .. first + count - 1": a training crop keeps all (first 0, count = out_len = S); the eval view
resizes the whole image to its short side and keeps a centred window (first = the crop's offset).
"""

from __future__ import annotations

import numpy as np

F32 = np.float32


def aa_taps(
    start: np.ndarray, length: np.ndarray, out_len: np.ndarray, first: np.ndarray, count: int
) -> tuple[np.ndarray, np.ndarray]:
    """(index int64 [N, count, T], taps float32 [N, count, T]): output pixel s of row n is
    sum_t taps[n, s, t] * input[index[n, s, t]] (index in padded-image coordinates; taps past a pixel's own
    window are 0 and point at its first tap, so a scatter-add of them changes nothing)."""
    start, length = np.asarray(start, np.int64), np.asarray(length, np.int64)
    n = len(start)
    scale = (length.astype(F32) / np.asarray(out_len, np.int64).astype(F32)).astype(F32)[:, None]  # [N, 1]
    wide = scale >= 1.0
    support = np.where(wide, scale, F32(1.0)).astype(F32)
    invscale = np.where(wide, (1.0 / scale.astype(np.float64)).astype(F32), F32(1.0)).astype(F32)
    i = np.asarray(first, np.int64)[:, None] + np.arange(count, dtype=np.int64)[None, :]  # [N, S]
    center = (scale.astype(np.float64) * (i + 0.5)).astype(F32)
    lo = (center - support).astype(F32).astype(np.float64) + 0.5
    hi = (center + support).astype(F32).astype(np.float64) + 0.5
    xmin = np.maximum(np.trunc(lo).astype(np.int64), 0)
    xsize = np.minimum(np.trunc(hi).astype(np.int64), length[:, None]) - xmin
    taps_n = max(int(xsize.max()) if xsize.size else 1, 1)
    j = np.arange(taps_n, dtype=np.int64)
    pos = (xmin[..., None] + j).astype(F32)  # [N, S, T]
    arg = ((pos - center[..., None]).astype(F32).astype(np.float64) + 0.5) * invscale[..., None].astype(np.float64)
    a = np.abs(arg.astype(F32))
    inside = j < xsize[..., None]
    w = np.where(inside & (a < 1.0), (1.0 - a.astype(np.float64)).astype(F32), F32(0.0)).astype(F32)
    total = w.sum(-1, keepdims=True, dtype=F32)
    w = np.where(total != 0, w / np.where(total != 0, total, F32(1.0)), w).astype(F32)
    index = start[:, None, None] + np.where(inside, xmin[..., None] + j, xmin[..., None])
    return index.reshape(n, count, taps_n), w.reshape(n, count, taps_n)


def crop_axes(crops: np.ndarray, size: int, flip: np.ndarray) -> tuple[tuple, tuple]:
    """Resize taps of training crops (y, x, h, w) [N, 4] to size x size; rows whose flip is set get their
    horizontal taps reversed (the flip folded into the resize). ((y_index, y_taps), (x_index, x_taps))."""
    crops = np.asarray(crops, np.int64).reshape(-1, 4)
    n = len(crops)
    out, zero = np.full(n, size, np.int64), np.zeros(n, np.int64)
    y = aa_taps(crops[:, 0], crops[:, 2], out, zero, size)
    xi, xt = aa_taps(crops[:, 1], crops[:, 3], out, zero, size)
    flipped = np.asarray(flip).reshape(-1) > 0
    xi[flipped], xt[flipped] = xi[flipped, ::-1], xt[flipped, ::-1]
    return y, (xi, xt)
