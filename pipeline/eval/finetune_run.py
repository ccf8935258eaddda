"""The run of jobs/finetune.py (its settings and checks: pipeline.eval.finetune_job, which imports this module when it
runs): draw or read the labelled subset, fine-tune the run's backbone and a random-init twin on it, log both into a
child run of the run, with a chart of their losses and scores."""

from __future__ import annotations

import time
from pathlib import Path

import mlflow
import torch
from mlflow.tracking import MlflowClient

from pipeline import mlflow_ui, tracking
from pipeline.augment.view_makers import eval_settings
from pipeline.data.labelled import select
from pipeline.data.reader import load_split
from pipeline.eval import downstream
from pipeline.eval.downstream import results_table
from pipeline.eval.evaluation import Job
from pipeline.eval.finetune import Schedule, decodable, finetune, out_dim
from pipeline.eval.job_errors import FinetuneError
from pipeline.eval.job_settings import Finetune
from pipeline.eval.probe.compare import backbone_from, random_backbone
from pipeline.eval.source import load_source

METRIC_KEYS = ("top1", "top5", "mse", "r2")


def schedule(f: Finetune, task: str) -> Schedule:
    """The schedule of the settings for the task: each `auto` resolved (no crop or flip for regression targets)."""
    regression = task == "regression"
    scale = f.crop_scale if f.crop_scale != "auto" else ([1.0, 1.0] if regression else [0.08, 1.0])
    flip = f.flip if f.flip != "auto" else not regression
    lr_head = f.lr_head if f.lr_head != "auto" else (f.lr_backbone if regression else 1.0)
    return Schedule(
        f.epochs,
        f.batch_size,
        f.lr_backbone,
        lr_head,
        f.milestones,
        f.gamma,
        f.momentum,
        f.weight_decay,
        [float(v) for v in scale],
        bool(flip),
        f.clip_grad_norm,
        f.precise_bn,
        head_lr_cap=f.lr_head == "auto",
    )


def run(job: Job[Finetune]) -> dict:
    """Fine-tune, score, log; returns {label: metrics} for label in pretrained (and random)."""
    f, store = job.own, job.store
    try:
        downstream.pick_device(f.device)
        tracking.setup(store)  # a run id is looked up in the store
        src = load_source(job.source)
    except (FileNotFoundError, ValueError) as e:
        raise FinetuneError(str(e)) from None
    data = {**src.cfg["data"], **job.data}
    names = _subset_names(f)
    s = schedule(f, data["task"])
    settings = {
        "source": src.ref,
        "data": {k: data[k] for k in ("train", "val", "task") if k in data},
        "targets": data.get("targets"),
        "subset": names if names is not None else f.label_fraction,
        "schedule": s.__dict__,
        "baseline": f.baseline,
        "seed": f.seed,
        "val_size": f.val_size,
    }
    what = "subset" if names is not None else f"{f.label_fraction:g}"
    ev = downstream.find(store, src, "finetune", settings, what)
    if ev.finished:
        return _finished(ev)
    try:
        train, keys, val = _splits(f, data, names)
    except (FileNotFoundError, ValueError) as e:
        raise FinetuneError(str(e)) from None
    out_dir = job.runs / "finetune" / ev.name
    with downstream.child_run(store, src, ev, "finetune") as run_id:
        if ev.found is None:
            mlflow.log_params(
                {
                    "source": src.ref,
                    "label_fraction": f.label_fraction,
                    "subset": f.subset,
                    "subset_size": len(train.encoded),
                    "val_size": len(val.encoded),
                    "data.train": data["train"],
                    "data.val": data["val"],
                    "seed": f.seed,
                    **{f"schedule.{k}": v for k, v in s.__dict__.items()},
                }
            )
            mlflow.log_text("\n".join(keys) + "\n", "finetune/subset.txt")
            # the splits as dataset inputs; the training one counts the labelled subset it was tuned on
            mlflow_ui.log_datasets(data, len(train.encoded))
        try:
            results = _all(f, src, data, train, val, s, out_dir)
        except FloatingPointError as e:  # the run ends FAILED (child_run), the user gets one line
            raise FinetuneError(str(e)) from None
    print(f"[finetune] done: MLflow run {run_id}" + (f" (a child of {src.run_id})" if src.run_id else ""), flush=True)
    return results


def _subset_names(f: Finetune) -> list[str] | None:
    if f.subset is None:
        return None
    names = [ln.strip() for ln in Path(f.subset).read_text().splitlines() if ln.strip()]
    if not names:
        raise FinetuneError(f"subset={f.subset}: the file lists no samples")
    return names


def _splits(f: Finetune, data: dict, names: list[str] | None):
    targets = data.get("targets")
    train, keys = select(data["train"], data["task"], targets, f.label_fraction, f.seed, names=names)
    good, kept = decodable(train)
    keys = [keys[i] for i in kept]  # what trains is what is logged
    if len(good.encoded) < len(train.encoded):
        print(
            f"[finetune] skipped {len(train.encoded) - len(good.encoded)} undecodable images of the subset", flush=True
        )
    if len(good.encoded) < 2:
        raise ValueError(f"the labelled subset has {len(good.encoded)} decodable image(s): raise label_fraction")
    val, _ = decodable(load_split(data["val"], data["task"], targets, limit=f.val_size))
    src = f"listed in {f.subset}" if names is not None else f"{f.label_fraction:g} of the train split"
    print(
        f"[finetune] {len(good.encoded)} labelled images ({src}, seed {f.seed}), {len(val.encoded)} validation images",
        flush=True,
    )
    return good, keys, val


def _all(f: Finetune, src, data: dict, train, val, s, out_dir: Path) -> dict:
    """Each backbone in turn; one whose results an earlier attempt logged is kept, one it left part-way resumes
    from its last epoch's checkpoint."""
    size, mean, std = eval_settings(src.cfg["augment"])
    device = torch.device(downstream.pick_device(f.device))
    logged = mlflow.get_run(tracking.active_run_id()).data.metrics
    results = {}
    for label in ["pretrained", "random"] if f.baseline else ["pretrained"]:
        done = {k: logged[_key(label, k)] for k in METRIC_KEYS if _key(label, k) in logged}
        if done:
            results[label] = done
            print(f"[finetune] {label}: done before; kept", flush=True)
            continue
        net = backbone_from(src.state) if label == "pretrained" else random_backbone(src.cfg["model"], f.seed)
        t0 = time.monotonic()

        def log(epoch: int, m: dict, label=label) -> None:
            mlflow.log_metrics({_key(label, k): v for k, v in m.items()}, step=epoch)
            print(f"[finetune] {label} epoch {epoch}/{s.epochs}: loss {m['loss']:.4f}", flush=True)

        res = finetune(
            net,
            train,
            val,
            data["task"],
            out_dim(train, data["task"]),
            s,
            size,
            mean,
            std,
            device,
            f.seed,
            out_dir / label / "last.pt",
            log,
        )
        results[label] = res
        mlflow.log_metrics(
            {**{_key(label, k): v for k, v in res.items()}, _key(label, "minutes"): (time.monotonic() - t0) / 60}
        )
    table = _table(results)
    print(table, flush=True)
    mlflow.log_text(table, "finetune/table.md")
    out_dir.mkdir(parents=True, exist_ok=True)
    png = _curves_png(tracking.active_run_id(), list(results), out_dir / "finetune.png")
    mlflow.log_artifact(str(png), "finetune")
    return results


def _key(label: str, name: str) -> str:
    """A fine-tuning metric's MLflow name: finetune/<backbone>_<name> (finetune/pretrained_top1), grouped in the UI
    as every job's are (train/, knn/, probe/, detect/)."""
    return f"finetune/{label}_{name}"


def _table(results: dict[str, dict[str, float]]) -> str:
    keys = list(dict.fromkeys(k for r in results.values() for k in r))
    per_target = [k for k in keys if k.startswith(("mse_", "r2_"))]
    return results_table(results, [k for k in keys if k not in per_target] + per_target)


def _curves_png(run_id: str, labels: list[str], path: Path) -> Path:
    """Training loss per epoch of each backbone, and its final scores: what a person compares first."""
    import matplotlib  # matplotlib: its Agg backend chosen when a chart is drawn, not when this module loads

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    client = MlflowClient()
    metrics = client.get_run(run_id).data.metrics
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(9, 3.2))
    for label in labels:
        hist = sorted(client.get_metric_history(run_id, _key(label, "loss")), key=lambda m: m.step)
        ax.plot([m.step for m in hist], [m.value for m in hist], marker="o", ms=3, label=label)
    ax.set_xlabel("epoch")
    ax.set_ylabel("training loss")
    ax.legend()
    keys = [k for k in ("top1", "top5", "r2") if _key(labels[0], k) in metrics]
    width = 0.8 / len(labels)
    for i, label in enumerate(labels):
        bx.bar(
            [j + i * width for j in range(len(keys))],
            [metrics.get(_key(label, k), 0.0) for k in keys],
            width,
            label=label,
        )
    bx.set_xticks([j + 0.4 - width / 2 for j in range(len(keys))], keys)
    bx.set_ylabel("validation (higher is better)")
    bx.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _finished(ev) -> dict:
    m = ev.found.data.metrics
    results = {
        label: {k: m[_key(label, k)] for k in METRIC_KEYS if _key(label, k) in m}
        for label in ("pretrained", "random")
        if any(_key(label, k) in m for k in METRIC_KEYS)
    }
    print(
        f"[finetune] {ev.name} finished before (MLflow run {ev.found.info.run_id}); nothing to run. Its results:",
        flush=True,
    )
    if results:
        print(_table(results), flush=True)
    return results
