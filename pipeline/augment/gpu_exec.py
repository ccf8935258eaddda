"""Batched view executor on a torch device (`augment.executor=gpu`): the torch executor's views, made where
the model trains.

Same parameters, same meaning as torch_exec.py (the reference), but batch-shaped and device-resident:
  * decode: the batch's JPEGs (magic FF D8 FF) in one `torchvision.io.decode_jpeg(list, device=...)` call,
    nvjpeg's batched decoder on CUDA (libjpeg, one by one, on the CPU). One corrupt JPEG fails the whole call;
    the JPEGs are then decoded one at a time to find it. Other formats (PNG, ...) and JPEGs the device decoder
    refuses go through torch_exec.decode_rgb on the host and are copied over. Undecodable samples are dropped
    and counted like the torch executor does. No EXIF rotation (as everywhere here).
  * per sample: only crop + antialiased bilinear resize (torch_exec.crop_resize, on the device), then stacked;
  * per batch: flip, colour jitter (colour.colour_distort), grayscale, Gaussian blur with per-sample sigma in
    one depthwise convolution (`gaussian_blur_batch`), solarize, and the strong pool slot by slot, one batched
    op per op id present (strong_batch.py).
On the CPU the result equals TorchExecutor's to float rounding (same decoder, same resize; the batched blur and
strong ops differ from the per-sample ones in summation order only). On CUDA, nvjpeg's IDCT / chroma upsampling
and CUDA's resize kernels differ from libjpeg's and the CPU's by a fraction of a level.
"""

from __future__ import annotations

import logging
import math
from typing import Sequence, cast

import numpy as np
import torch
import torch.nn.functional as tnf
from torch import Tensor
from torchvision.io import ImageReadMode, decode_jpeg

from .params import Params, blur_window, select, valid_samples
from .recipe import Recipe, ViewSpec
from .strong_batch import apply_strong_batch, host_array
from .torch_exec import (
    TorchExecutor,
    _empty,
    crop_resize,
    decode_rgb,
    eval_candidates,
    eval_images,
    finish,
    photometric,
)

log = logging.getLogger(__name__)

JPEG_MAGIC = b"\xff\xd8\xff"


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


# ----------------------------------------------------------------------------- decode
def _bytes_tensor(encoded: bytes) -> Tensor:
    return torch.frombuffer(bytearray(encoded), dtype=torch.uint8)


def _decode_host(encoded: bytes, device: torch.device) -> Tensor | None:
    try:
        return decode_rgb(encoded).to(device)
    except RuntimeError:
        return None


def _decode_jpeg_one(data: Tensor, encoded: bytes, device: torch.device) -> Tensor | None:
    try:
        return decode_jpeg(data, mode=ImageReadMode.RGB, device=device)
    except Exception:  # RuntimeError from libjpeg / nvjpeg (ValueError for some unsupported streams)
        pass
    # What the torch executor does: torchvision on the host, then PIL (CMYK / lossless JPEGs nvjpeg refuses).
    return _decode_host(encoded, device)


def decode_batch(
    encoded: Sequence[bytes], candidates: Sequence[int] | np.ndarray, device: torch.device | str
) -> tuple[list[Tensor], np.ndarray]:
    """Decode encoded[i] for i in candidates to uint8 [3, H, W] RGB on `device`; (images, kept indices), in
    candidate order. The JPEGs go in one batched decode_jpeg call; see the module docstring."""
    device = torch.device(device)
    candidates = [int(i) for i in candidates]
    jpegs = [i for i in candidates if encoded[i][:3] == JPEG_MAGIC]
    decoded: dict[int, Tensor | None] = {}
    if jpegs:
        data = [_bytes_tensor(encoded[i]) for i in jpegs]
        try:
            decoded.update(zip(jpegs, decode_jpeg(data, mode=ImageReadMode.RGB, device=device)))
        except Exception:  # one bad JPEG fails the batch: find it
            decoded.update((i, _decode_jpeg_one(d, encoded[i], device)) for i, d in zip(jpegs, data))
    for i in candidates:
        if i not in decoded:
            decoded[i] = _decode_host(encoded[i], device)
    kept = [i for i in candidates if decoded[i] is not None]
    return cast(list[Tensor], [decoded[i] for i in kept]), np.asarray(kept, dtype=np.int64)  # kept: not None


# ----------------------------------------------------------------------------- blur
def gaussian_blur_batch(x: Tensor, sigma: Tensor | np.ndarray, on: Tensor | np.ndarray | None = None) -> Tensor:
    """Per-sample Gaussian blur of x [N, C, H, W] (float) in ONE depthwise convolution.

    Sample i is blurred with torchvision's gaussian_blur(kernel_size=blur_window(sigma_i), sigma=sigma_i) where
    on[i] and sigma_i > 0, and left as it is elsewhere. The shared kernel spans the largest window of the
    batch; each sample's taps outside its own window are zero and its kernel is normalised over its own window
    (softmax of -(d / sigma)^2 / 2 with the outside taps at -inf), so with reflect padding of the largest
    half-window this is torchvision's per-sample blur exactly (up to summation order): reflection gives the
    same pixels at the offsets a smaller window reaches. `sigma`, `on`: [N], numpy preferred (no device sync).
    """
    sig = host_array(sigma).astype(np.float32).reshape(-1)
    gate = sig > 0 if on is None else (host_array(on).reshape(-1) > 0) & (sig > 0)
    rows = np.flatnonzero(gate)
    if len(rows) == 0:
        return x
    windows = [blur_window(float(s)) for s in sig[rows]]
    k = max(windows)
    half = k // 2
    dev = x.device
    # torchvision's tap positions: linspace(-lim, lim, k) with lim = (k - 1) / (2 sqrt 2), i.e. d / sqrt(2)
    pos = torch.linspace(
        -(k - 1) / (2.0 * math.sqrt(2.0)), (k - 1) / (2.0 * math.sqrt(2.0)), k, dtype=x.dtype, device=dev
    )
    s = torch.as_tensor(sig[rows], device=dev).to(x.dtype).unsqueeze(1)  # [n, 1]
    own = torch.as_tensor([(w - 1) // 2 for w in windows], device=dev).unsqueeze(1)  # [n, 1]
    offset = torch.arange(-half, half + 1, device=dev).abs().unsqueeze(0)  # [1, k]
    logits = pos.unsqueeze(0).div(s).pow(2).neg().masked_fill(offset > own, float("-inf"))
    k1 = torch.softmax(logits, dim=1)  # [n, k]
    k2 = k1.unsqueeze(2) * k1.unsqueeze(1)  # [n, k, k]
    n, c, h, w = len(rows), x.shape[1], x.shape[2], x.shape[3]
    weight = k2.repeat_interleave(c, dim=0).unsqueeze(1)  # [n*c, 1, k, k]
    idx = torch.as_tensor(rows, device=dev)
    sub = tnf.pad(x.index_select(0, idx), [half, half, half, half], mode="reflect")
    out = tnf.conv2d(sub.reshape(1, n * c, h + 2 * half, w + 2 * half), weight, groups=n * c)
    return x.index_copy(0, idx, out.view(n, c, h, w))


# ----------------------------------------------------------------------------- views
def apply_view(
    images: Sequence[Tensor], p: Params, spec: ViewSpec, recipe: Recipe, device: torch.device, normalize: bool = True
) -> Tensor:
    """One view for decoded uint8 images on `device` whose params rows are `p` (numpy, aligned)."""
    if not images:
        return _empty(spec.size, device)
    x = torch.stack([crop_resize(img, c, spec.size) for img, c in zip(images, p["crop"])])
    on_device = {k: torch.as_tensor(np.ascontiguousarray(v), device=device) for k, v in p.items()}

    def blur(y: Tensor, _: dict) -> Tensor:
        return gaussian_blur_batch(y, p["sigma"], p["blur_on"])

    def strong(y: Tensor, _: dict) -> Tensor:
        return apply_strong_batch(y, p["strong_op"], p["strong_on"], p["strong_mag"])

    return finish(photometric(x, on_device, spec, blur=blur, strong=strong), spec, recipe, normalize)


class GpuExecutor(TorchExecutor):
    """TorchExecutor's contract, batched on `device` (any torch device; CUDA in training):
    __call__(encoded, params) -> (views on `device`, kept); `skipped` counts dropped samples;
    eval_transform(encoded, size) -> (eval views on `device`, kept)."""

    label = "gpu executor"

    def __init__(self, recipe: Recipe, device: torch.device | str | None = None):
        super().__init__(recipe)
        self.device = torch.device(device) if device is not None else default_device()

    def __call__(self, encoded: Sequence[bytes], params: Sequence[Params]) -> tuple[list[Tensor], np.ndarray]:
        candidates = np.flatnonzero(valid_samples(encoded, params))
        images, kept = decode_batch(encoded, candidates, self.device)
        self._drop_report(len(encoded), kept)
        views = [
            apply_view(images, select(p, kept), spec, self.recipe, self.device)
            for p, spec in zip(params, self.recipe.views)
        ]
        return views, kept

    def eval_transform(self, encoded: Sequence[bytes], size: int | None = None) -> tuple[Tensor, np.ndarray]:
        """Deterministic resize-short-side + centre crop, normalised (torch_exec.eval_transform); (images, kept)."""
        size = size or self.recipe.size
        images, kept = decode_batch(encoded, eval_candidates(encoded), self.device)
        self._drop_report(len(encoded), kept)
        return eval_images(images, size, self.recipe.mean, self.recipe.std, self.device), kept
