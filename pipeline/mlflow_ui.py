"""What a user sees of this project in the MLflow UI: experiments tagged as model training, links that open the
model-training view, the run's data as dataset inputs, its description, and system metrics from the nodes
that train. `python -m pipeline.mlflow_ui` (behind `make mlflow-ui`) starts the UI on the project's store.

MLflow 3.17's UI opens an experiment on its GenAI overview unless the URL after the hash route carries
`?workflowType=machine_learning` (or the browser remembers the toggle): every link printed here carries it.

The jobs import this module before their command line is checked: MLflow is imported inside the functions that
use it."""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import shlex
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Mapping

from pipeline.data.manifest import read_manifest
from pipeline.tools import console_script

KIND_TAG = "mlflow.experimentKind"
MODEL_TRAINING = "custom_model_development"
NOTE_TAG = "mlflow.note.content"  # the run page's Description
VIEW = "workflowType=machine_learning"
LOCAL_UI = "http://127.0.0.1:5000"


# ---------------------------------------------------------------- experiment kind and links


def mark_model_training(exp_id: str) -> None:
    """Tag the experiment as model training, unless it carries a kind already (one a user picked stays)."""
    from mlflow.tracking import MlflowClient  # mlflow: see the module docstring

    client = MlflowClient()
    if KIND_TAG not in client.get_experiment(exp_id).tags:
        client.set_experiment_tag(exp_id, KIND_TAG, MODEL_TRAINING)


def ui_base(tracking_uri: str, port: int = 5000) -> str:
    """Where the UI of `tracking_uri` is: a tracking server serves its own; a local store's is `mlflow ui`'s."""
    if tracking_uri.startswith(("http://", "https://")):
        return tracking_uri.rstrip("/")
    return f"http://127.0.0.1:{port}"


def link(base: str, exp_id: str, run_id: str | None = None) -> str:
    """The UI's page of an experiment (its runs) or of one run, in the model-training view."""
    route = f"#/experiments/{exp_id}" + (f"/runs/{run_id}" if run_id else "")
    return f"{base}/{route}?{VIEW}"


def ui_command(store_uri: str, port: int) -> list[str]:
    return [console_script("mlflow"), "ui", "--backend-store-uri", store_uri, "--port", str(port)]


# ---------------------------------------------------------------- metric names


def metric_name(key: str) -> str:
    """A metric the training loop reports (to Ray Train, and Tune) as the run logs it in MLflow: the kNN monitor
    under knn/, the rest under train/, so the UI's charts and search group them as every job names them."""
    if key == "time_knn_s":
        return "knn/time_s"
    if key.startswith("knn_"):
        return "knn/" + key[len("knn_") :]
    return "train/" + key


def report_name(name: str) -> str:
    """The name Tune's sweeps know a run's MLflow metric by (sweep.metric=knn_r2, probe_pretrained_r2_m, ...):
    metric_name's inverse, and the probe's probe/<backbone>_<score> as probe_<backbone>_<score>."""
    group, _, rest = name.partition("/")
    if group == "knn":
        return "time_knn_s" if rest == "time_s" else "knn_" + rest
    if group == "probe":
        return rest if rest.startswith("invariance_") else "probe_" + rest
    return rest if group == "train" else name


# ---------------------------------------------------------------- dataset inputs


def split_digest(manifest: dict) -> str:
    """A split's fingerprint: sha256 of its manifest (shard names and sizes, sample count, source)."""
    return hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()


def _split_name(location: str) -> str:
    """`<dataset folder>/<split folder>`, e.g. spirograph-270a7256/train: what the runs table shows."""
    parts = location.split("?")[0].rstrip("/").split("/")
    return "/".join(parts[-2:])


def _source_uri(location: str) -> str:
    return location if "://" in location else Path(location).resolve().as_uri()


def split_dataset(location: str, manifest: dict, num_samples: int | None = None):
    """A shard folder as an MLflow dataset: metadata only (the shards stay where they are), its digest the
    manifest's, its profile the sample and shard counts."""
    digest = split_digest(manifest)
    profile = {
        "num_samples": int(num_samples if num_samples is not None else manifest["num_samples"]),
        "num_shards": len(manifest.get("shards", [])),
        "manifest_sha256": digest,
    }
    return _metadata_dataset(location, _split_name(location), digest, profile)


def annotation_dataset(annotations: str):
    """A COCO-format split (what the detection job trains and evaluates on) as an MLflow dataset: its digest the
    annotation file's sha256, its profile the image and box counts."""
    raw = Path(annotations).read_bytes()
    coco = json.loads(raw)
    digest = hashlib.sha256(raw).hexdigest()
    profile = {
        "num_samples": len(coco.get("images", [])),
        "num_boxes": len(coco.get("annotations", [])),
        "annotations_sha256": digest,
    }
    return _metadata_dataset(annotations, _split_name(annotations), digest, profile)


def _metadata_dataset(location: str, name: str, digest: str, profile: dict):
    from mlflow.data.dataset_source_registry import resolve_dataset_source  # mlflow: see the module docstring
    from mlflow.data.meta_dataset import MetaDataset

    class DataSplit(MetaDataset):
        @property
        def profile(self) -> Any:
            return profile

        def to_dict(self) -> dict[str, str]:
            return {**super().to_dict(), "profile": json.dumps(profile)}

    with warnings.catch_warnings():  # MLflow registers its local source twice and says so for every file:// URI
        warnings.simplefilter("ignore", UserWarning)
        source = resolve_dataset_source(_source_uri(location))
    return DataSplit(source, name=name, digest=digest[:16])


def log_detection_datasets(data: dict) -> list:
    """Log a detection job's train and validation annotation files as the active run's dataset inputs."""
    datasets = [annotation_dataset(data["train_json"]), annotation_dataset(data["val_json"])]
    _log_inputs(datasets, ["training", "validation"])
    return datasets


def log_datasets(data: Mapping, num_train_samples: int | None = None) -> list:
    """Log the data section's train and validation splits as the active run's dataset inputs; returns the datasets.
    `num_train_samples`: the train split's count where it differs from its manifest's (bad shards left out).
    Data without a readable manifest is left out (the job itself says so if it needs it)."""
    datasets: list = []
    contexts: list[str | None] = []
    for split, context in (("train", "training"), ("val", "validation")):
        location = data.get(split)
        if not location:
            continue
        try:
            manifest, _ = read_manifest(location)
        except (OSError, ValueError):
            continue
        n = num_train_samples if split == "train" else None
        datasets.append(split_dataset(str(location), manifest, n))
        contexts.append(context)
    if datasets:
        _log_inputs(datasets, contexts)
    return datasets


def _log_inputs(datasets: list, contexts: list[str | None], attempts: int = 5) -> None:
    """mlflow.log_inputs, again where a concurrent run logged the same dataset first: MLflow looks a dataset up,
    then inserts it, so two sweep trials starting together race to the insert and one gets a unique-constraint
    error. Its retry finds the dataset there and links it."""
    import mlflow  # mlflow: see the module docstring
    from mlflow.exceptions import MlflowException

    for attempt in range(attempts):
        try:
            mlflow.log_inputs(datasets=datasets, contexts=contexts, tags_list=[None] * len(datasets))
            return
        except MlflowException as e:
            raced = "UNIQUE constraint" in str(e) or "IntegrityError" in str(e)
            if not raced or attempt == attempts - 1:
                raise
            time.sleep(0.2 * (attempt + 1))


# ---------------------------------------------------------------- description


def command_line() -> str:
    return "python " + shlex.join(sys.argv)


def describe_results(metrics: dict[str, float], probe: dict | None, minutes: float) -> str:
    """The headline results, appended to the description when the run ends."""
    lines = ["", "**Results**", "", f"- trained in {minutes:.1f} min"]
    knn = {k: v for k, v in metrics.items() if k.startswith("knn/")}
    if knn:
        lines.append("- kNN monitor, last epoch: " + ", ".join(f"{k} {v:.4f}" for k, v in sorted(knn.items())))
    shown = {b: r for b, r in (probe or {}).items() if b != "invariance"}
    if shown:
        keys = list(next(iter(shown.values())))
        lines += ["", "| linear probe | " + " | ".join(keys) + " |", "| --- |" + " --- |" * len(keys)]
        lines += [f"| {b} | " + " | ".join(f"{r[k]:.4f}" for k in keys) + " |" for b, r in shown.items()]
    return "\n".join(lines)


def set_description(run_id: str, text: str) -> None:
    from mlflow.tracking import MlflowClient  # mlflow: see the module docstring

    MlflowClient().set_tag(run_id, NOTE_TAG, text)


def append_description(run_id: str, text: str) -> None:
    from mlflow.tracking import MlflowClient  # mlflow: see the module docstring

    client = MlflowClient()
    before = client.get_run(run_id).data.tags.get(NOTE_TAG, "")
    client.set_tag(run_id, NOTE_TAG, before + "\n" + text)


# ---------------------------------------------------------------- system metrics


def start_system_metrics(
    run_id: str, tracking_uri: str, node_id: str | None, resume: bool, enabled: bool = True, verbose: bool = False
):
    """MLflow's system-metrics sampler (CPU, memory, disk, network; GPU utilisation and memory where NVML finds
    a GPU) logging into the job's run from this process's node, every MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL
    seconds (10 by default); None unless `enabled` (tracking.system_metrics). `node_id` names the node in the metric
    names (system/<node_id>/...) when the run spans several; `resume` continues the steps of an earlier attempt."""
    if not enabled:
        return None
    from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor  # mlflow: see the module docstring

    if not verbose:  # its start and stop lines ("Started monitoring system metrics") and its warnings while the
        # store is away (the step logger says that once) reach the console otherwise
        logging.getLogger("mlflow.system_metrics").setLevel(logging.ERROR)

    def make():
        monitor = SystemMetricsMonitor(run_id, node_id=node_id, resume_logging=resume, tracking_uri=tracking_uri)
        monitor.start()
        return monitor

    return _Started(make)


class _Started:
    """A monitor made and started on a thread of its own: resuming asks the store for the run's last steps, and a
    store that is away would hold the training worker there (MLflow retries for minutes). finish() stops it once
    it is up; a monitor that never came up (the store away all run) is left behind."""

    def __init__(self, make):
        import threading

        self.monitor = None
        self._thread = threading.Thread(target=self._run, args=(make,), name="system-metrics", daemon=True)
        self._thread.start()

    def _run(self, make) -> None:
        try:
            self.monitor = make()
        except Exception:  # noqa: BLE001 - system metrics are a convenience; the store's outage is said elsewhere
            self.monitor = None

    def finish(self) -> None:
        self._thread.join(timeout=5)
        if self.monitor is not None:
            self.monitor.finish()


# ---------------------------------------------------------------- make mlflow-ui


def main(argv: list[str]) -> int:
    """`make mlflow-ui`: print the `mlflow ui` command for the project's store and a link per experiment in the
    model-training view, then run it (`--print-only`: print and stop)."""
    p = argparse.ArgumentParser(prog="python -m pipeline.mlflow_ui", description=main.__doc__)
    p.add_argument("--runs", default="runs", help="the runs folder whose mlflow.db is the store")
    p.add_argument("--port", type=int, default=5000)
    p.add_argument("--print-only", action="store_true")
    args = p.parse_args(argv)
    db = Path(args.runs).resolve() / "mlflow.db"
    store = f"sqlite:///{db}"
    cmd = ui_command(store, args.port)
    print(shlex.join(cmd), flush=True)
    base = ui_base(store, args.port)
    if db.exists():
        from mlflow.tracking import MlflowClient  # mlflow: see the module docstring

        for exp in MlflowClient(store).search_experiments():
            if exp.name != "Default":
                print(f"  {exp.name}: {link(base, exp.experiment_id)}", flush=True)
    else:
        print(f"  no store at {db} yet: a job makes it (python jobs/pretrain.py)", flush=True)
    if args.print_only:
        return 0
    os.execv(cmd[0], cmd)
    return 0  # not reached: exec replaces this process


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
