"""Reference executor: applies sampled view parameters with torch / torchvision.io only.

Per-sample and slow-ish, but simple and exact: it defines what a parameter means. Images are
float in [0, 1] from the crop on, so the colour ops stay differentiable for later issues.
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

from .params import Params, blur_window, eval_geometry, try_image_size, valid_samples
from .recipe import TwoViewRecipe

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


def apply_view(img: torch.Tensor, p: dict[str, float | np.ndarray], recipe: TwoViewRecipe) -> torch.Tensor:
    """One sample, one view: uint8 [3,H,W] -> normalised float32 [3,size,size].
    `p` holds this sample's row of each params array."""
    y, x, h, w = (int(v) for v in p["crop"])
    out = img[:, y:y + h, x:x + w].float() / 255.0
    out = F.resize(out, [recipe.size, recipe.size], interpolation=InterpolationMode.BILINEAR, antialias=True)
    if p["flip"]:
        out = out.flip(-1)
    if p["jitter_on"]:
        # Fixed order (see params.py): brightness, contrast, saturation, hue; each clamps to [0, 1].
        out = F.adjust_brightness(out, float(p["brightness"]))
        out = F.adjust_contrast(out, float(p["contrast"]))
        out = F.adjust_saturation(out, float(p["saturation"]))
        out = F.adjust_hue(out, float(p["hue"]))
    if p["gray"]:
        out = F.rgb_to_grayscale(out, num_output_channels=3)
    if p["blur_on"] and p["sigma"] > 0:
        k = blur_window(float(p["sigma"]))
        out = F.gaussian_blur(out, kernel_size=[k, k], sigma=[float(p["sigma"])] * 2)
    return _normalize(out, recipe.mean, recipe.std)


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

    def __init__(self, recipe: TwoViewRecipe):
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
        views = []
        for p in params:
            rows = [apply_view(img, {k: v[i] for k, v in p.items()}, self.recipe)
                    for img, i in zip(images, kept)]
            views.append(torch.stack(rows) if rows else _empty(self.recipe.size))
        return views, kept

    def eval_transform(self, encoded: Sequence[bytes], size: int | None = None) -> tuple[torch.Tensor, np.ndarray]:
        """Deterministic resize-short-side + centre crop, normalised; (images, kept)."""
        out, kept = eval_transform(encoded, size or self.recipe.size, self.recipe.mean, self.recipe.std)
        self._drop_report(len(encoded), kept)
        return out, kept


def eval_transform(encoded: Sequence[bytes], size: int,
                   mean: Sequence[float] = TwoViewRecipe.mean, std: Sequence[float] = TwoViewRecipe.std,
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
