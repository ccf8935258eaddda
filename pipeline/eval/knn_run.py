"""The run of jobs/knn.py (its settings and checks: pipeline.eval.knn_job, which imports this module when it runs):
both splits' features extracted by Ray Data to disk, a weighted kNN vote of the validation split against the train
split's bank, for the run's backbone and a random-init twin, logged into a child run of the pretraining run."""

from __future__ import annotations

from pathlib import Path

import mlflow

from pipeline import mlflow_ui, tracking
from pipeline.augment.view_makers import eval_settings
from pipeline.cluster import init_ray
from pipeline.config import ConfigError
from pipeline.data.manifest import read_manifest
from pipeline.eval import downstream
from pipeline.eval.downstream import pick_device, results_table
from pipeline.eval.evaluation import Job
from pipeline.eval.extract import check_actors, load_features, split_features
from pipeline.eval.job_errors import KnnError
from pipeline.eval.job_settings import Knn
from pipeline.eval.knn import knn_streamed
from pipeline.eval.probe.compare import backbone_from, random_backbone
from pipeline.eval.source import load_source


def run(job: Job[Knn]) -> dict:
    """Extract, vote, log; returns {label: {"knn_top1"} or {"knn_r2", ...}}."""
    knn, store = job.own, job.store
    try:
        tracking.setup(store)  # a run id is looked up in the store
        src = load_source(job.source)
    except (FileNotFoundError, ValueError) as e:
        raise KnnError(str(e)) from None
    data = {**src.cfg["data"], **job.data}
    for split in ("train", "val"):
        try:
            read_manifest(data[split])
        except (FileNotFoundError, ValueError) as e:
            raise KnnError(f"data.{split}={data[split]}: {e}") from None
    settings = {
        "source": src.ref,
        "data": {k: data[k] for k in ("train", "val", "task")},
        "k": knn.k,
        "temperature": knn.temperature,
        "baseline": knn.baseline,
        "seed": knn.seed,
    }
    ev = downstream.find(store, src, "knn", settings, f"k{knn.k}")
    if ev.finished:
        assert ev.found is not None  # finished: an earlier attempt's run
        m = ev.found.data.metrics
        print(
            f"[knn] {ev.name} finished before (MLflow run {ev.found.info.run_id}); nothing to run. Its results:",
            flush=True,
        )
        results = {label: _logged(m, label) for label in ("pretrained", "random")}
        print(_table({k: v for k, v in results.items() if v}), flush=True)
        return results
    init_ray(job.trainer, job.verbose)
    try:  # before the run is made: actors the cluster cannot place
        check_actors(knn.actors, knn.actor_resources, autoscale=bool(job.trainer.get("autoscale")))
    except ConfigError as e:
        raise KnnError(str(e)) from None
    with downstream.child_run(store, src, ev, "knn") as run_id:
        if ev.found is None:
            mlflow.log_params(
                {
                    "source": src.ref,
                    "k": knn.k,
                    "temperature": knn.temperature,
                    "data.train": data["train"],
                    "data.val": data["val"],
                }
            )
            mlflow_ui.log_datasets(data)  # the splits it ran on, as the run page's dataset inputs
        results = _all(knn, src, data, job.runs)
        table = _table(results)
        print(table, flush=True)
        mlflow.log_text(table, "knn/table.md")
    print(f"[knn] done: MLflow run {run_id}" + (f" (a child of {src.run_id})" if src.run_id else ""), flush=True)
    return results


def _all(knn: Knn, src, data: dict, runs: Path) -> dict:
    """Each backbone's features (cached under `runs`, paths.runs) and its kNN scores, logged."""
    size, mean, std = eval_settings(src.cfg["augment"])
    targets = data.get("targets")
    names = read_manifest(data["train"])[0].get("class_names") or []
    device = pick_device("auto")
    results = {}
    extraction = {"batch_size": knn.batch_size, "actors": knn.actors, "resources": knn.actor_resources}
    for label in ["pretrained", "random"] if knn.baseline else ["pretrained"]:
        net = backbone_from(src.state) if label == "pretrained" else random_backbone(src.cfg["model"], knn.seed)
        state = net.state_dict()
        feats, metas = {}, {}
        for split in ("train", "val"):
            out, metas[split] = split_features(
                data, src.cfg["model"], state, runs, split, size, mean, std, **extraction
            )
            feats[split] = load_features(out)
        res = knn_streamed(
            *feats["train"],
            *feats["val"],
            data["task"],
            knn.k,
            knn.temperature,
            len(names) or None,
            list(targets or []),
            device=device,
        )
        results[label] = res
        speed = metas["train"]["images_per_s"]
        # knn/<backbone>_top1 (or _r2...): the kNN monitor's knn/ group, one name per backbone
        logged = {f"knn/{label}_{k.removeprefix('knn_')}": v for k, v in res.items()}
        mlflow.log_metrics({**logged, f"knn/{label}_extract_images_per_s": speed})
        print(
            f"[knn] {label}: {', '.join(f'{k} {v:.4f}' for k, v in res.items())} (bank {metas['train']['n']}, "
            f"queries {metas['val']['n']}; features at {speed:.0f} images/s on {metas['train']['actors']} "
            f"{metas['train']['device']} actor(s))",
            flush=True,
        )
    return results


def _table(results: dict[str, dict[str, float]]) -> str:
    return results_table(results, list(dict.fromkeys(k for r in results.values() for k in r)))


def _logged(metrics: dict[str, float], label: str) -> dict[str, float]:
    """A backbone's results as run() returns them ({"knn_top1": ...}), read back from its run's metrics."""
    prefix = f"knn/{label}_"
    return {
        "knn_" + k[len(prefix) :]: v
        for k, v in metrics.items()
        if k.startswith(prefix) and not k.endswith("extract_images_per_s")
    }
