"""Pure parameter samplers: everything random about a view is drawn here, in numpy.

A view's parameters are a dict of named per-sample arrays (first axis = batch). Executors only
*apply* them, so the same parameters give the same view on DALI and on torch, and methods
(e.g. InvCLR's gradient penalty, CoCor's target net) can read them.

Photometric ops are applied in the order brightness, contrast, saturation, hue (or the per-sample
permutation `jitter_order` when the view asks for torchvision's random order), then grayscale, blur,
solarize, and the strong-pool ops.
"""

from __future__ import annotations

import io
import math
from typing import Sequence

import numpy as np
from PIL import Image

from .crops import sample_crop
from .recipe import Recipe, ViewSpec

Params = dict[str, np.ndarray]

# Placeholder size for samples whose header cannot be read: their params are still drawn (so
# every params array has one row per input sample) and executors drop those samples.
UNREADABLE = (1, 1)


def image_size(encoded: bytes) -> tuple[int, int]:
    """(height, width) from the image header only (PIL opens lazily; no pixel decoding).

    EXIF orientation is ignored on purpose: both executors decode without applying it, so crop
    boxes refer to the stored pixel grid.
    """
    with Image.open(io.BytesIO(encoded)) as im:
        w, h = im.size
    return h, w


def try_image_size(encoded: bytes) -> tuple[int, int] | None:
    """image_size, or None when the header is unreadable."""
    try:
        h, w = image_size(encoded)
    except Exception:  # PIL raises many types (UnidentifiedImageError, SyntaxError, OSError, ...)
        return None
    return (h, w) if h > 0 and w > 0 else None


def _coin(p: float, n: int, rng: np.random.Generator) -> np.ndarray:
    return (rng.random(n) < p).astype(np.uint8)


def _factor(strength: float, on: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """torchvision ColorJitter factor: uniform on [max(0, 1-s), 1+s] where on, else 1 (identity)."""
    f = rng.uniform(max(0.0, 1.0 - strength), 1.0 + strength, len(on))
    return np.where(on > 0, f, 1.0).astype(np.float32)


def sample_view_params(sizes: Sequence[tuple[int, int]], spec: ViewSpec, rng: np.random.Generator) -> Params:
    """Parameters of ONE view for a batch of images of the given (h, w) sizes.

    Keys (B = len(sizes)): crop int32 [B,4] = (y, x, h, w) in source pixels; flip, jitter_on,
    gray, blur_on uint8 [B]; brightness, contrast, saturation float32 [B] factors (1 = off);
    hue float32 [B] in fractions of a turn (0 = off); sigma float32 [B] (0 = off).
    Only when the spec can use them: jitter_order int8 [B,4] (a permutation of 0..3 = brightness,
    contrast, saturation, hue), solarize_on uint8 [B], and the strong-pool keys of strong.sample_strong
    (strong_op, strong_on, strong_mag, counts).
    """
    n = len(sizes)
    crop = np.array([sample_crop(h, w, spec.scale, spec.ratio, rng) for h, w in sizes], dtype=np.int32).reshape(n, 4)
    b, c, s, h = spec.jitter
    jitter_on = _coin(spec.p_jitter, n, rng)
    hue = np.where(jitter_on > 0, rng.uniform(-h, h, n), 0.0).astype(np.float32)
    blur_on_draw = rng.random(n) < spec.p_blur
    sigma_draw = rng.uniform(spec.blur_sigma[0], spec.blur_sigma[1], n)
    p = {
        "crop": crop,
        "flip": _coin(spec.p_flip, n, rng),
        "jitter_on": jitter_on,
        "brightness": _factor(b, jitter_on, rng),
        "contrast": _factor(c, jitter_on, rng),
        "saturation": _factor(s, jitter_on, rng),
        "hue": hue,
        "gray": _coin(spec.p_gray, n, rng),
        "blur_on": blur_on_draw.astype(np.uint8),
        "sigma": np.where(blur_on_draw, sigma_draw, 0.0).astype(np.float32),
    }
    if spec.gray_first:  # greyed before the jitter: saturation and hue are identities on a grey image
        p["saturation"] = np.where(p["gray"] > 0, 1.0, p["saturation"]).astype(np.float32)
        p["hue"] = np.where(p["gray"] > 0, 0.0, p["hue"]).astype(np.float32)
    if spec.jitter_order == "random":
        p["jitter_order"] = np.stack([rng.permutation(4) for _ in range(n)]).astype(np.int8).reshape(n, 4)
    if spec.p_solarize > 0:
        p["solarize_on"] = _coin(spec.p_solarize, n, rng)
    if spec.strong_ops:
        from .strong import sample_strong

        p.update(sample_strong(n, spec.strong_ops, spec.strong_pool, spec.strong_p, spec.strong_law, rng))
    return p


def header_sizes(encoded: Sequence[bytes]) -> list[tuple[int, int]]:
    """(h, w) of every sample from its header; UNREADABLE where it cannot be read."""
    return [try_image_size(e) or UNREADABLE for e in encoded]


def sample_views(
    encoded: Sequence[bytes], recipe: Recipe, rng: np.random.Generator, sizes: Sequence[tuple[int, int]] | None = None
) -> list[Params]:
    """One params dict per view: drawn independently, then the first two views' crops, blur sigmas or
    a colour factor redrawn jointly where the recipe asks (JointCrop / JointBlur / JointColor).
    Unreadable images get placeholder params (size UNREADABLE); executors drop them and report it
    through `kept`. `sizes`: header_sizes(encoded) when the caller has them."""
    sizes = header_sizes(encoded) if sizes is None else sizes
    views = [sample_view_params(sizes, spec, rng) for spec in recipe.views]
    if recipe.joint.active:
        apply_joint(views, sizes, recipe, rng)
    return views


def apply_joint(
    views: list[Params], sizes: Sequence[tuple[int, int]], recipe: Recipe, rng: np.random.Generator
) -> None:
    """Redraw the first two views' joint parameters in place. The apply/skip gates stay the independent
    per-view draws (docs/methods/jointcrop.md §6): a joint sigma or factor only takes effect where its view's
    gate is on."""
    from .joint import JointSampler, sample_joint_crops

    j, (a, b), (s1, s2) = recipe.joint, views[:2], recipe.views[:2]
    n = len(sizes)
    if j.crop_beta is not None:
        _check_same(s1, s2, ("scale", "ratio"), "JointCrop")
        a["crop"], b["crop"] = (
            c.astype(np.int32) for c in sample_joint_crops(sizes, s1.scale, s1.ratio, j.crop_beta, rng)
        )
    if j.blur_beta is not None:
        _check_same(s1, s2, ("blur_sigma",), "JointBlur")
        x1, x2 = JointSampler(s1.blur_sigma[0], s1.blur_sigma[1], j.blur_beta).sample_np(n, rng)
        a["sigma"] = np.where(a["blur_on"] > 0, x1, 0.0).astype(np.float32)
        b["sigma"] = np.where(b["blur_on"] > 0, x2, 0.0).astype(np.float32)
    if j.color_beta is not None:
        _check_same(s1, s2, ("jitter",), "JointColor")
        strength = s1.jitter[0 if j.color_factor == "brightness" else 1]
        # the log-ratio law needs a positive lower bound; strength >= 1 would allow a factor of 0
        low = max(1e-3, 1.0 - strength)
        x1, x2 = JointSampler(low, 1.0 + strength, j.color_beta).sample_np(n, rng)
        a[j.color_factor] = np.where(a["jitter_on"] > 0, x1, 1.0).astype(np.float32)
        b[j.color_factor] = np.where(b["jitter_on"] > 0, x2, 1.0).astype(np.float32)


def _check_same(s1: ViewSpec, s2: ViewSpec, names: Sequence[str], what: str) -> None:
    for name in names:
        if getattr(s1, name) != getattr(s2, name):
            raise ValueError(
                f"{what} needs the first two views to share {name}: {getattr(s1, name)} vs {getattr(s2, name)}"
            )


def select(params: Params, idx: np.ndarray) -> Params:
    """Rows `idx` of every array (used to drop samples an executor could not decode)."""
    return {k: v[idx] for k, v in params.items()}


def valid_samples(
    encoded: Sequence[bytes], views: Sequence[Params], sizes: Sequence[tuple[int, int]] | None = None
) -> np.ndarray:
    """Cheap pre-check shared by executors: header readable and every view's crop inside the
    image. `sizes`: the (h, w) sample_views already read (UNREADABLE where it could not), so the headers are
    not parsed twice; None reads them here. Returns a bool mask over samples."""
    if sizes is None:
        sizes = header_sizes(encoded)
    hw = np.asarray(sizes, np.int64).reshape(len(encoded), 2)
    # UNREADABLE is also the size of a real 1x1 image: only those headers are read again
    readable = np.array(
        [tuple(s) != UNREADABLE or try_image_size(e) is not None for s, e in zip(sizes, encoded)], dtype=bool
    )
    ok = readable.copy()
    for p in views:
        y, x, ch, cw = np.asarray(p["crop"], np.int64).reshape(-1, 4).T
        ok &= (y >= 0) & (x >= 0) & (ch > 0) & (cw > 0) & (y + ch <= hw[:, 0]) & (x + cw <= hw[:, 1])
    return ok


def blur_window(sigma: float) -> int:
    """Gaussian kernel size both executors use: covers +-3 sigma, always odd."""
    return 2 * math.ceil(3.0 * float(sigma)) + 1


def eval_geometry(h: int, w: int, size: int, crop_fraction: float = 0.875) -> tuple[int, int, int, int]:
    """Deterministic eval view: resize the short side to round(size / crop_fraction) (256 for 224),
    then a central size x size crop. Returns (resized_h, resized_w, top, left); computed once here
    so both executors agree to the pixel. Small outputs (<= 64 px: CIFAR, Spirograph) use the whole
    image, as their evaluation protocols do."""
    if size <= 64:
        crop_fraction = 1.0
    short = max(size, int(round(size / crop_fraction)))
    if h <= w:
        rh, rw = short, max(short, int(short * w / h))
    else:
        rh, rw = max(short, int(short * h / w)), short
    return rh, rw, int(round((rh - size) / 2)), int(round((rw - size) / 2))
