"""ImageFolder trees (one folder per class) as shards: the source of samples and the whole split."""

from __future__ import annotations

import io
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from PIL import Image

from pipeline.data.formats import FILE_EXT
from pipeline.data.shards import Sample, SkipStats, write_split


def _sanitize(stem: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", stem)


def imagefolder_classes(root: str | os.PathLike[str]) -> list[str]:
    """Sorted class folder names; the position in this list is the class index."""
    return sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))


def _image_files(root: Path, classes: list[str], seed: int | None = None) -> list[tuple[Path, int]]:
    """(file, class index) in sorted (class, file name) order, or in that order permuted with `seed`."""
    files = []
    for index, name in enumerate(classes):
        for entry in sorted(os.scandir(root / name), key=lambda e: e.name):
            if entry.is_file() and Path(entry.name).suffix.lower() in FILE_EXT:
                files.append((Path(entry.path), index))
    if seed is not None:
        files = [files[i] for i in np.random.default_rng(seed).permutation(len(files))]
    return files


def _is_valid_image(data: bytes) -> bool:
    try:
        with Image.open(io.BytesIO(data)) as img:
            img.verify()
    except Exception:  # PIL raises many types (OSError, SyntaxError, ValueError...) for bad files
        return False
    return True


def iter_imagefolder(
    root: str | os.PathLike, *, start: int = 0, stats: SkipStats | None = None, seed: int | None = None
) -> Iterator[Sample]:
    """Samples {"__key__", "<ext>": original bytes, "cls": int} from a class-per-folder tree.

    Files are visited in sorted (class, file name) order, permuted with `seed` unless it is None (so
    consecutive samples, and hence the samples of a shard, mix the classes); unreadable images are skipped
    and counted in `stats`. `start` drops the first valid samples (files are still verified so counts stay
    exact).
    """
    root = Path(root)
    index = 0
    for path, cls in _image_files(root, imagefolder_classes(root), seed):
        data = path.read_bytes()
        if not _is_valid_image(data):
            if stats is not None:
                stats.add(str(path))
            continue
        if index >= start:
            ext = FILE_EXT[path.suffix.lower()]
            yield {"__key__": f"{index:08d}_{_sanitize(path.stem)}", ext: data, "cls": cls}
        index += 1


def make_imagefolder_split(
    input_root: str | os.PathLike,
    out_root: str | os.PathLike,
    split: str = "train",
    *,
    maxcount: int = 1000,
    progress: bool = True,
    seed: int | None = 0,
) -> dict:
    """Shard `input_root/<split>` (or `input_root` itself if it has no such folder) into out_root/<split>.

    The samples are shuffled across the shards with `seed` (None: class order, each shard one or two
    classes); the seed is part of the manifest's `source`, so another seed rewrites the split."""
    root = Path(input_root)
    if (root / split).is_dir():
        root = root / split
    root = root.resolve()
    classes = imagefolder_classes(root)
    stats = SkipStats()
    manifest = write_split(
        lambda start: iter_imagefolder(root, start=start, stats=stats, seed=seed),
        Path(out_root) / split,
        maxcount=maxcount,
        class_names=classes,
        source={"kind": "imagefolder", "root": str(root), "seed": seed},
        total=len(_image_files(root, classes)),
        progress=progress,
        stats=stats,
    )
    if stats.skipped and progress:
        print(f"[shards] skipped {stats.skipped} unreadable files: {stats.files[:10]}", file=sys.stderr)
    return manifest
