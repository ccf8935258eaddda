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
from typing import Callable, Sequence

import numpy as np
import torch
import torchvision.transforms.v2.functional as F
from PIL import Image
from torchvision.io import ImageReadMode, decode_image
from torchvision.transforms import InterpolationMode

from . import colour
from .params import Params, blur_window, eval_geometry, select, try_image_size, valid_samples
from .png_check import png_rows_readable
from .recipe import IMAGENET_MEAN, IMAGENET_STD, Recipe, ViewSpec

log = logging.getLogger(__name__)
# torchvision 0.29 deprecates its decoders in favour of TorchCodec (not a dependency here); the
# warning would fire on every decode.
warnings.filterwarnings(
    "ignore", message="The image decoding and encoding capabilities of TorchVision", category=DeprecationWarning
)


def decode_rgb(encoded: bytes) -> torch.Tensor:
    """uint8 [3, H, W]; raises RuntimeError on undecodable bytes. No EXIF rotation (matches DALI
    and image_size)."""
    if not png_rows_readable(encoded):
        # torchvision's PNG decoder would crash the process on it (png_check.py); PIL raises instead
        return _decode_with_pil(encoded)
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
    out = img[:, y : y + h, x : x + w].float() / 255.0
    return F.resize(out, [size, size], interpolation=InterpolationMode.BILINEAR, antialias=True)


def blur_per_sample(x: torch.Tensor, p: dict[str, torch.Tensor]) -> torch.Tensor:
    """Gaussian blur of the gated-on samples (sigma 0 also means no blur), one torchvision call per sample."""
    blur = (p["blur_on"] > 0) & (p["sigma"] > 0)
    if not bool(blur.any()):
        return x
    rows = []
    for i in range(x.shape[0]):
        s = float(p["sigma"][i])
        rows.append(F.gaussian_blur(x[i], kernel_size=[blur_window(s)] * 2, sigma=[s, s]) if blur[i] else x[i])
    return torch.stack(rows)


def strong_per_sample(x: torch.Tensor, p: dict[str, torch.Tensor]) -> torch.Tensor:
    """The strong-pool slots, one sample at a time (strong.apply_strong_torch)."""
    from .strong import apply_strong_torch

    return torch.stack(
        [apply_strong_torch(x[i], p["strong_op"][i], p["strong_on"][i], p["strong_mag"][i]) for i in range(x.shape[0])]
    )


Stage = Callable[[torch.Tensor, dict], torch.Tensor]


def photometric(
    x: torch.Tensor,
    p: dict[str, torch.Tensor],
    spec: ViewSpec,
    blur: Stage = blur_per_sample,
    strong: Stage = strong_per_sample,
) -> torch.Tensor:
    """Everything after crop+resize on a batch [B,3,S,S] in [0, 1], un-normalised: flip, colour (unless the
    view leaves it to the method), blur, solarize, strong ops. `p` holds this batch's rows as tensors on x's
    device. `blur` and `strong` apply those two stages (the per-sample ones by default)."""
    x = torch.where(p["flip"].bool().view(-1, 1, 1, 1), x.flip(-1), x)
    if spec.color_stage == "executor":
        x = colour.colour_distort(x, p, spec.hue_mode)
    x = blur(x, p)
    if "solarize_on" in p:
        x = colour.gate(p["solarize_on"], colour.solarize(x, spec.solarize_threshold), x)
    if spec.strong_ops:
        x = strong(x, p)
    return x


def finish(x: torch.Tensor, spec: ViewSpec, recipe: Recipe, normalize: bool = True) -> torch.Tensor:
    """Normalise with the recipe's mean / std, except views whose colour stage is the method's."""
    return _normalize(x, recipe.mean, recipe.std) if normalize and spec.color_stage == "executor" else x


def apply_views(
    images: Sequence[torch.Tensor], p: Params, spec: ViewSpec, recipe: Recipe, normalize: bool = True
) -> torch.Tensor:
    """One view for a batch of decoded uint8 images whose params rows are `p` (numpy, aligned with images)."""
    if not images:
        return _empty(spec.size)
    x = torch.stack([crop_resize(img, c, spec.size) for img, c in zip(images, p["crop"])])
    x = photometric(x, {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in p.items()}, spec)
    return finish(x, spec, recipe, normalize)


def _decode_kept(encoded: Sequence[bytes], candidates: np.ndarray) -> tuple[list[torch.Tensor], np.ndarray]:
    images, kept = [], []
    for i in candidates:
        try:
            images.append(decode_rgb(encoded[i]))
        except RuntimeError:
            continue
        kept.append(i)
    return images, np.asarray(kept, dtype=np.int64)


def _empty(size: int, device: torch.device | str = "cpu") -> torch.Tensor:
    return torch.empty(0, 3, size, size, device=device)


class TorchExecutor:
    """Applies views with torchvision. Same contract as DaliExecutor:
    __call__(encoded, params) -> (views, kept); `skipped` counts dropped samples."""

    label = "torch executor"  # in the drop warning

    def __init__(self, recipe: Recipe):
        self.recipe = recipe
        self.skipped = 0

    def _drop_report(self, n_in: int, kept: np.ndarray) -> None:
        n_bad = n_in - len(kept)
        if n_bad:
            self.skipped += n_bad
            log.warning("%s: dropped %d undecodable sample(s) of %d (total %d)", self.label, n_bad, n_in, self.skipped)

    def __call__(
        self, encoded: Sequence[bytes], params: Sequence[Params], sizes: Sequence[tuple[int, int]] | None = None
    ) -> tuple[list[torch.Tensor], np.ndarray]:
        candidates = np.flatnonzero(valid_samples(encoded, params, sizes))
        images, kept = _decode_kept(encoded, candidates)
        self._drop_report(len(encoded), kept)
        views = [apply_views(images, select(p, kept), spec, self.recipe) for p, spec in zip(params, self.recipe.views)]
        return views, kept

    def eval_transform(self, encoded: Sequence[bytes], size: int | None = None) -> tuple[torch.Tensor, np.ndarray]:
        """Deterministic resize-short-side + centre crop, normalised; (images, kept)."""
        out, kept = eval_transform(encoded, size or self.recipe.size, self.recipe.mean, self.recipe.std)
        self._drop_report(len(encoded), kept)
        return out, kept


def eval_transform(
    encoded: Sequence[bytes],
    size: int,
    mean: Sequence[float] = IMAGENET_MEAN,
    std: Sequence[float] = IMAGENET_STD,
) -> tuple[torch.Tensor, np.ndarray]:
    """Eval view for kNN / linear probe features: float32 [B', 3, size, size] plus the indices
    of the samples that decoded (B' of them)."""
    images, kept = _decode_kept(encoded, eval_candidates(encoded))
    return eval_images(images, size, mean, std), kept


def eval_candidates(encoded: Sequence[bytes]) -> np.ndarray:
    """Indices of the samples whose header reads (the eval view needs no crop check)."""
    return np.array([i for i, e in enumerate(encoded) if try_image_size(e)], dtype=np.int64)


def eval_images(
    images: Sequence[torch.Tensor],
    size: int,
    mean: Sequence[float] = IMAGENET_MEAN,
    std: Sequence[float] = IMAGENET_STD,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """Decoded uint8 [3, H, W] images (on any device) -> the normalised eval view [B, 3, size, size]; `device`
    only places the empty result of an empty batch."""
    rows = []
    for img in images:
        rh, rw, top, left = eval_geometry(img.shape[1], img.shape[2], size)
        x = F.resize(img.float() / 255.0, [rh, rw], interpolation=InterpolationMode.BILINEAR, antialias=True)
        rows.append(_normalize(x[:, top : top + size, left : left + size], mean, std))
    return torch.stack(rows) if rows else _empty(size, device)
