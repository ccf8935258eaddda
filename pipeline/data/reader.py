"""Reading shards: Ray Data for the training stream, a plain tar reader for the small eval splits."""

from __future__ import annotations

import json
import sys
import tarfile
import time
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from pipeline.data.formats import IMAGE_EXTS, ON_BAD_SHARD, image_key  # noqa: F401  (one list for the writer and readers)
from pipeline.data.manifest import (
    BadShardError,
    check_shards,
    describe_bad,
    read_manifest,
    shard_problem,
    shard_samples,
)

# The readers' default for a bad shard. The config's `data.on_bad_shard` is applied before any work starts
# (pipeline.train.prepare.prepare_data checks every shard and, with `fail`, refuses in one line), so by the
# time a shard is read a bad one is either allowed (`skip`) or went bad since: skip it, warning with its name.
DEFAULT_ON_BAD_SHARD = "skip"

# An object store's error (throttling, a reset connection) is the store's fault, not the shard's: past pyarrow's
# own retries the shard is read again from where it failed, with growing pauses, for up to this long, and then
# StoreReadError is raised. Never skipped as a bad shard: that would quietly shrink a split.
STORE_RETRY_S = 120.0


class StoreReadError(OSError):
    """A shard on an object store that could not be read for STORE_RETRY_S (one line naming it)."""


def _warn_bad(bad: list[tuple[str, str]]) -> None:
    print(f"[shards] skipping {len(bad)} bad shard(s): {describe_bad(bad, limit=10)}", file=sys.stderr, flush=True)


def good_shards(root: str, on_bad_shard: str = DEFAULT_ON_BAD_SHARD) -> list[str]:
    """The URIs of the split's shards that pass `check_shards`; a bad one raises BadShardError naming it
    (`fail`) or is left out with a warning naming it (`skip`)."""
    if on_bad_shard not in ON_BAD_SHARD:
        raise ValueError(f"on_bad_shard must be one of {', '.join(ON_BAD_SHARD)}, not {on_bad_shard!r}")
    _, uris, bad = check_shards(root)
    if bad and on_bad_shard == "fail":
        raise BadShardError(f"bad shard in {root}: {describe_bad(bad)}")
    if bad:
        _warn_bad(bad)
    dropped = {u for u, _ in bad}
    good = [u for u in uris if u not in dropped]
    if not good:
        raise BadShardError(f"every shard in {root} is bad: {describe_bad(bad)}")
    return good


def train_dataset(
    root: str, shuffle_files: bool = True, seed: int | None = None, on_bad_shard: str = DEFAULT_ON_BAD_SHARD
):
    """Encoded samples as a Ray Dataset: `decoder=None` keeps bytes untouched for the augmentation stage.
    Shards that fail `check_shards` are never handed to Ray (see `good_shards`)."""
    import ray.data

    uris = good_shards(root, on_bad_shard)
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


class _ShortShard(tarfile.TarError):
    """The tar ended before the samples the manifest counts (Python's tarfile takes a corrupt header, or a
    cut at a block boundary, for the end of the archive)."""


def iter_samples(
    uris: list[str],
    on_bad_shard: str = DEFAULT_ON_BAD_SHARD,
    bad: list[tuple[str, str]] | None = None,
    sizes: list[int | None] | None = None,
    counts: list[int] | None = None,
) -> Iterator[dict]:
    """Samples of WebDataset tars in order: {"__key__": str, ext: bytes, ...} (members adjacent).

    A bad shard raises BadShardError naming it (`on_bad_shard="fail"`), or is skipped with a warning naming
    it (`skip`) and appended to `bad` as (uri, why). Bad: a local shard that fails `shard_problem` (checked
    before it is read, against its size in the manifest where `sizes` gives it), or a shard that cannot be
    read to its end or, where `counts` gives its samples, ends before them. The whole samples before the
    damage have been yielded by then; the one it cut is not."""
    if on_bad_shard not in ON_BAD_SHARD:
        raise ValueError(f"on_bad_shard must be one of {', '.join(ON_BAD_SHARD)}, not {on_bad_shard!r}")
    for i, uri in enumerate(uris):
        why = None if "://" in uri else shard_problem(uri, sizes[i] if sizes else None)
        if why is None:
            try:
                if "://" in uri:
                    yield from _iter_remote_shard(uri, counts[i] if counts else None)
                else:
                    yield from _iter_shard(uri, counts[i] if counts else None)
                continue
            except _ShortShard as e:
                why = str(e)
            except StoreReadError:
                raise  # the store's fault, not the shard's
            except (tarfile.TarError, EOFError, OSError) as e:
                why = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else 'unreadable'}"
        if on_bad_shard == "fail":
            raise BadShardError(f"bad shard {uri.split('?')[0]}: {why}")
        _warn_bad([(uri, why)])
        if bad is not None:
            bad.append((uri, why))


def _iter_remote_shard(uri: str, expected: int | None = None, budget_s: float | None = None) -> Iterator[dict]:
    """`_iter_shard` on an object store, read again past the samples already yielded after a store error (an
    OSError that is no tar damage) with pauses of 1, 2, 4 ... s; StoreReadError once `budget_s` has gone without
    progress (a read that yields samples between errors starts the count again)."""
    budget = STORE_RETRY_S if budget_s is None else budget_s
    done, last_key = 0, None
    since, pause, progress_at = time.monotonic(), 1.0, 0
    while True:
        try:
            for n, sample in enumerate(_iter_shard(uri, expected)):
                if n == done - 1 and sample["__key__"] != last_key:  # the shard changed between reads
                    raise StoreReadError(f"{uri.split('?')[0]}: changed while it was read again")
                if n >= done:
                    done, last_key = done + 1, sample["__key__"]
                    yield sample
            return
        except (tarfile.TarError, EOFError, StoreReadError):
            raise
        except OSError as e:
            if done > progress_at:  # samples came through since the last error: a new run of errors
                since, pause, progress_at = time.monotonic(), 1.0, done
            waited = time.monotonic() - since
            answer = (str(e).splitlines() or [type(e).__name__])[0].rstrip(": ")
            if waited >= budget:
                raise StoreReadError(
                    f"{uri.split('?')[0]}: {answer} (still failing after {waited:.0f} s of retries)"
                ) from None
            wait = min(pause, budget - waited)
            print(
                f"[shards] {uri.split('?')[0]}: {answer}; reading it again in {wait:.0f} s",
                file=sys.stderr,
                flush=True,
            )
            time.sleep(wait)
            pause *= 2


def _iter_shard(uri: str, expected: int | None = None) -> Iterator[dict]:
    # A sample is yielded once the next key begins (members are adjacent, so it is whole), the last one once
    # the tar ended with all `expected` samples.
    n = 0
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
                n += 1
                sample = {}
            sample["__key__"] = key
            data = tar.extractfile(member)
            assert data is not None  # a regular file (checked above)
            sample[ext] = data.read()
        if expected is not None and n + bool(sample) < expected:
            raise _ShortShard(f"ends after {n + bool(sample)} of its {expected} samples (corrupt or truncated)")
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
    assert targets is not None  # a regression task names its targets (the schema checks data.targets)
    return np.array([params[t] for t in targets], dtype=np.float32)


def load_split(
    root: str,
    task: str,
    targets: list[str] | None = None,
    limit: int | None = None,
    stride: bool = True,
    on_bad_shard: str = DEFAULT_ON_BAD_SHARD,
) -> Split:
    """Read up to `limit` samples. With `stride`, take every k-th sample so a limited split still spans
    every shard (and so every class of an ordered ImageFolder). Bad shards: see `iter_samples`."""
    manifest, uris = read_manifest(root)
    n = manifest["num_samples"]
    step = max(1, n // limit) if (limit and stride) else 1
    encoded, ys = [], []
    counts = shard_samples(manifest) if manifest.get("maxcount") else None  # known only for ShardWriter's shards
    samples = iter_samples(uris, on_bad_shard, sizes=manifest.get("shard_bytes"), counts=counts)
    for i, s in enumerate(samples):
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
