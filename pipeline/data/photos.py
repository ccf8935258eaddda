"""Photos: the second embedded dataset, where image recipes can learn (data=photos).

Spirograph's targets include colour and scale, so crops and colour jitter destroy part of what its probe asks
for; here the class is the photograph a crop comes from, so the invariances the papers' recipes teach (scale,
position, colour) are the ones the task rewards. Made from the photographs scikit-image ships inside its
package (nothing is downloaded), generated on first use like Spirograph.

Each sample is a square crop of one photograph (class = the photograph; classes balanced), its side drawn
uniformly between `SCALES` of the photograph's shorter side, placed uniformly, mirrored with p = 0.5, resized to
`size` px. Train crops come from the left 70 % of each photograph and validation crops from the right 25 %, so
no validation pixel was seen in training. Near-flat crops (std < 8/255, e.g. the black border of `retina`) are
drawn again. Sample i of a split depends only on (seed, split, i), so an interrupted write resumes anywhere.
"""

from __future__ import annotations

import io
from functools import lru_cache
from pathlib import Path
from typing import Iterator

import numpy as np
from PIL import Image

from pipeline.data.generated import GeneratedDataset
from pipeline.data.shards import write_split

VERSION = 1  # bump when the sampling changes: manifests of older data are then refused
SCALES = (0.1, 0.4)  # crop side, as a fraction of the photograph's shorter side
REGIONS = {"train": (0.0, 0.70), "val": (0.75, 1.0)}  # horizontal extent of each split's crops
MIN_STD = 8.0  # near-flat crops are drawn again (grey levels, 0-255)
VAL_SEED_OFFSET = 10**6

# class name -> skimage.data loader; colour photographs, then grey textures and scenes (as RGB)
_LOADERS = (
    "astronaut",
    "coffee",
    "chelsea",
    "rocket",
    "hubble_deep_field",
    "immunohistochemistry",
    "retina",
    "motorcycle",
    "brick",
    "grass",
    "gravel",
    "camera",
    "coins",
    "moon",
)
CLASS_NAMES = list(_LOADERS)


@lru_cache(maxsize=1)
def photographs() -> tuple[np.ndarray, ...]:
    """The photographs as uint8 RGB arrays [H, W, 3], in CLASS_NAMES order (loaded once per process)."""
    import skimage.data  # heavy: loaded when photographs are made, not where a manifest's VERSION is read

    out = []
    for name in _LOADERS:
        img = skimage.data.stereo_motorcycle()[0] if name == "motorcycle" else getattr(skimage.data, name)()
        img = np.asarray(img)
        if img.ndim == 2:
            img = np.repeat(img[:, :, None], 3, axis=2)
        if img.dtype != np.uint8 or img.shape[2] != 3:
            raise ValueError(f"skimage.data.{name}: expected uint8 RGB or grey, got {img.dtype} {img.shape}")
        out.append(img)
    return tuple(out)


def crop(photo: np.ndarray, split: str, size: int, rng: np.random.Generator) -> np.ndarray:
    """One sample of `split` from `photo`: uint8 [size, size, 3]."""
    h, w = photo.shape[:2]
    lo, hi = REGIONS[split]
    x0, x1 = int(lo * w), int(hi * w)
    for _ in range(100):
        side = int(round(rng.uniform(*SCALES) * min(h, w)))
        side = max(8, min(side, x1 - x0, h))
        x = int(rng.integers(x0, x1 - side + 1))
        y = int(rng.integers(0, h - side + 1))
        patch = photo[y : y + side, x : x + side]
        if patch.std() >= MIN_STD:
            break
    img = Image.fromarray(patch).resize((size, size), Image.Resampling.BICUBIC, reducing_gap=2.0)
    if rng.random() < 0.5:
        img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return np.asarray(img)


def _png(pixels: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG", compress_level=1)
    return buf.getvalue()


def iter_photos(n: int, seed: int, split: str, size: int = 32, *, start: int = 0) -> Iterator[dict]:
    """Samples {"__key__", "png", "cls"} start..n-1 of a split; sample i's class is i mod the number of classes."""
    photos = photographs()
    for i in range(start, n):
        rng = np.random.default_rng([seed, i])
        label = i % len(photos)
        yield {"__key__": f"{i:08d}", "png": _png(crop(photos[label], split, size, rng)), "cls": label}


def make_photo_splits(
    out_root,
    n_train: int = 5000,
    n_val: int = 1000,
    seed: int = 0,
    size: int = 32,
    maxcount: int = 1000,
    *,
    progress: bool = True,
) -> dict[str, dict]:
    """Write out_root/train and out_root/val as shards with manifests (class names, and the `generate` settings
    that made each split, which pipeline.train.prepare checks against data.generate); returns the manifests."""
    manifests = {}
    for split, n, split_seed in (("train", n_train, seed), ("val", n_val, seed + VAL_SEED_OFFSET)):
        made = {f"n_{split}": n, "seed": seed, "size": size, "maxcount": maxcount}

        def samples(start: int, n: int = n, s: int = split_seed, sp: str = split) -> Iterator[dict]:
            return iter_photos(n, s, sp, size, start=start)

        manifests[split] = write_split(
            samples,
            Path(out_root) / split,
            maxcount=maxcount,
            class_names=CLASS_NAMES,
            source={"kind": "photos", "version": VERSION, "split": split, "n": n, "seed": split_seed, "size": size},
            total=n,
            progress=progress,
            extra={"generate": made},
        )
    return manifests


class Photos(GeneratedDataset):
    """Crops of scikit-image's photographs, a class per photograph (`data=photos`)."""

    name = "photos"

    def make_splits(self, root: Path, generate: dict, progress: bool = True) -> dict[str, dict]:
        return make_photo_splits(root, **generate, progress=progress)

    def generated_with(self, manifest: dict, split: str) -> dict | None:
        src = manifest.get("source")
        if not isinstance(src, dict) or src.get("kind") != "photos" or src.get("version") != VERSION:
            return None
        return super().generated_with(manifest, split)
