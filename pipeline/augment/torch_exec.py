"""Reference executor: applies sampled view parameters with torch / torchvision.io only.

Simple and exact: it defines what a parameter means. Crops are per sample; everything after them
runs on the batch of one view, in float [0, 1], with the colour ops of colour.py (differentiable in
their factors; equal to torchvision's adjust_* ops).

Views whose spec says color_stage=model come out un-normalised in [0, 1] without jitter and grayscale:
the method applies colour.colour_distort itself (InvCLR differentiates through it).
"""
from __future__ import annotations

import io
import logging
import warnings
from typing import Sequence

import numpy as np
import torch
from PIL import Image
import torchvision.transforms.v2.functional as F
from torchvision.io import ImageReadMode, decode_image
from torchvision.transforms import InterpolationMode

from .params import Params, blur_window, eval_geometry, select, try_image_size, valid_samples
from . import colour
from .recipe import IMAGENET_MEAN, IMAGENET_STD, Recipe, ViewSpec

log = logging.getLogger(__name__)
# torchvision 0.29 deprecates its decoders in favour of TorchCodec (not a dependency here); the
# warning would fire on every decode.
warnings.filterwarnings("ignore", message="The image decoding and encoding capabilities of TorchVision",
                        category=DeprecationWarning)


def decode_rgb(encoded: bytes) -> torch.Tensor:
    """uint8 [3, H, W]; raises RuntimeError on undecodable bytes. No EXIF rotation (matches DALI
    and image_size)."""
    data = torch.frombuffer(bytearray(encoded), dtype=torch.uint8)
    try:
        img = decode_image(data, mode=ImageReadMode.RGB)
    except RuntimeError:
        img = _decode_with_pil(encoded)  # formats torchvision.io lacks but DALI reads (BMP, TIFF, ...)
    if img.dtype != torch.uint8:  # 16-bit PNGs decode as uint16
        img = F.to_dtype(img, torch.uint8, scale=True)
    return img


def _decode_with_pil(encoded: bytes) -> torch.Tensor:
    try:
        with Image.open(io.BytesIO(encoded)) as im:
            rgb = np.asarray(im.convert("RGB"))
    except Exception as err:  # PIL raises OSError, SyntaxError, ValueError, ... on corrupt data
        raise RuntimeError(f"undecodable image: {err}") from err
    return torch.from_numpy(rgb.copy()).permute(2, 0, 1).contiguous()


def _normalize(x: torch.Tensor, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    return F.normalize(x, mean=list(mean), std=list(std))


def crop_resize(img: torch.Tensor, crop: Sequence[int], size: int) -> torch.Tensor:
    """uint8 [3,H,W] -> float [3,size,size] in [0, 1]: the (y, x, h, w) box, bilinear with antialias."""
    y, x, h, w = (int(v) for v in crop)
    out = img[:, y:y + h, x:x + w].float() / 255.0
    return F.resize(out, [size, size], interpolation=InterpolationMode.BILINEAR, antialias=True)


def photometric(x: torch.Tensor, p: dict[str, torch.Tensor], spec: ViewSpec) -> torch.Tensor:
    """Everything after crop+resize on a batch [B,3,S,S] in [0, 1], un-normalised: flip, colour (unless the
    view leaves it to the method), blur, solarize, strong ops. `p` holds this batch's rows as tensors."""
    x = torch.where(p["flip"].bool().view(-1, 1, 1, 1), x.flip(-1), x)
    if spec.color_stage == "executor":
        x = colour.colour_distort(x, p, spec.hue_mode)
    blur = (p["blur_on"] > 0) & (p["sigma"] > 0)  # sigma 0 also means no blur
    if bool(blur.any()):
        rows = []
        for i in range(x.shape[0]):
            s = float(p["sigma"][i])
            rows.append(F.gaussian_blur(x[i], kernel_size=[blur_window(s)] * 2, sigma=[s, s]) if blur[i] else x[i])
        x = torch.stack(rows)
    if "solarize_on" in p:
        x = colour.gate(p["solarize_on"], colour.solarize(x, spec.solarize_threshold), x)
    if spec.strong_ops:
        from .strong import apply_strong_torch
        x = torch.stack([apply_strong_torch(x[i], p["strong_op"][i], p["strong_on"][i], p["strong_mag"][i])
                         for i in range(x.shape[0])])
    return x


def apply_views(images: Sequence[torch.Tensor], p: Params, spec: ViewSpec, recipe: Recipe,
                normalize: bool = True) -> torch.Tensor:
    """One view for a batch of decoded uint8 images whose params rows are `p` (numpy, aligned with images)."""
    if not images:
        return _empty(spec.size)
    x = torch.stack([crop_resize(img, c, spec.size) for img, c in zip(images, p["crop"])])
    x = photometric(x, {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in p.items()}, spec)
    return _normalize(x, recipe.mean, recipe.std) if normalize and spec.color_stage == "executor" else x


def _decode_kept(encoded: Sequence[bytes], candidates: np.ndarray) -> tuple[list[torch.Tensor], np.ndarray]:
    images, kept = [], []
    for i in candidates:
        try:
            images.append(decode_rgb(encoded[i]))
        except RuntimeError:
            continue
        kept.append(i)
    return images, np.asarray(kept, dtype=np.int64)


def _empty(size: int) -> torch.Tensor:
    return torch.empty(0, 3, size, size)


class TorchExecutor:
    """Applies views with torchvision. Same contract as DaliExecutor:
    __call__(encoded, params) -> (views, kept); `skipped` counts dropped samples."""

    def __init__(self, recipe: Recipe):
        self.recipe = recipe
        self.skipped = 0

    def _drop_report(self, n_in: int, kept: np.ndarray) -> None:
        n_bad = n_in - len(kept)
        if n_bad:
            self.skipped += n_bad
            log.warning("torch executor: dropped %d undecodable sample(s) of %d (total %d)",
                        n_bad, n_in, self.skipped)

    def __call__(self, encoded: Sequence[bytes], params: Sequence[Params]) -> tuple[list[torch.Tensor], np.ndarray]:
        candidates = np.flatnonzero(valid_samples(encoded, params))
        images, kept = _decode_kept(encoded, candidates)
        self._drop_report(len(encoded), kept)
        views = [apply_views(images, select(p, kept), spec, self.recipe)
                 for p, spec in zip(params, self.recipe.views)]
        return views, kept

    def eval_transform(self, encoded: Sequence[bytes], size: int | None = None) -> tuple[torch.Tensor, np.ndarray]:
        """Deterministic resize-short-side + centre crop, normalised; (images, kept)."""
        out, kept = eval_transform(encoded, size or self.recipe.size, self.recipe.mean, self.recipe.std)
        self._drop_report(len(encoded), kept)
        return out, kept


def eval_transform(encoded: Sequence[bytes], size: int,
                   mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD,
                   ) -> tuple[torch.Tensor, np.ndarray]:
    """Eval view for kNN / linear probe features: float32 [B', 3, size, size] plus the indices
    of the samples that decoded (B' of them)."""
    candidates = np.array([i for i, e in enumerate(encoded) if try_image_size(e)], dtype=np.int64)
    images, kept = _decode_kept(encoded, candidates)
    rows = []
    for img in images:
        rh, rw, top, left = eval_geometry(img.shape[1], img.shape[2], size)
        x = F.resize(img.float() / 255.0, [rh, rw], interpolation=InterpolationMode.BILINEAR, antialias=True)
        rows.append(_normalize(x[:, top:top + size, left:left + size], mean, std))
    return (torch.stack(rows) if rows else _empty(size)), kept
