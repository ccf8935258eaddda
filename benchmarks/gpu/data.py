"""Generated 500x375 JPEGs (scikit-image's sample photographs, else photo-like images) and an ImageFolder of them
sharded with jobs/make_shards.py: the executor's input, CoCor's labelled split, the end-to-end run's data."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from . import ROOT

SRC_W, SRC_H = 500, 375


def _photo_like(seed: int, w: int = SRC_W, h: int = SRC_H) -> np.ndarray:
    """Smooth colour waves, hard-edged rectangles and a little grain: decodes like a photo, not like a flat image."""
    r = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w] / max(h, w)
    img = np.zeros((h, w, 3))
    for c in range(3):
        for _ in range(3):
            fy, fx, ph = r.uniform(0.5, 8), r.uniform(0.5, 8), r.uniform(0, 6)
            img[..., c] += np.sin(2 * np.pi * (fy * yy + fx * xx) + ph)
    img = (img - img.min()) / (img.max() - img.min()) * 255
    for _ in range(6):
        y0, x0 = r.integers(0, h - 20), r.integers(0, w - 20)
        img[y0 : y0 + r.integers(10, 120), x0 : x0 + r.integers(10, 160)] = r.integers(0, 256, 3)
    img += r.normal(0, 6, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


def _jpeg(seed: int) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(_photo_like(seed)).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def _photo_chunk(job: tuple[int, int]) -> list[bytes]:
    """`n` JPEGs of scikit-image's photographs drawn with `seed` (benchmarks/sample_images.py)."""
    from sample_images import sample_jpegs

    n, seed = job
    return sample_jpegs(n, seed=seed)


def make_jpegs(n: int, seed: int = 0) -> tuple[list[bytes], str]:
    """n distinct 500x375 JPEGs (quality 90): scikit-image's sample photographs when installed (the bench extra,
    benchmarks/sample_images.py), else generated photo-like images. Many are made in worker processes."""
    try:
        import sample_images  # noqa: F401
        import skimage.data  # noqa: F401

        make, jobs, source = (
            _photo_chunk,
            [(min(64, n - i), seed * 1_000_003 + i) for i in range(0, n, 64)],
            "scikit-image sample photographs (benchmarks/sample_images.py)",
        )
    except ImportError:
        make, jobs, source = _jpeg, [seed * 1_000_003 + i for i in range(n)], "generated photo-like images"
    if n >= 256 and (os.cpu_count() or 1) > 2:
        with ProcessPoolExecutor(min(16, os.cpu_count() or 1)) as pool:
            made = list(pool.map(make, jobs))
    else:
        made = [make(j) for j in jobs]
    flat = [x for m in made for x in m] if make is _photo_chunk else made
    return flat, source


def make_imagefolder_shards(root: Path, n_train: int, n_val: int, classes: int) -> Path:
    """An ImageFolder tree of 500x375 JPEGs (train/ and val/, `classes` class folders) sharded with
    jobs/make_shards.py into root/shards/{train,val}; reused when already there. Returns the shards folder."""
    shards = root / "shards"
    if (shards / "train" / "manifest.json").exists() and (shards / "val" / "manifest.json").exists():
        return shards
    jpegs, _ = make_jpegs(n_train + n_val, seed=7)
    for split, part in (("train", jpegs[:n_train]), ("val", jpegs[n_train:])):
        for i, data in enumerate(part):
            d = root / "imagefolder" / split / f"class_{i % classes:02d}"
            d.mkdir(parents=True, exist_ok=True)
            (d / f"{i:06d}.jpg").write_bytes(data)
        cmd = [
            sys.executable,
            str(ROOT / "jobs" / "make_shards.py"),
            "source=imagefolder",
            f"input={root / 'imagefolder'}",
            f"output={shards}",
            f"split={split}",
        ]
        done = subprocess.run(cmd, cwd=root, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"make_shards failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    return shards
