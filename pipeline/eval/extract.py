"""Frozen features of a whole split, for probes and kNN on sets too large to hold as images: Ray Data reads the
shards, actors (one backbone each, a GPU each where the cluster has them) decode the un-augmented eval view and
run the backbone, and the driver streams the features to disk as they arrive, so memory holds one block at a time.

On disk, per split: `feat.npy` [N, D] float32, `y.npy` (int64 classes or float32 targets), `keys.txt`, and
`meta.json` written last: a folder with it is complete and is reused by the next probe or kNN of the same
backbone and split (its settings are part of the folder's name)."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from pipeline.augment.torch_exec import eval_transform
from pipeline.augment.view_maker import class_labels
from pipeline.data.formats import image_key


class Extractor:
    """Ray Data's callable class: a batch of shard samples -> {"feat", "y", "key"} of those that decode."""

    def __init__(self, backbone_state: dict, model_cfg: dict, size: int, mean, std, task: str,
                 targets: list[str] | None, threads: int | None = None):
        from pipeline.models.backbones import build_backbone

        if threads:
            torch.set_num_threads(threads)
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        m = model_cfg
        self.net = build_backbone(m["backbone"], m.get("cifar_stem", False), m.get("width", 64))
        self.net.load_state_dict(backbone_state)
        self.net.eval().to(self.device)
        self.size, self.mean, self.std, self.task, self.targets = size, mean, std, task, targets

    @torch.no_grad()
    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        x, kept = eval_transform(list(batch[image_key(batch)]), self.size, self.mean, self.std)
        feat = self.net(x.to(self.device, non_blocking=True)).float().cpu().numpy() if len(kept) else \
            np.zeros((0, self.net.feat_dim), np.float32)
        return {"feat": feat, "y": targets_of_batch(batch, self.task, self.targets)[kept],
                "key": np.asarray(batch["__key__"])[kept].astype(str)}


def targets_of_batch(batch: dict[str, np.ndarray], task: str, targets: list[str] | None) -> np.ndarray:
    """A Ray batch's labels: `cls` as int64, or the listed keys of each sample's `json` as float32 columns."""
    if task == "classification":
        return class_labels(batch["cls"])
    rows = [json.loads(v.decode() if isinstance(v, (bytes, bytearray, np.bytes_)) else v) for v in batch["json"]]
    return np.array([[r[t] for t in targets] for r in rows], dtype=np.float32)


def feature_dir(root: str | Path, tag: str, split_root: str, size: int) -> Path:
    """Where a backbone's (tag: a digest of its weights' source) features of a split at a size go."""
    import hashlib

    digest = hashlib.sha1(f"{tag}|{split_root}|{size}".encode()).hexdigest()[:12]
    return Path(root) / "features" / digest


def extract_split(backbone_state: dict, model_cfg: dict, split_root: str, out: Path, size: int, mean, std,
                  task: str, targets: list[str] | None, batch_size: int = 256, actors: int | None = None,
                  on_bad_shard: str = "skip", progress: bool = True) -> dict:
    """Features of every decodable sample of the split at `split_root` into `out` (reused when complete);
    returns its meta {"n", "dim", "seconds", "images_per_s", "actors", "device"}. Ray is initialised."""
    import ray

    meta_path = out / "meta.json"
    if meta_path.exists():
        return json.loads(meta_path.read_text())
    from pipeline.data.reader import train_dataset
    from pipeline.data.shards import read_manifest

    manifest, _ = read_manifest(split_root)
    total = int(manifest["num_samples"])
    gpus = int(ray.cluster_resources().get("GPU", 0))
    cpus = int(ray.cluster_resources().get("CPU", 1))
    actors = actors or max(1, gpus or min(4, (os.cpu_count() or 2) // 2))
    threads = None if gpus else max(1, (os.cpu_count() or 1) // actors)
    state_ref = ray.put(backbone_state)
    ds = train_dataset(split_root, shuffle_files=False, on_bad_shard=on_bad_shard).map_batches(
        Extractor, fn_constructor_args=(state_ref, model_cfg, size, mean, std, task, targets, threads),
        batch_size=batch_size, batch_format="numpy", concurrency=actors, num_gpus=1 if gpus else 0,
        num_cpus=0 if gpus else max(1, min(cpus // actors, threads or 1)))
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    n = _stream(ds.iter_batches(batch_size=None, batch_format="numpy", prefetch_batches=2), out, total, progress)
    seconds = time.monotonic() - t0
    dim = int(np.load(out / "feat.npy", mmap_mode="r").shape[1])
    meta = {"n": n, "dim": dim, "split": split_root, "size": size, "seconds": round(seconds, 2),
            "images_per_s": round(n / max(seconds, 1e-9), 1), "actors": actors, "device": "cuda" if gpus else "cpu"}
    meta_path.write_text(json.dumps(meta, indent=1))
    return meta


def _stream(batches: Iterator[dict], out: Path, total: int, progress: bool) -> int:
    """Write each arriving block into memory-mapped arrays sized for the manifest's count; trimmed to what
    decoded at the end. Returns the number of rows."""
    feat = y = None
    keys, n = [], 0
    last = time.monotonic()
    for b in batches:
        k = len(b["feat"])
        if k == 0:
            continue
        if feat is None:
            feat = np.lib.format.open_memmap(out / "feat.tmp.npy", "w+", np.float32, (total, b["feat"].shape[1]))
            y = np.lib.format.open_memmap(out / "y.tmp.npy", "w+", b["y"].dtype, (total, *b["y"].shape[1:]))
        feat[n:n + k], y[n:n + k] = b["feat"], b["y"]
        keys.extend(b["key"].tolist())
        n += k
        if progress and time.monotonic() - last > 10:
            print(f"[features] {n}/{total} images", flush=True)
            last = time.monotonic()
    if feat is None:
        raise ValueError(f"no decodable images in {out}")
    for name, arr in (("feat", feat), ("y", y)):
        arr.flush()
        if n == total:
            del arr
            os.replace(out / f"{name}.tmp.npy", out / f"{name}.npy")
            continue
        trimmed = np.lib.format.open_memmap(out / f"{name}.npy", "w+", arr.dtype, (n, *arr.shape[1:]))
        for i in range(0, n, 65536):  # chunks: a large split's features need not fit in memory
            trimmed[i:i + 65536] = arr[i:min(n, i + 65536)]
        trimmed.flush()
        del trimmed, arr
        os.remove(out / f"{name}.tmp.npy")
    (out / "keys.txt").write_text("\n".join(keys) + "\n")
    return n


def load_features(out: Path) -> tuple[np.ndarray, np.ndarray]:
    """A complete folder's features and targets, memory-mapped: readers take what they need in chunks."""
    return np.load(out / "feat.npy", mmap_mode="r"), np.load(out / "y.npy", mmap_mode="r")
