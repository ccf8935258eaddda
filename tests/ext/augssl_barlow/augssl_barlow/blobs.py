"""A generated dataset from a package: grey images of one to three Gaussian blobs, the class their number
(`data=blobs`). Like Spirograph, its shards are made on first use into the managed data folder, and its manifests
record the `data.generate` settings, so that data made with other settings is refused."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from pipeline.data.generated import Generate, GeneratedDataset
from pipeline.data.shards import png_bytes, write_split
from pipeline.fields import Num

CLASSES = ["one", "two", "three"]


def blob_image(rng: np.random.Generator, size: int, count: int, sigma: float) -> np.ndarray:
    """uint8 [size, size, 3]: `count` Gaussian blobs of width sigma x size at uniform centres, summed, clipped."""
    yy, xx = np.mgrid[0:size, 0:size]
    img = np.zeros((size, size))
    for cy, cx in rng.uniform(0, size, (count, 2)):
        img += np.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / (2 * (sigma * size) ** 2))
    grey = (np.clip(img, 0, 1) * 255).round().astype(np.uint8)
    return np.repeat(grey[..., None], 3, axis=2)


def iter_blobs(n: int, seed: int, size: int, sigma: float, start: int = 0) -> Iterator[dict]:
    """Sample i of a split: its own generator (seed, i), so any `start` is drawn without the ones before it."""
    for i in range(start, n):
        count = 1 + i % 3
        pixels = blob_image(np.random.default_rng([seed, i]), size, count, sigma)
        yield {"__key__": f"{i:08d}", "png": png_bytes(pixels), "cls": count - 1}


class Blobs(GeneratedDataset):
    class Settings(Generate):  # data.generate: the shared keys and this dataset's own
        sigma: Num(gt=0)  # a blob's width, a fraction of the image's side

    def make_splits(self, root: Path, generate: dict, progress: bool = True) -> dict[str, dict]:
        g = generate
        shared = {k: v for k, v in g.items() if k not in ("n_train", "n_val")}
        manifests = {}
        for split, n, seed in (("train", g["n_train"], g["seed"]), ("val", g["n_val"], g["seed"] + 1)):

            def samples(start: int, n: int = n, seed: int = seed) -> Iterator[dict]:
                return iter_blobs(n, seed, g["size"], g["sigma"], start)

            manifests[split] = write_split(
                samples,
                Path(root) / split,
                maxcount=g["maxcount"],
                class_names=CLASSES,
                source={"kind": "blobs", "split": split, "seed": seed},
                total=n,
                progress=progress,
                extra={"generate": {f"n_{split}": n, **shared}},
            )
        return manifests
