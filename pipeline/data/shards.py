"""WebDataset shard writing: atomic, resumable shard folders with a manifest.

A split folder holds `shard-000000.tar`, `shard-000001.tar`, ... and, once finished, `manifest.json`.
A sample is a dict {"__key__": str, "<ext>": bytes | str | int | dict, ...}; its members are stored
adjacently as `<key>.<ext>`, sorted by extension, which is the layout `webdataset` groups by.
"""

from __future__ import annotations

import io
import itertools
import json
import os
import pickle
import re
import sys
import tarfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from pipeline.data.formats import FILE_EXT, IMAGE_EXTS, ON_BAD_SHARD  # noqa: F401  (ON_BAD_SHARD: re-exported)

# torch (for the Spirograph renderer) is imported where it is used: reading manifests and checking shards,
# which every job does before any work, stay light.

MANIFEST = "manifest.json"
# Records which source/maxcount the shards of an unfinished run belong to, so a resume never
# mixes shards of two different datasets.
PARTIAL_MARKER = "_partial.json"
SHARD_RE = re.compile(r"^shard-(\d{6})\.tar$")
SPIROGRAPH_CHUNK = 1000
SPIROGRAPH_VAL_SEED_OFFSET = 10**6

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


# ---------------------------------------------------------------- sources


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


def _png(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(array).save(buf, format="PNG")
    return buf.getvalue()


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
            yield {"__key__": f"{offset + i:06d}", "png": _png(images[i]), "cls": int(labels[i])}
        offset += len(images)


def iter_spirograph(
    n: int, seed: int, size: int = 32, *, start: int = 0, chunk: int = SPIROGRAPH_CHUNK
) -> Iterator[Sample]:
    """Samples {"__key__", "png", "json"} of n Spirograph images with their ten parameters.

    Chunk c (samples c*chunk ...) uses torch.Generator().manual_seed(seed + c), so any chunk, and
    hence any `start`, can be produced without rendering the ones before it.
    """
    import torch

    from pipeline.data import spirograph

    for c in range(start // chunk, (n + chunk - 1) // chunk):
        first = c * chunk
        params = spirograph.sample_params(min(chunk, n - first), torch.Generator().manual_seed(seed + c))
        images = spirograph.render_flat(params, size=size)
        pixels = (images * 255).round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).numpy()
        for j in range(max(start - first, 0), len(pixels)):
            values = {name: float(params[name][j]) for name in spirograph.PARAM_NAMES}
            yield {"__key__": f"{first + j:08d}", "png": _png(pixels[j]), "json": values}


# ---------------------------------------------------------------- whole splits


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
    (`generate`: n_train or n_val, seed, size, maxcount), which `spirograph_generate` reads back."""
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


def generated_with(manifest: dict, split: str) -> dict | None:
    """The `data.generate` settings an embedded split (Spirograph or Photos) was made with, from its manifest; None
    when it was made by another version of its generator (or is not embedded data)."""
    src = manifest.get("source")
    if isinstance(src, dict) and src.get("kind") == "photos":
        from pipeline.data.photos import VERSION

        return manifest.get("generate") if src.get("version") == VERSION else None
    return spirograph_generate(manifest, split)


def spirograph_generate(manifest: dict, split: str) -> dict | None:
    """The `data.generate` settings a Spirograph split was made with ({"n_train" or "n_val", "seed", "size",
    "maxcount"}), from its manifest; manifests written before the `generate` record have them in `source`.
    None when the split is not generated Spirograph data, or was made by a generator with other chunks."""
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


# ---------------------------------------------------------------- reading


def _is_uri(path: str) -> bool:
    return re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", path) is not None


def read_manifest(path_or_uri: str | os.PathLike) -> tuple[dict, list[str]]:
    """Read a split's manifest from a local folder or a pyarrow URI (file://, s3://, gs://...).

    Returns (manifest, shard URIs): the URIs are absolute paths for a local folder, else full URIs.
    Raises FileNotFoundError if the folder or manifest is missing, ValueError if the manifest is
    incomplete or lists no samples.
    """
    from pyarrow import fs as pafs  # heavy import, only needed here

    location, suffix = str(path_or_uri), ""
    if _is_uri(location):
        filesystem, folder = pafs.FileSystem.from_uri(location)
        # A URI may carry options after "?" (s3://b/p?endpoint_override=...); shard URIs keep them.
        location, sep, query = location.partition("?")
        suffix = sep + query
    else:
        location = os.path.abspath(location)
        filesystem, folder = pafs.LocalFileSystem(), location
    location = location.rstrip("/")
    folder = folder.rstrip("/")
    manifest_path = f"{folder}/{MANIFEST}"
    if filesystem.get_file_info(folder).type == pafs.FileType.NotFound:
        raise FileNotFoundError(f"shard folder not found: {location}")
    if filesystem.get_file_info(manifest_path).type != pafs.FileType.File:
        raise FileNotFoundError(
            f"no {MANIFEST} in {location} (shards missing or still being written; see jobs/make_shards.py)"
        )
    with filesystem.open_input_stream(manifest_path) as stream:
        manifest = json.loads(stream.read())
    if manifest.get("complete") is not True:
        raise ValueError(f"manifest in {location} is incomplete")
    if not manifest.get("num_samples"):
        raise ValueError(f"manifest in {location} lists zero samples")
    return manifest, [f"{location}/{name}{suffix}" for name in manifest["shards"]]


# ---------------------------------------------------------------- shard integrity


class BadShardError(ValueError):
    """A shard that is missing, truncated or not a tar archive, named in the message (one line)."""


def shard_problem(path: str | os.PathLike, expected_bytes: int | None = None) -> str | None:
    """Why a local shard is bad, or None. Cheap, whatever the shard's size: its size against the manifest's
    record (`expected_bytes`; None for manifests written before sizes were recorded), whole 512-byte tar
    blocks, a valid first header and the end-of-archive blocks; its members are not read."""
    try:
        size = os.path.getsize(path)
    except OSError:
        return "missing"
    if expected_bytes is not None and size != expected_bytes:
        return f"{size} bytes where the manifest records {expected_bytes} (truncated or overwritten)"
    block = tarfile.BLOCKSIZE
    if size < 3 * block or size % block:
        return f"{size} bytes is not a whole tar archive (truncated)"
    with open(path, "rb") as f:
        head = f.read(block)
        f.seek(-2 * block, os.SEEK_END)
        tail = f.read()
    try:
        tarfile.TarInfo.frombuf(head, tarfile.ENCODING, "surrogateescape")
    except tarfile.TarError as e:
        return f"not a tar archive ({e})"
    if tail.count(0) != len(tail):
        return "no end-of-archive blocks (truncated)"
    return None


def shard_samples(manifest: dict) -> list[int]:
    """Samples per shard: the writer fills every shard but the last with `maxcount`."""
    names, n, maxcount = manifest["shards"], int(manifest["num_samples"]), int(manifest.get("maxcount") or 0)
    if not names:
        return []
    if not maxcount:  # not written by ShardWriter: spread evenly, for counting only
        return [n // len(names) + (i < n % len(names)) for i in range(len(names))]
    return [maxcount] * (len(names) - 1) + [n - maxcount * (len(names) - 1)]


def check_shards(path_or_uri: str | os.PathLike) -> tuple[dict, list[str], list[tuple[str, str]]]:
    """(manifest, shard URIs, bad) of a split, `bad` listing (shard URI, why) for every shard that is missing,
    truncated or not a tar archive. Local shards get `shard_problem`'s checks; remote ones (s3://, gs://)
    their existence and size against the manifest, in one metadata request each."""
    manifest, uris = read_manifest(path_or_uri)
    sizes = manifest.get("shard_bytes") or [None] * len(uris)
    if not _is_uri(str(path_or_uri)):
        return manifest, uris, [(u, why) for u, n in zip(uris, sizes) if (why := shard_problem(u, n))]
    from pyarrow import fs as pafs

    filesystem, folder = pafs.FileSystem.from_uri(str(path_or_uri))
    infos = filesystem.get_file_info([f"{folder.rstrip('/')}/{name}" for name in manifest["shards"]])
    bad = []
    for uri, info, n in zip(uris, infos, sizes):
        if info.type != pafs.FileType.File:
            bad.append((uri, "missing"))
        elif n is not None and info.size != n:
            bad.append((uri, f"{info.size} bytes where the manifest records {n} (truncated or overwritten)"))
    return manifest, uris, bad


def describe_bad(bad: list[tuple[str, str]], limit: int = 3) -> str:
    """`name (why), ...` on one line, the first `limit` shards and a count of the rest."""
    text = ", ".join(f"{uri.split('?')[0].rsplit('/', 1)[-1]} ({why})" for uri, why in bad[:limit])
    return text + (f" and {len(bad) - limit} more" if len(bad) > limit else "")
