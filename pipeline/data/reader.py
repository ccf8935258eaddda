"""Reading shards: Ray Data for the training stream, a plain tar reader for the small eval splits."""
from __future__ import annotations

import json
import tarfile
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from pipeline.data.shards import read_manifest

IMAGE_EXTS = ("jpg", "jpeg", "png", "webp", "bmp", "ppm")


def image_key(columns) -> str:
    """The image member's extension among a sample's (or batch's) columns."""
    for ext in IMAGE_EXTS:
        if ext in columns:
            return ext
    raise KeyError(f"no image member among {sorted(columns)}")


def train_dataset(root: str, shuffle_files: bool = True, seed: int | None = None):
    """Encoded samples as a Ray Dataset: `decoder=None` keeps bytes untouched for the augmentation stage."""
    import ray.data

    _, uris = read_manifest(root)
    shuffle = ray.data.FileShuffleConfig(seed=seed) if shuffle_files else None
    paths, filesystem = _paths_and_filesystem(uris)
    return ray.data.read_webdataset(paths, decoder=None, shuffle=shuffle, filesystem=filesystem)


def _paths_and_filesystem(uris: list[str]):
    """Plain URIs go to Ray as they are; URIs carrying options (s3://b/p?endpoint_override=...) become a
    pyarrow filesystem plus bare paths, since Ray does not read options from the path."""
    if "?" not in uris[0]:
        return uris, None
    import pyarrow.fs as pafs

    filesystem, _ = pafs.FileSystem.from_uri(uris[0])
    return [pafs.FileSystem.from_uri(u)[1] for u in uris], filesystem


def _open(uri: str):
    import pyarrow.fs as pafs

    if "://" in uri:
        fs, path = pafs.FileSystem.from_uri(uri)
        return fs.open_input_stream(path)
    return open(uri, "rb")


def iter_samples(uris: list[str]) -> Iterator[dict]:
    """Samples of WebDataset tars in order: {"__key__": str, ext: bytes, ...} (members adjacent)."""
    for uri in uris:
        with _open(uri) as f, tarfile.open(fileobj=f, mode="r|*") as tar:
            sample: dict = {}
            for member in tar:
                if not member.isfile():
                    continue
                base = member.name.rsplit("/", 1)[-1]
                prefix = member.name[: len(member.name) - len(base)]
                key, _, ext = base.partition(".")
                key = prefix + key
                if sample and sample["__key__"] != key:
                    yield sample
                    sample = {}
                sample["__key__"] = key
                sample[ext] = tar.extractfile(member).read()
            if sample:
                yield sample


@dataclass
class Split:
    """A small eval split held in memory: encoded images plus labels (int) or regression targets (float)."""

    encoded: list[bytes]
    y: np.ndarray
    names: list[str]  # class names or target names


def targets_of(sample: dict, task: str, targets: list[str] | None) -> np.ndarray | int:
    if task == "classification":
        return int(sample["cls"])
    params = json.loads(sample["json"])
    return np.array([params[t] for t in targets], dtype=np.float32)


def load_split(root: str, task: str, targets: list[str] | None = None, limit: int | None = None,
               stride: bool = True) -> Split:
    """Read up to `limit` samples. With `stride`, take every k-th sample so a limited split still spans
    every shard (and so every class of an ordered ImageFolder)."""
    manifest, uris = read_manifest(root)
    n = manifest["num_samples"]
    step = max(1, n // limit) if (limit and stride) else 1
    encoded, ys = [], []
    for i, s in enumerate(iter_samples(uris)):
        if i % step:
            continue
        encoded.append(s[image_key(s)])
        ys.append(targets_of(s, task, targets))
        if limit and len(encoded) >= limit:
            break
    return make_split(encoded, ys, task, targets, manifest)


def make_split(encoded: list[bytes], ys: list, task: str, targets: list[str] | None, manifest: dict) -> Split:
    """A Split from images and their labels (int classes) or regression targets, named from the manifest."""
    names = list(targets or []) if task == "regression" else list(manifest.get("class_names") or [])
    y = np.asarray(ys, dtype=np.int64 if task == "classification" else np.float32)
    return Split(encoded, y, names)

