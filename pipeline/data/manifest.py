"""Reading a split's manifest, and checking its shards' health without reading their samples; the `data.generate`
settings an embedded split was made with, read back from its manifest."""

from __future__ import annotations

import json
import os
import re
import tarfile

from pipeline.data.shards import MANIFEST


def _is_uri(path: str) -> bool:
    return re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", path) is not None


def read_manifest(path_or_uri: str | os.PathLike) -> tuple[dict, list[str]]:
    """Read a split's manifest from a local folder or a pyarrow URI (file://, s3://, gs://...).

    Returns (manifest, shard URIs): the URIs are absolute paths for a local folder, else full URIs.
    Raises FileNotFoundError if the folder or manifest is missing, ValueError if the manifest is
    incomplete or lists no samples.
    """
    from pyarrow import fs as pafs  # heavy: imported where used, so every job's manifest check stays light

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
    from pyarrow import fs as pafs  # heavy: as in read_manifest

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
