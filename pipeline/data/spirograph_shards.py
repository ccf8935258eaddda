"""Spirograph as shards: the generator's samples (pipeline.data.spirograph renders them), its two splits, and the
dataset `data=spirograph` generates on first use (InvCLR App. E)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from pipeline.data.formats import SPIROGRAPH_CHUNK, SPIROGRAPH_VAL_SEED_OFFSET
from pipeline.data.generated import GeneratedDataset
from pipeline.data.shards import Sample, png_bytes, write_split


def iter_spirograph(
    n: int, seed: int, size: int = 32, *, start: int = 0, chunk: int = SPIROGRAPH_CHUNK
) -> Iterator[Sample]:
    """Samples {"__key__", "png", "json"} of n Spirograph images with their ten parameters.

    Chunk c (samples c*chunk ...) uses torch.Generator().manual_seed(seed + c), so any chunk, and
    hence any `start`, can be produced without rendering the ones before it.
    """
    # torch loads when samples are drawn, not when the dataset is named: the schema reads the Settings first
    import torch

    from pipeline.data import spirograph

    for c in range(start // chunk, (n + chunk - 1) // chunk):
        first = c * chunk
        params = spirograph.sample_params(min(chunk, n - first), torch.Generator().manual_seed(seed + c))
        images = spirograph.render_flat(params, size=size)
        pixels = (images * 255).round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).numpy()
        for j in range(max(start - first, 0), len(pixels)):
            values = {name: float(params[name][j]) for name in spirograph.PARAM_NAMES}
            yield {"__key__": f"{first + j:08d}", "png": png_bytes(pixels[j]), "json": values}


def make_spirograph_splits(
    out_root: str | os.PathLike,
    n_train: int = 5000,
    n_val: int = 1000,
    seed: int = 0,
    size: int = 32,
    maxcount: int = 1000,
    *,
    progress: bool = True,
) -> dict[str, dict]:
    """Write out_root/train (n_train, seed) and out_root/val (n_val, seed + 10**6); returns manifests.

    Each manifest records, besides its `source`, the `data.generate` settings that made the split
    (`generate`: n_train or n_val, seed, size, maxcount), which Spirograph.generated_with reads
    back."""
    manifests = {}
    for split, n, split_seed in (("train", n_train, seed), ("val", n_val, seed + SPIROGRAPH_VAL_SEED_OFFSET)):
        made = {f"n_{split}": n, "seed": seed, "size": size, "maxcount": maxcount}

        def samples(start: int, n: int = n, s: int = split_seed) -> Iterator[Sample]:
            return iter_spirograph(n, s, size, start=start)

        manifests[split] = write_split(
            samples,
            Path(out_root) / split,
            maxcount=maxcount,
            class_names=None,
            source={"kind": "spirograph", "n": n, "seed": split_seed, "size": size, "chunk": SPIROGRAPH_CHUNK},
            total=n,
            progress=progress,
            extra={"generate": made},
        )
    return manifests


class Spirograph(GeneratedDataset):
    """Spirograph images with their ten generating parameters (InvCLR App. E); the targets are four of them."""

    name = "spirograph"

    def make_splits(self, root: Path, generate: dict, progress: bool = True) -> dict[str, dict]:
        return make_spirograph_splits(root, **generate, progress=progress)

    def generated_with(self, manifest: dict, split: str) -> dict | None:
        """Manifests written before the `generate` record hold the settings in `source`. None for data drawn in
        other chunks (another generator) or that is no Spirograph data."""
        src = manifest.get("source")
        if not isinstance(src, dict) or src.get("kind") != "spirograph" or src.get("chunk") != SPIROGRAPH_CHUNK:
            return None
        if isinstance(manifest.get("generate"), dict):
            return manifest["generate"]
        offset = SPIROGRAPH_VAL_SEED_OFFSET if split == "val" else 0
        return {
            f"n_{split}": src.get("n"),
            "seed": src.get("seed", 0) - offset,
            "size": src.get("size"),
            "maxcount": manifest.get("maxcount"),
        }
