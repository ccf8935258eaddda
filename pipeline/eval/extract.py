"""Frozen features of a whole split, for probes and kNN on sets too large to hold as images: Ray Data reads the
shards, actors (one backbone each, a GPU each where the cluster has them) decode the un-augmented eval view and
run the backbone, and the driver streams the features to disk as they arrive, so memory holds one block at a time.

On disk, per split: `feat.npy` [N, D] float32, `y.npy` (int64 classes or float32 targets), `keys.txt`, and
`meta.json` written last: a folder with it is complete and is reused by the next probe or kNN of the same
backbone and split (its settings are part of the folder's name).

Ray is imported where it runs, not at load: run_probe imports this module, and jobs that start no cluster import
run_probe (for backbone_from)."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
import warnings
from pathlib import Path
from typing import Any, Iterator, Mapping

import numpy as np
import torch
from torchvision.transforms import InterpolationMode
from torchvision.transforms.v2 import functional as F

from pipeline.augment.params import eval_geometry
from pipeline.augment.torch_exec import decode_rgb
from pipeline.augment.view_makers import class_labels
from pipeline.cluster import alive_nodes, cluster_summary, describe, workers_that_fit
from pipeline.config import ConfigError
from pipeline.cores import cores
from pipeline.data.formats import IMAGE_EXTS
from pipeline.data.manifest import read_manifest
from pipeline.data.reader import train_dataset
from pipeline.models.backbones import build_backbone


def eval_views(batch: dict[str, np.ndarray], size: int, task: str, targets: list[str] | None) -> dict[str, np.ndarray]:
    """Ray Data's CPU stage: decode each image into the un-augmented eval view (eval_geometry's resize and
    centre crop) as uint8 [B, 3, size, size], which is a quarter of float32's bytes through the object store;
    undecodable images are dropped."""
    rows, kept = [], []
    for i, e in enumerate(row_images(batch)):
        if e is None:
            continue
        try:
            img = decode_rgb(bytes(e))  # np.bytes_ too
        except RuntimeError:  # undecodable
            continue
        rh, rw, top, left = eval_geometry(img.shape[1], img.shape[2], size)
        if (rh, rw) != tuple(img.shape[1:]):
            img = F.resize(img, [rh, rw], interpolation=InterpolationMode.BILINEAR, antialias=True)
        rows.append(img[:, top : top + size, left : left + size])
        kept.append(i)
    x = torch.stack(rows).numpy() if rows else np.zeros((0, 3, size, size), np.uint8)
    return {
        "x": x,
        "y": targets_of_batch(batch, task, targets)[kept],
        "key": np.asarray(batch["__key__"])[kept].astype(str),
    }


def row_images(batch: dict[str, np.ndarray]) -> list:
    """Each sample's image bytes (None without one): shards may mix members (png beside jpg), and a column holds
    None or NaN where a sample lacks its member."""
    cols = [batch[ext] for ext in IMAGE_EXTS if ext in batch]
    return [
        next((c[i] for c in cols if isinstance(c[i], (bytes, bytearray, np.bytes_))), None)
        for i in range(len(batch["__key__"]))
    ]


class Extractor:
    """Ray Data's callable class: eval views -> {"feat", "y", "key"}; one backbone per actor, normalisation and
    the forward pass on the actor's device."""

    def __init__(
        self,
        backbone_state: dict,
        model: dict[str, Any],
        mean,
        std,
        threads: int | None = None,
        views: dict | None = None,
    ):
        import ray  # ray: see the module docstring

        if isinstance(backbone_state, ray.ObjectRef):  # put once by the driver, fetched once per actor
            backbone_state = ray.get(backbone_state)
        if threads:
            torch.set_num_threads(threads)
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.net = build_backbone(model)
        self.net.load_state_dict(backbone_state)
        self.net.eval().to(self.device)
        self.views = views  # eval_views' arguments when this actor decodes too (no GPU: one stage, no transfer)
        self.mean = torch.tensor(mean, device=self.device).view(1, 3, 1, 1) * 255
        self.std = torch.tensor(std, device=self.device).view(1, 3, 1, 1) * 255

    @torch.no_grad()
    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self.views is not None:
            batch = eval_views(batch, **self.views)
        x = torch.from_numpy(batch["x"]).to(self.device, non_blocking=True)
        if len(x):
            feat = self.net((x.float() - self.mean) / self.std).float().cpu().numpy()
        else:
            feat = np.zeros((0, self.net.feat_dim), np.float32)
        return {"feat": feat, "y": batch["y"], "key": batch["key"]}


def targets_of_batch(batch: dict[str, np.ndarray], task: str, targets: list[str] | None) -> np.ndarray:
    """A Ray batch's labels: `cls` as int64, or the listed keys of each sample's `json` as float32 columns."""
    if task == "classification":
        return class_labels(batch["cls"])
    assert targets is not None  # a regression task names its targets (the schema checks data.targets)
    rows = [json.loads(v.decode() if isinstance(v, (bytes, bytearray, np.bytes_)) else v) for v in batch["json"]]
    return np.array([[r[t] for t in targets] for r in rows], dtype=np.float32)


def feature_dir(root: str | Path, tag: str, split_root: str, size: int, **settings) -> Path:
    """Where a backbone's (tag: a digest of its weights) features of a split go: one folder per everything that
    changes them or their targets (size, and `settings`: model, mean/std, task, targets, on_bad_shard)."""
    key = json.dumps([tag, split_root, size, settings], sort_keys=True, default=str)
    return Path(root) / "features" / hashlib.sha1(key.encode()).hexdigest()[:12]


def split_features(
    data: Mapping[str, Any],
    model: dict[str, Any],
    state: dict,
    runs: str | Path,
    split: str,
    size: int,
    mean,
    std,
    batch_size: int,
    actors: int | None = None,
    resources: dict[str, float] | None = None,
) -> tuple[Path, dict]:
    """extract_split for one split of a run's data, in the folder its settings name; (folder, meta)."""
    task, targets = data["task"], data.get("targets")
    on_bad = data.get("on_bad_shard", "fail")
    out = feature_dir(
        runs,
        weights_tag(state),
        data[split],
        size,
        model=model,
        mean=list(mean),
        std=list(std),
        task=task,
        targets=targets,
        on_bad_shard=on_bad,
    )
    meta = extract_split(
        state,
        model,
        data[split],
        out,
        size,
        mean,
        std,
        task,
        targets,
        batch_size,
        actors,
        on_bad_shard=on_bad,
        resources=resources,
    )
    return out, meta


def extract_split(
    backbone_state: dict,
    model: dict[str, Any],
    split_root: str,
    out: Path,
    size: int,
    mean,
    std,
    task: str,
    targets: list[str] | None,
    batch_size: int = 256,
    actors: int | None = None,
    on_bad_shard: str = "skip",
    progress: bool = True,
    resources: dict[str, float] | None = None,
) -> dict:
    """Features of every decodable sample of the split at `split_root` into `out` (reused when complete);
    returns its meta {"n", "dim", "seconds", "images_per_s", "actors", "device"}. Ray is initialised.
    `resources`: custom resources each actor also asks for (a node type's label), which places them."""
    import ray  # ray: see the module docstring
    import ray.data

    meta_path = out / "meta.json"
    if meta_path.exists():
        meta = json.loads(meta_path.read_text())
        if task == "regression" and np.load(out / "y.npy", mmap_mode="r").shape[1:] != (len(targets or []),):
            raise ValueError(f"{out}: its targets are not {targets}: remove the folder")
        return meta
    if not ray.is_initialized():
        raise RuntimeError("extract_split needs Ray: the caller starts it (pipeline.cluster.init_ray)")
    manifest, _ = read_manifest(split_root)
    total = int(manifest["num_samples"])
    actors, bundle = actor_plan(actors, resources)
    gpus = bool(bundle.get("GPU"))
    threads = None if gpus else max(1, cores() // actors)
    if not ray.data.DataContext.get_current().enable_progress_bars:  # quiet (init_ray): its plan and timing lines
        logging.getLogger("ray.data").setLevel(logging.ERROR)  # also its "progress bars disabled" notice
    state_ref = ray.put(backbone_state)
    views = {"size": size, "task": task, "targets": targets}
    ds = train_dataset(split_root, shuffle_files=False, on_bad_shard=on_bad_shard)
    if gpus:  # CPU tasks decode while the GPUs run the backbone; on CPUs alone a separate stage only competes
        ds = ds.map_batches(eval_views, fn_kwargs=views, batch_size=batch_size, batch_format="numpy")
    with warnings.catch_warnings():
        # No actor restarts: a restarted actor would need the weights in the object store again (Ray's core worker
        # warns of it at every start, ray#53727); a lost actor fails the extraction, and rerunning the job redoes
        # that split. Ray 2.60 takes max_restarts only through ray_remote_args, which it calls deprecated.
        warnings.filterwarnings("ignore", message=".*ray_remote_args.*deprecated")
        ds = ds.map_batches(
            Extractor,
            fn_constructor_args=(state_ref, model, mean, std, threads, None if gpus else views),
            batch_size=batch_size,
            batch_format="numpy",
            compute=ray.data.ActorPoolStrategy(size=actors),
            num_gpus=bundle.get("GPU", 0),
            num_cpus=bundle["CPU"],
            resources={k: v for k, v in bundle.items() if k not in ("CPU", "GPU")} or None,
            max_restarts=0,
        )
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    n, first = _stream(ds.iter_batches(batch_size=None, batch_format="numpy", prefetch_batches=2), out, total, progress)
    seconds = time.monotonic() - t0
    dim = int(np.load(out / "feat.npy", mmap_mode="r").shape[1])
    # the rate once the first block is in: Ray's planning and the actors' start-up (a few seconds) are left out
    steady = (n - first[0]) / max(first[2] - first[1], 1e-9) if first[2] > first[1] else n / max(seconds, 1e-9)
    meta = {
        "n": n,
        "dim": dim,
        "split": split_root,
        "size": size,
        "seconds": round(seconds, 2),
        "startup_s": round(first[1] - t0, 2),
        "images_per_s": round(steady, 1),
        "actors": actors,
        "device": "cuda" if gpus else "cpu",
    }
    meta_path.write_text(json.dumps(meta, indent=1))
    return meta


def actor_plan(actors: int | None, resources: dict[str, float] | None) -> tuple[int, dict[str, float]]:
    """How many extraction actors, and what each asks of Ray: a GPU each where the cluster has GPUs, else CPUs
    (a quarter of the cores, at most 4 actors, by default), plus `resources` (a node type's label)."""
    import ray  # ray: see the module docstring

    gpus = int(ray.cluster_resources().get("GPU", 0))
    cpus = int(ray.cluster_resources().get("CPU", 1))
    actors = actors or max(1, gpus or min(4, cores() // 4))
    threads = max(1, cores() // actors)
    bundle = {"CPU": 0.0, "GPU": 1.0} if gpus else {"CPU": float(max(1, min(cpus // actors, threads)))}
    bundle.update({k: float(v) for k, v in (resources or {}).items()})
    return actors, bundle


def check_actors(
    actors: int | None, resources: dict[str, float] | None, prefix: str = "", autoscale: bool = False
) -> None:
    """ConfigError (one line) when the cluster cannot place the extraction actors, which Ray Data would otherwise
    wait for in silence. For the jobs, before their runs are made; `prefix`: where their settings are (eval.probe.).
    Only actors or resources set by hand can miss (the default plan fits the cluster by its making); nor is an
    autoscaling cluster checked: the pending actors are what it scales for."""
    if autoscale or not (actors or resources):
        return
    n, bundle = actor_plan(actors, resources)
    asked = {k: v for k, v in bundle.items() if v > 0}
    nodes = alive_nodes()
    fit = workers_that_fit(nodes, asked)
    if fit >= n:
        return
    missing = [k for k in resources or {} if not any(node.get(k) for node in nodes)]
    why = f"no node offers {', '.join(missing)}" if missing else f"room for {fit}"
    raise ConfigError(
        f"{n} feature-extraction actor{'s' if n != 1 else ''} x ({describe(asked)}) do not fit: the cluster has "
        f"{cluster_summary(nodes)}, {why}; check {prefix}actors and {prefix}actor_resources"
    )


def _stream(batches: Iterator[dict], out: Path, total: int, progress: bool) -> tuple[int, tuple[int, float, float]]:
    """Write each arriving block into memory-mapped arrays sized for the manifest's count; trimmed to what
    decoded at the end. Returns the number of rows and (rows of the first block, its arrival, the last's)."""
    feat: np.memmap | None = None
    y: np.memmap | None = None
    keys, n = [], 0
    last = time.monotonic()
    first = (0, last, last)
    for b in batches:
        k = len(b["feat"])
        if k == 0:
            continue
        first = (k, time.monotonic(), first[2]) if feat is None else (first[0], first[1], time.monotonic())
        if feat is None or y is None:  # the first block: both are opened together
            feat = np.lib.format.open_memmap(out / "feat.tmp.npy", "w+", np.float32, (total, b["feat"].shape[1]))
            y = np.lib.format.open_memmap(out / "y.tmp.npy", "w+", b["y"].dtype, (total, *b["y"].shape[1:]))
        feat[n : n + k], y[n : n + k] = b["feat"], b["y"]
        keys.extend(b["key"].tolist())
        n += k
        if progress and time.monotonic() - last > 10:
            print(f"[features] {n}/{total} images", flush=True)
            last = time.monotonic()
    if feat is None or y is None:
        raise ValueError(f"no decodable images in {out}")
    for name, arr in (("feat", feat), ("y", y)):
        arr.flush()
        if n == total:
            del arr
            os.replace(out / f"{name}.tmp.npy", out / f"{name}.npy")
            continue
        trimmed = np.lib.format.open_memmap(out / f"{name}.npy", "w+", arr.dtype, (n, *arr.shape[1:]))
        for i in range(0, n, 65536):  # chunks: a large split's features need not fit in memory
            trimmed[i : i + 65536] = arr[i : min(n, i + 65536)]
        trimmed.flush()
        del trimmed, arr
        os.remove(out / f"{name}.tmp.npy")
    (out / "keys.txt").write_text("\n".join(keys) + "\n")
    return n, first


def load_features(out: Path) -> tuple[np.ndarray, np.ndarray]:
    """A complete folder's features and targets, memory-mapped: readers take what they need in chunks."""
    return np.load(out / "feat.npy", mmap_mode="r"), np.load(out / "y.npy", mmap_mode="r")


def weights_tag(state: dict) -> str:
    """A digest of a backbone's weights: the same backbone's features are found again, another's never are."""
    h = hashlib.sha1()
    for k in sorted(state):
        h.update(k.encode())
        h.update(state[k].detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]
