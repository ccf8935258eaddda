"""ImageNet-like JPEGs for benchmarks, made in memory from scikit-image's bundled sample photographs.

Each image is one of the photographs below, rescaled to cover WIDTH x HEIGHT (500 x 375, a typical
ImageNet training image) with a random extra zoom, randomly cropped and mirrored, and re-encoded as a
baseline JPEG (quality 90, 4:2:0 chroma subsampling, PIL's defaults besides quality). Real content
matters: JPEG decode time and file size depend on it, and flat synthetic images would flatter decoders.

Needs scikit-image (`pip install -e '.[bench]'`); only the photographs shipped inside the package are
used, so nothing is downloaded.
"""

from __future__ import annotations

import io
from functools import lru_cache

import numpy as np
from PIL import Image

WIDTH, HEIGHT = 500, 375
QUALITY = 90


def _motorcycle(side: int):
    import skimage.data

    return lambda: skimage.data.stereo_motorcycle()[side]


@lru_cache(maxsize=1)
def source_photos() -> tuple[tuple[str, Image.Image], ...]:
    """(name, RGB PIL image) of every colour photograph used, loaded once."""
    import skimage.data

    loaders = {
        "astronaut": skimage.data.astronaut,
        "coffee": skimage.data.coffee,
        "chelsea": skimage.data.chelsea,
        "rocket": skimage.data.rocket,
        "motorcycle_left": _motorcycle(0),
        "motorcycle_right": _motorcycle(1),
        "hubble_deep_field": skimage.data.hubble_deep_field,
        "immunohistochemistry": skimage.data.immunohistochemistry,
        "retina": skimage.data.retina,
    }
    photos = []
    for name, load in loaders.items():
        arr = np.asarray(load())
        if arr.ndim != 3 or arr.shape[2] != 3 or arr.dtype != np.uint8:
            raise ValueError(f"skimage.data.{name}: expected uint8 RGB, got {arr.dtype} {arr.shape}")
        photos.append((name, Image.fromarray(arr)))
    return tuple(photos)


def _one(photo: Image.Image, rng: np.random.Generator, width: int, height: int, quality: int) -> bytes:
    w, h = photo.size
    zoom = max(width / w, height / h) * rng.uniform(1.0, 1.4)  # cover the target, then some
    rw, rh = max(width, round(w * zoom)), max(height, round(h * zoom))
    img = photo.resize((rw, rh), Image.Resampling.BICUBIC)
    x, y = int(rng.integers(0, rw - width + 1)), int(rng.integers(0, rh - height + 1))
    img = img.crop((x, y, x + width, y + height))
    if rng.random() < 0.5:
        img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


def sample_jpegs(
    n: int, seed: int = 0, width: int = WIDTH, height: int = HEIGHT, quality: int = QUALITY
) -> list[bytes]:
    """n distinct JPEG files (bytes), cycling through the source photographs."""
    photos = source_photos()
    rng = np.random.default_rng(seed)
    return [_one(photos[i % len(photos)][1], rng, width, height, quality) for i in range(n)]


if __name__ == "__main__":
    jpegs = sample_jpegs(len(source_photos()))
    for (name, photo), data in zip(source_photos(), jpegs):
        print(
            f"{name:22s} source {photo.size[0]}x{photo.size[1]}  ->  {WIDTH}x{HEIGHT} JPEG q{QUALITY}: "
            f"{len(data) / 1024:.0f} KiB"
        )
