"""What is timed, and how: (b) the step rows, bare against project; (a) the batched view executor's views/s;
(c) jobs/pretrain.py end to end. The --deadline that keeps a run inside a caller's time cap, and the device helpers
(synchronise, free memory) the timings use."""

from __future__ import annotations

import copy
import datetime as dt
import gc
import math
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from . import ROOT
from .bare import bare_runner
from .data import make_imagefolder_shards
from .rows import EXECUTOR_RECIPES, premade_views, project_runner, row_config


class Deadline:
    """--deadline: a section starts no new row (or recipe) once the next would likely end past it, so that the
    benchmark finishes inside a caller's time cap (make gpu-check) with what it measured so far."""

    def __init__(self, seconds: float | None):
        self.end = None if seconds is None else time.perf_counter() + seconds
        self.longest = 0.0

    def allows_another(self) -> bool:
        return self.end is None or time.perf_counter() + self.longest < self.end

    def took(self, seconds: float) -> None:
        self.longest = max(self.longest, seconds)

    def left(self) -> float | None:
        return None if self.end is None else max(0.0, self.end - time.perf_counter())


NOT_RUN = "not run: past --deadline"


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU ({os.cpu_count()} cores)"


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def free_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


# ============================================================================= (b) step throughput
def images_per_s(step: Callable, images, params, batch: int, iters: int, device) -> float:
    """Throughput of `iters` back-to-back steps, synchronised only at both ends."""
    sync(device)
    t0 = time.perf_counter()
    for _ in range(iters):
        step(images, params)
    sync(device)
    return batch * iters / (time.perf_counter() - t0)


def trainable(opt: torch.optim.Optimizer) -> list[tuple[int, int]]:
    """(tensors, elements) per non-empty param group: what the two loops of a row must both train."""
    return [(len(g["params"]), sum(p.numel() for p in g["params"])) for g in opt.param_groups if g["params"]]


def measure_rows(
    rows: list[str],
    s: dict,
    device,
    precision: str,
    fmt,
    workdir: Path,
    deadline: Deadline | None = None,
    after_row: Callable[[dict], None] | None = None,
) -> dict:
    """{row: {"bare": img/s, "project": img/s, "views": n, "error": str|None}}; `after_row(results so far)` once
    each row is done, so that a caller's time cap loses no finished row."""
    results = {}
    total = s["warmup"] + s["iters"] * s["rounds"]
    deadline = deadline or Deadline(None)
    for row in rows:
        t0 = time.perf_counter()
        res = results[row] = {"bare": math.nan, "project": math.nan, "views": 0, "error": None, "same_params": None}
        if not deadline.allows_another():
            res["error"] = NOT_RUN
            print(f"  {row:8s} {NOT_RUN}", flush=True)
            continue
        try:
            data_root = None
            if row == "cocor":
                data_root = make_imagefolder_shards(workdir / "cocor_data", s["cocor_images"], 8, s["classes"])
            cfg = row_config(row, s, data_root)
            images, params = premade_views(cfg, s["batch"], device, fmt)
            res["views"] = len(images)
            runners = {
                "bare": bare_runner(row, cfg, device, precision, fmt, total, s),
                "project": project_runner(copy.deepcopy(cfg), device, precision, fmt, total),
            }
            shapes = {"bare": trainable(runners["bare"].opt), "project": trainable(runners["project"].optimizer)}
            res["same_params"] = shapes["bare"] == shapes["project"]
            for run in runners.values():  # warm-up: cudnn autotuning, allocator, lazy state
                for _ in range(s["warmup"]):
                    run(images, params)
            rates = {k: [] for k in runners}
            for _ in range(s["rounds"]):  # blocks in turn, so a passing load slows both alike; best block kept
                for which, run in runners.items():
                    rates[which].append(images_per_s(run, images, params, s["batch"], s["iters"], device))
            res.update({k: max(v) for k, v in rates.items()})
            del runners
            free_memory(device)
        except Exception as e:  # one failing row (out of memory, say) does not lose the others
            res["error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
            traceback.print_exc()
            free_memory(device)
        deadline.took(time.perf_counter() - t0)
        print(
            f"  {row:8s} bare {res['bare']:9.1f} img/s   project {res['project']:9.1f} img/s   "
            f"ratio {res['project'] / res['bare']:.3f}   ({time.perf_counter() - t0:.1f} s)"
            + (f"   FAILED {res['error']}" if res["error"] else ""),
            flush=True,
        )
        if after_row:
            after_row(results)
    return results


# ============================================================================= (a) gpu view executor
def measure_executor(s: dict, device, jpegs: list[bytes], deadline: Deadline | None = None) -> dict:
    """{recipe: {"images_s": .., "views_s": .., "views": n}} or {"unavailable": reason}; recipes past the deadline
    are left out."""
    from pipeline.augment.params import sample_views
    from pipeline.augment.view_makers import image_recipe
    from pipeline.config import compose_config

    try:
        from pipeline.augment.executors import make_executor
    except ImportError as e:
        return {"unavailable": f"{type(e).__name__}: {e}"}
    out = {}
    batch = min(s["batch"], len(jpegs))
    batches = [jpegs[i : i + batch] for i in range(0, len(jpegs) - batch + 1, batch)]
    deadline = deadline or Deadline(None)
    for name, recipe_name in EXECUTOR_RECIPES.items():
        if name.endswith("+fuse") and torch.device(device).type == "cpu":
            continue  # a compile for a few CPU batches: benchmarks/views_cpu.py measures the fused stage on a CPU
        if not deadline.allows_another():
            print(f"  {name:8s} {NOT_RUN}", flush=True)
            continue
        t_recipe = time.perf_counter()
        aug = compose_config([f"augment={recipe_name}", "data=imagenet", f"data.image_size={s['size']}"])["augment"]
        recipe = image_recipe(aug)
        try:
            executor = make_executor("batched", recipe, batch, torch_device=device, fuse=name.endswith("+fuse"))
        except (ValueError, TypeError, ImportError, NotImplementedError, KeyError) as e:
            return {"unavailable": f"{type(e).__name__}: {e}"}
        rng = np.random.default_rng(0)

        def run(encoded):
            views, kept = executor(encoded, sample_views(encoded, recipe, rng))  # noqa: F821 (deleted after use)
            if len(kept) != len(encoded):
                raise RuntimeError(f"batched executor dropped {len(encoded) - len(kept)} of {len(encoded)} images")
            return views

        views = run(batches[0])  # warm-up: kernels, caches, pinned buffers (and +fuse's compile)
        sync(device)
        t0 = time.perf_counter()
        n = 0
        for b in batches:
            views = run(b)
            n += len(b)
        sync(device)
        wall = time.perf_counter() - t0
        out[name] = {"images_s": n / wall, "views_s": n * len(views) / wall, "views": len(views)}
        print(f"  {name:8s} {n / wall:9.1f} images/s  {n * len(views) / wall:9.1f} views/s", flush=True)
        if name == "mocov2":  # where the executor's time goes (on an H100 it made half what the step consumes)
            out[name].update(_executor_parts(batches, recipe, device))
            parts = out[name]
            print(
                f"  {'':8s} of which: drawing the parameters {parts['params_images_s']:9.1f} images/s, decoding "
                f"{parts['decode_images_s']:9.1f} images/s (each alone)",
                flush=True,
            )
        del executor, views
        free_memory(device)
        deadline.took(time.perf_counter() - t_recipe)
    return out


def _executor_parts(batches: list[list[bytes]], recipe, device) -> dict:
    """The executor's two fixed parts timed alone over the same batches: drawing the views' parameters (host, numpy)
    and decoding the JPEGs (nvJPEG on a GPU); the crops, resizes and colour ops take the rest of its time."""
    from pipeline.augment.decode import decode_batch
    from pipeline.augment.params import sample_views

    rng = np.random.default_rng(0)
    n = sum(len(b) for b in batches)
    t0 = time.perf_counter()
    for b in batches:
        sample_views(b, recipe, rng)
    params_s = time.perf_counter() - t0
    decode_batch(batches[0], np.arange(len(batches[0])), device)  # warm-up
    sync(device)
    t0 = time.perf_counter()
    for b in batches:
        decode_batch(b, np.arange(len(b)), device)
    sync(device)
    decode_s = time.perf_counter() - t0
    return {"params_images_s": n / params_s, "decode_images_s": n / decode_s}


# ============================================================================= (c) end to end
def measure_e2e(s: dict, device, workdir: Path, deadline: Deadline | None = None) -> dict:
    """jobs/pretrain.py (MoCo v2, (b)'s settings) on generated JPEG shards; its last train/epoch_images_per_s. The
    job's output is streamed with the seconds since its start and stopped at the deadline."""
    import mlflow
    from capped import run_capped

    t_data = time.perf_counter()
    data = make_imagefolder_shards(workdir / "e2e_data", s["e2e_images"], max(s["batch"], 16), s["classes"])
    name = f"gpu-bench-e2e-{dt.datetime.now().strftime('%Y%m%d-%H%M%S')}"
    uri = f"sqlite:///{workdir / 'mlflow.db'}"
    cmd = [
        sys.executable,
        str(ROOT / "jobs" / "pretrain.py"),
        "data=imagenet",
        f"data.train={data / 'train'}",
        f"data.val={data / 'val'}",
        f"trainer.use_gpu={'true' if device.type == 'cuda' else 'false'}",
        "trainer.num_workers=1",
        f"model.backbone={s['backbone']}",
        "model.cifar_stem=false",
        f"model.width={s['width']}",
        f"data.image_size={s['size']}",
        f"train.batch_size={s['batch']}",
        f"train.epochs={s['e2e_epochs']}",
        "method=mocov2",
        "method.bn_splits=1",
        f"method.queue_size={s['queue']}",
        "eval.knn.every=0",
        "eval.probe.after_pretrain=false",
        "gallery.at_pretrain=false",
        f"paths.root={workdir}",
        f"tracking.uri={uri}",
        f"run.name={name}",
    ]
    print(f"  {s['e2e_images']} JPEGs made and sharded in {time.perf_counter() - t_data:.0f} s", flush=True)
    left = (deadline or Deadline(None)).left()
    # in the work folder: with an explicit tracking.uri MLflow puts artifacts under ./mlruns of the working directory
    done = run_capped("jobs/pretrain.py", cmd, 3600.0 if left is None else left, workdir / "e2e.log", workdir, "  ")
    wall = done["seconds"]
    if done["rc"]:
        tail = done["text"].strip().splitlines()[-5:]
        why = f"stopped at the deadline after {wall:.0f} s" if done["capped"] else f"exited {done['rc']}"
        return {"error": f"jobs/pretrain.py {why}: " + " | ".join(tail), "command": cmd}
    client = mlflow.MlflowClient(uri)
    exp = client.get_experiment_by_name("augssl")
    runs = client.search_runs([exp.experiment_id], filter_string=f"tags.mlflow.runName = '{name}'")
    history = sorted(client.get_metric_history(runs[0].info.run_id, "train/epoch_images_per_s"), key=lambda m: m.step)
    return {
        "per_epoch": [m.value for m in history],
        "images_s": history[-1].value,
        "wall_s": wall,
        "command": cmd,
        "images": s["e2e_images"],
    }
