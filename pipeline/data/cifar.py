"""CIFAR-10/100 python batches as shards: the source of samples and the whole split."""

from __future__ import annotations

import os
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.data.shards import Sample, png_bytes, write_split


def _find_cifar(root: Path) -> tuple[Path, str]:
    for folder in (root, root / "cifar-10-batches-py", root / "cifar-100-python"):
        if (folder / "batches.meta").is_file():
            return folder, "cifar10"
        if (folder / "meta").is_file() and (folder / "train").is_file():
            return folder, "cifar100"
    raise FileNotFoundError(f"no CIFAR-10/100 python batches in {root}")


def _unpickle(path: Path) -> dict[str, Any]:
    with open(path, "rb") as f:
        raw = pickle.load(f, encoding="bytes")
    # The official pickles come from Python 2 and have bytes keys.
    return {k.decode() if isinstance(k, bytes) else k: v for k, v in raw.items()}


def _names(values: list) -> list[str]:
    return [v.decode() if isinstance(v, bytes) else v for v in values]


def cifar_split_files(root: str | os.PathLike, split: str) -> tuple[list[Path], list[str], str]:
    """(batch files, class names, label field) for split "train" or "test" ("val" = "test")."""
    if split not in ("train", "test", "val"):
        raise ValueError(f"CIFAR split must be train, test or val, got {split!r}")
    folder, kind = _find_cifar(Path(root))
    if kind == "cifar10":
        files = [folder / f"data_batch_{i}" for i in range(1, 6)] if split == "train" else [folder / "test_batch"]
        return files, _names(_unpickle(folder / "batches.meta")["label_names"]), "labels"
    files = [folder / ("train" if split == "train" else "test")]
    return files, _names(_unpickle(folder / "meta")["fine_label_names"]), "fine_labels"


def iter_cifar(root: str | os.PathLike, split: str, *, start: int = 0) -> Iterator[Sample]:
    """Samples {"__key__", "png", "cls"} from CIFAR-10/100 python batches (lossless PNG)."""
    files, _, label_field = cifar_split_files(root, split)
    offset = 0
    for path in files:
        batch = _unpickle(path)
        data = np.asarray(batch["data"], dtype=np.uint8)
        labels = batch[label_field]
        # Rows are R, G, B planes of 32x32 each.
        images = data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
        for i in range(max(start - offset, 0), len(images)):
            yield {"__key__": f"{offset + i:06d}", "png": png_bytes(images[i]), "cls": int(labels[i])}
        offset += len(images)


def make_cifar_split(
    input_root: str | os.PathLike,
    out_root: str | os.PathLike,
    split: str = "train",
    *,
    maxcount: int = 1000,
    progress: bool = True,
) -> dict:
    """Shard a CIFAR-10/100 python folder's train or test (alias val) split into out_root/<split>."""
    files, class_names, _ = cifar_split_files(input_root, split)
    return write_split(
        lambda start: iter_cifar(input_root, split, start=start),
        Path(out_root) / split,
        maxcount=maxcount,
        class_names=class_names,
        source={"kind": "cifar", "root": str(files[0].parent.resolve()), "split": split},
        progress=progress,
    )
