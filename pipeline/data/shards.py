"""WebDataset shard writing: atomic, resumable shard folders with a manifest.

A split folder holds `shard-000000.tar`, `shard-000001.tar`, ... and, once finished, `manifest.json`.
A sample is a dict {"__key__": str, "<ext>": bytes | str | int | dict, ...}; its members are stored
adjacently as `<key>.<ext>`, sorted by extension, which is the layout `webdataset` groups by.
The sources that feed it are pipeline.data.imagefolder, cifar, spirograph_shards and photos; pipeline.data.manifest
reads a finished split back and checks its shards.
"""

from __future__ import annotations

import io
import itertools
import json
import os
import re
import sys
import tarfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from pipeline.data.formats import IMAGE_EXTS

MANIFEST = "manifest.json"
# Records which source/maxcount the shards of an unfinished run belong to, so a resume never
# mixes shards of two different datasets.
PARTIAL_MARKER = "_partial.json"
SHARD_RE = re.compile(r"^shard-(\d{6})\.tar$")

Sample = dict[str, Any]
# A source is either an iterable of samples or a function start -> iterable beginning at sample `start`
# (lets a resume skip finished shards without producing their samples again).
SampleSource = Iterable[Sample] | Callable[[int], Iterable[Sample]]


def shard_name(index: int) -> str:
    return f"shard-{index:06d}.tar"


def _encode(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, bool):  # bool is an int subclass; "True" is not a class label
        raise TypeError("bool sample values are not supported")
    if isinstance(value, int):
        return str(value).encode("ascii")
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True).encode("utf-8")
    raise TypeError(f"cannot encode sample value of type {type(value).__name__}")


def _check_key(key: Any) -> str:
    if not isinstance(key, str) or not key or "." in key or "/" in key:
        raise ValueError(f"sample __key__ must be a non-empty string without '.' or '/': {key!r}")
    return key


class ShardWriter:
    """Writes samples into `shard-{i:06d}.tar` files of at most `maxcount` samples each.

    Each shard is written as `<name>.tmp`, fsynced and renamed when full (or on close()), so a file
    under a final name is always complete. Leaving the `with` block by an exception drops the open
    temporary shard.
    """

    def __init__(self, out_dir: str | os.PathLike, maxcount: int, start_index: int = 0):
        if maxcount < 1:
            raise ValueError(f"maxcount must be >= 1, got {maxcount}")
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.maxcount = maxcount
        self.index = start_index
        self.shards: list[str] = []
        self.count = 0
        self._file: io.BufferedWriter | None = None
        self._tar: tarfile.TarFile | None = None
        self._in_shard = 0

    def _open(self) -> None:
        self._file = open(self.out_dir / (shard_name(self.index) + ".tmp"), "wb")
        self._tar = tarfile.open(fileobj=self._file, mode="w", format=tarfile.PAX_FORMAT)
        self._in_shard = 0

    def _finish(self) -> None:
        assert self._tar is not None and self._file is not None
        self._tar.close()
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        name = shard_name(self.index)
        os.replace(self.out_dir / (name + ".tmp"), self.out_dir / name)
        self.shards.append(name)
        self.index += 1
        self._tar = self._file = None

    def write(self, sample: Sample) -> None:
        key = _check_key(sample.get("__key__"))
        # Encode everything first so a bad value cannot leave half a sample in the shard.
        members = [(ext, _encode(sample[ext])) for ext in sorted(k for k in sample if not k.startswith("__"))]
        if self._tar is None:
            self._open()
        assert self._tar is not None
        for ext, data in members:
            info = tarfile.TarInfo(f"{key}.{ext}")
            info.size = len(data)
            info.mode = 0o644
            info.mtime = 0  # fixed, so reruns produce byte-identical shards
            self._tar.addfile(info, io.BytesIO(data))
        self._in_shard += 1
        self.count += 1
        if self._in_shard >= self.maxcount:
            self._finish()

    def close(self) -> None:
        """Finalise the last, partly filled shard."""
        if self._tar is not None:
            self._finish()

    def abort(self) -> None:
        """Drop the open temporary shard; finished shards stay."""
        if self._file is not None:
            self._file.close()
            (self.out_dir / (shard_name(self.index) + ".tmp")).unlink(missing_ok=True)
            self._tar = self._file = None

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


@dataclass
class SkipStats:
    """Files a source could not read; written into the manifest as "skipped"."""

    skipped: int = 0
    files: list[str] = field(default_factory=list)

    def add(self, path: str) -> None:
        self.skipped += 1
        self.files.append(path)


def _write_json_atomic(path: Path, obj: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=True))
    os.replace(tmp, path)


def _load_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def _shard_contents(path: Path) -> tuple[int, set[str]] | None:
    """(number of samples, extensions) of a shard, or None if it is unreadable."""
    try:
        with tarfile.open(path, "r") as tar:
            keys, exts = set(), set()
            for member in tar:
                key, _, ext = member.name.partition(".")
                keys.add(key)
                exts.add(ext)
    except (tarfile.TarError, OSError):
        return None
    return len(keys), exts


def _reusable_shards(out: Path, maxcount: int) -> tuple[list[str], set[str]]:
    """The contiguous run of full shards from index 0 (a short shard is cheaper to redo than to trust)."""
    names: list[str] = []
    exts: set[str] = set()
    while (out / shard_name(len(names))).is_file():
        contents = _shard_contents(out / shard_name(len(names)))
        if contents is None or contents[0] != maxcount:
            break
        exts |= contents[1]
        names.append(shard_name(len(names)))
    return names, exts


def _remove_stale(out: Path, keep: list[str]) -> None:
    for path in out.iterdir():
        stale_shard = SHARD_RE.match(path.name) and path.name not in keep
        if stale_shard or path.name.endswith(".tar.tmp") or path.name == MANIFEST:
            path.unlink()


def _canonical(source: Any) -> Any:
    # Compare sources as they look after a JSON round trip (tuples become lists, etc.).
    return json.loads(json.dumps(source, sort_keys=True))


class _Progress:
    def __init__(self, label: str, total: int | None, enabled: bool, every: float = 5.0):
        self.label, self.total, self.enabled, self.every = label, total, enabled, every
        self.last = time.monotonic()

    def update(self, done: int, force: bool = False) -> None:
        now = time.monotonic()
        if self.enabled and (force or now - self.last >= self.every):
            of = f"/{self.total}" if self.total is not None else ""
            print(f"[shards] {self.label}: {done}{of} samples", file=sys.stderr, flush=True)
            self.last = now


def write_split(
    samples: SampleSource,
    out_dir: str | os.PathLike,
    *,
    maxcount: int,
    class_names: list[str] | None,
    source: str | dict,
    total: int | None = None,
    progress: bool = True,
    stats: SkipStats | None = None,
    extra: dict | None = None,
) -> dict:
    """Write one split as shards plus `manifest.json`; returns the manifest.

    Resumable: a complete manifest for the same source and maxcount is returned as is; after an
    interrupted run with the same source, the full finished shards are kept and their samples skipped
    (cheaply when `samples` is a function start -> iterable). `samples` must be deterministic.
    `extra`: more manifest fields (how the data was made, in the words of the config that made it); they
    must follow from `source`, which alone decides whether existing shards are this split's.
    The manifest records each shard's size in bytes (`shard_bytes`), so a truncated shard is found cheaply.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    source = _canonical(source)
    identity = {"source": source, "maxcount": maxcount}

    manifest = _load_json(out / MANIFEST)
    if (
        isinstance(manifest, dict)
        and manifest.get("complete") is True
        and {"source": manifest.get("source"), "maxcount": manifest.get("maxcount")} == identity
    ):
        return manifest

    done: list[str] = []
    exts: set[str] = set()
    if _load_json(out / PARTIAL_MARKER) == identity:
        done, exts = _reusable_shards(out, maxcount)
    _remove_stale(out, keep=done)
    _write_json_atomic(out / PARTIAL_MARKER, identity)

    skip = len(done) * maxcount
    iterator = samples(skip) if callable(samples) else itertools.islice(samples, skip, None)
    bar = _Progress(str(out), total, progress)
    with ShardWriter(out, maxcount, start_index=len(done)) as writer:
        for sample in iterator:
            writer.write(sample)
            exts.update(k for k in sample if not k.startswith("__"))
            bar.update(skip + writer.count)
    num_samples = skip + writer.count
    bar.update(num_samples, force=True)

    names = done + writer.shards
    manifest = {
        **(extra or {}),
        "num_samples": num_samples,
        "shards": names,
        "shard_bytes": [(out / name).stat().st_size for name in names],
        "class_names": class_names,
        "source": source,
        "maxcount": maxcount,
        # ";"-joined like webdataset's to_tuple("jpg;png") alternatives, for mixed-format folders.
        "image_ext": ";".join(sorted(e for e in exts if e in IMAGE_EXTS)),
        "skipped": stats.skipped if stats is not None else 0,
        "complete": True,
    }
    _write_json_atomic(out / MANIFEST, manifest)
    (out / PARTIAL_MARKER).unlink()
    return manifest


def png_bytes(pixels: np.ndarray) -> bytes:
    """Lossless PNG of a uint8 [H, W, 3] array: how the CIFAR and Spirograph sources store their images."""
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()
