"""A sweep's results, once Tune is done (pipeline.tune.sweep runs it): each trial's row (status, metric, curve),
its MLflow child run closed as the trial ended, then the table, the plot and the best trial printed, written under
<paths.runs>/sweep/ and logged to the sweep's run; and a sweep that finished before, found again and reported
from what it logged. The table and plot themselves are pipeline.tune.report's.

mlflow, ray and torch are imported inside the functions that use them: jobs/tune.py imports this module (through
the sweep) before the command line is checked, which takes no more than the config's own imports.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import yaml

from pipeline.config import to_yaml
from pipeline.tune import report
from pipeline.tune.settings import SweepSpec
from pipeline.tune.space import Dim, override, searched, short

TABLE, PLOT, BEST = "sweep/table.md", "sweep/sweep.png", "sweep/best.yaml"


def _log(msg: str) -> None:
    print(f"[tune] {msg}", flush=True)


def _rows(grid, spec: SweepSpec, dims: list[Dim], interrupted: bool) -> list[dict]:
    from pipeline import tracking  # mlflow: see the module docstring
    from pipeline.tune.trial import TRAINED, trial_number  # ray: see the module docstring

    epochs, curve_metric = spec.epochs, _curve_metric(spec)
    rows = []
    for r in grid:
        m, trial = r.metrics or {}, Path(r.path).name
        if r.error is not None:
            status = f"failed: {tracking.error_line(r.error)[:200]}"
        elif m.get("final"):
            status = "done"
        elif interrupted:
            status = "unfinished"
        else:
            status = f"stopped at epoch {m.get(TRAINED, 0)}/{epochs}"
        curve = []
        df = r.metrics_dataframe
        if df is not None and curve_metric in df and TRAINED in df:
            per_epoch = df[df["final"] != 1] if "final" in df else df
            curve = [(int(e), float(v)) for e, v in zip(per_epoch[TRAINED], per_epoch[curve_metric])]
        rows.append(
            {
                "trial": trial_number(trial),
                "trial_id": trial,
                "params": dict(r.config or {}),
                "status": status,
                "metric": m.get(spec.sweep.metric) if status == "done" else None,
                "curve": curve,
            }
        )
    return rows


def _curve_metric(spec: SweepSpec) -> str:
    """The per-epoch metric the plot follows: ASHA's, else the kNN monitor's, else the loss."""
    if spec.sweep.stop_metric:
        return spec.sweep.stop_metric
    knn = sorted(k for k in spec.epoch_metrics if k in ("knn_r2", "knn_top1"))
    return knn[0] if knn else "epoch_loss"


def _close_children(uri: str, parent: str, rows: list[dict], settle_s: float = 20.0) -> None:
    """Trial runs the scheduler stopped end KILLED with the reason (also where their process, torn down
    mid-training, had ended them FAILED); a failed trial's run that its process could not close ends FAILED.

    A stopped trial's process can still be closing its run when Tune returns: its runs get up to `settle_s` seconds
    to leave RUNNING first, so that a late FAILED from that process does not overwrite the KILLED written here."""
    from mlflow.tracking import MlflowClient  # see the module docstring

    client = MlflowClient(uri)
    exp = client.get_run(parent).info.experiment_id
    stopped = {row["trial_id"] for row in rows if row["status"].startswith("stopped")}
    deadline = time.monotonic() + settle_s
    while True:
        children = client.search_runs([exp], filter_string=f"tags.`mlflow.parentRunId` = '{parent}'")
        closing = [c for c in children if c.data.tags.get("tune_trial_id") in stopped and c.info.status == "RUNNING"]
        if not closing or time.monotonic() >= deadline:
            break
        time.sleep(0.5)
    by_trial = {c.data.tags.get("tune_trial_id"): c for c in children}
    for row in rows:
        child = by_trial.get(row["trial_id"])
        if child is None:
            continue
        row["run_id"] = child.info.run_id
        if row["status"].startswith("stopped") and child.info.status in ("RUNNING", "FAILED"):
            # a stopped trial's process is usually ended mid-epoch, but it can also see the stop as an error
            # (the Train run under it torn down) and end its run FAILED first: either way it was stopped, not broken
            client.set_tag(child.info.run_id, "stopped_early", f"{row['status']} by ASHA")
            if child.info.status == "FAILED" and "error" in child.data.tags:
                client.set_tag(child.info.run_id, "stop_error", child.data.tags["error"])
                client.delete_tag(child.info.run_id, "error")
            client.set_terminated(child.info.run_id, "KILLED")
            continue
        if child.info.status != "RUNNING":
            continue
        if row["status"] == "unfinished":  # the sweep was interrupted; the rerun resumes this run
            client.set_terminated(child.info.run_id, "KILLED")
        elif row["status"].startswith("failed"):
            client.set_tag(child.info.run_id, "error", row["status"][len("failed: ") :])
            client.set_terminated(child.info.run_id, "FAILED")


def _report(spec: SweepSpec, argv: list[str], dims: list[Dim], rows: list[dict], run_id: str, minutes: float) -> dict:
    """The table, the plot and the best trial: printed, written under <paths.runs>/sweep/, logged to the parent."""
    import mlflow  # see the module docstring

    s, name = spec.sweep, spec.name
    baseline = _random_baseline(spec)
    out_dir = spec.runs / "sweep"
    text = report.table(rows, dims, s.metric, s.mode, baseline)
    chosen = searched(dims) if s.seeds > 1 else dims  # a seed searched by hand stays a searched key
    configs = report.by_config(rows, chosen, s.mode) if s.seeds > 1 else None
    if configs is not None:
        text += f"\nEach configuration over seeds 0-{s.seeds - 1}:\n\n" + report.seeded_table(configs, chosen, s.metric)
    table_path = out_dir / f"{name}.md"
    out_dir.mkdir(parents=True, exist_ok=True)
    table_path.write_text(f"# {name}\n\n{text}")
    plot_path = report.plot(
        rows,
        chosen,
        s.metric,
        s.mode,
        out_dir / f"{name}.png",
        name,
        curve_metric=_curve_metric(spec),
        baseline=baseline,
        configs=configs,
    )
    top = report.best(rows, s.mode) if configs is None else _best_config(configs)
    mlflow.log_text(text, TABLE)
    with tempfile.TemporaryDirectory() as d:  # the same artifact name in every sweep's run
        mlflow.log_artifact(str(shutil.copy(plot_path, Path(d) / Path(PLOT).name)), "sweep")
    # under sweep/, as every job groups its metrics (train/, knn/, probe/, ...) for the UI's charts and search
    counts = {f"sweep/trials_{k}": sum(r["status"].startswith(k) for r in rows) for k in ("done", "stopped", "failed")}
    mlflow.log_metrics({**counts, "sweep/minutes": minutes})
    if baseline is not None:
        mlflow.log_metric(f"sweep/random_{s.metric}", baseline)
    if top is not None:
        mlflow.log_metric(f"sweep/best_{s.metric}", top["metric"])
        best = {
            "trial": top["trial_id"],
            "mlflow_run_id": top.get("run_id"),
            s.metric: top["metric"],
            "params": top["params"],
            "command": _pretrain_command(argv, top["params"]),
            **({"seeds": top["seeds"], "interval": top["interval"]} if "seeds" in top else {}),
        }
        mlflow.log_text(to_yaml(best), BEST)
    print(f"\n{text}", flush=True)
    print(f"Done: sweep {name}, {len(rows)} trial(s) in {minutes:.1f} min.", flush=True)
    print(f"  table  {table_path}\n  plot   {plot_path}\n  MLflow run {run_id} (its trials are child runs)", flush=True)
    if top is not None and "seeds" in top:
        print(
            f"  best   {short(top['params'])}: {s.metric} mean {top['metric']:.4g} over seeds {top['seeds']}",
            flush=True,
        )
    elif top is not None:
        print(f"  best   trial {top['trial']}: {short(top['params'])} -> {s.metric}={top['metric']:.4g}", flush=True)
    return {
        "run_id": run_id,
        "rows": rows,
        "best": top,
        "baseline": baseline,
        "text": text,
        "table": table_path,
        "plot": plot_path,
    }


def _best_config(configs: list[dict]) -> dict | None:
    """A seeded sweep's best configuration (the best mean over its seeds) in the form of a best trial: its trials'
    numbers and run ids joined, its mean as the metric."""
    top = report.best_config(configs)
    if top is None:
        return None
    iv = top["interval"]
    return {
        "trial": top["trials"][0],
        "trial_id": ",".join(str(t) for t in top["trials"]),
        "run_id": ",".join(str(r) for r in top["run_ids"] if r) or None,
        "params": top["params"],
        "metric": iv.mean,
        "seeds": sorted(top["values"]),
        "interval": [iv.low, iv.high],
    }


def _pretrain_command(argv: list[str], params: dict) -> str:
    return " ".join(["python jobs/pretrain.py", *argv, *[override(k, v) for k, v in params.items()]])


def _random_baseline(spec: SweepSpec) -> float | None:
    """The sweep's metric for a random-init backbone under the same linear probe (once per sweep, not per trial);
    None for metrics other than the plain probe's."""
    metric = spec.sweep.metric
    prefix = "probe_pretrained_"
    if not metric.startswith(prefix) or metric.startswith(prefix + "fa_"):
        return None
    from pipeline.eval.probe.compare import probe_backbone, random_backbone  # torch: see the module docstring

    _log("probing a random-init backbone once, as the sweep's baseline")
    net = random_backbone(dict(spec.model), spec.probe.seed)
    return probe_backbone(net, spec.probe).get(metric[len(prefix) :])


def _finished(spec: SweepSpec, run) -> dict:
    """A finished sweep found again: print its table and where its results are; train and log nothing."""
    import mlflow  # see the module docstring

    name, run_id = spec.name, run.info.run_id
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime((run.info.end_time or run.info.start_time) / 1000))
    _log(f"sweep {name} finished before (MLflow run {run_id}, {when}): nothing to run; its results:")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    try:
        text = mlflow.artifacts.load_text(f"runs:/{run_id}/{TABLE}")
    except Exception as e:  # noqa: BLE001  a store without the artifact: say so, do not rerun
        text = f"(its table could not be read: {type(e).__name__})"
    print(f"\n{text}", flush=True)
    plot = spec.runs / "sweep" / f"{name}.png"
    if plot.exists():
        print(f"  plot   {plot}", flush=True)
    print(f"  MLflow run {run_id}; sweep again under another name with sweep.name=<name>", flush=True)
    metric = spec.sweep.metric
    return {
        "run_id": run_id,
        "rows": None,
        "best": _logged_best(run_id, metric),
        "baseline": run.data.metrics.get(f"sweep/random_{metric}"),
        "text": text,
        "table": None,
        "plot": plot,
    }


def _logged_best(run_id: str, metric: str) -> dict | None:
    """A finished sweep's best trial as _report logged it ({"params", "metric", "trial_id"}), or None."""
    import mlflow  # see the module docstring

    try:
        best = yaml.safe_load(mlflow.artifacts.load_text(f"runs:/{run_id}/{BEST}"))
    except Exception:  # noqa: BLE001  no trial finished, or a store without the artifact
        return None
    return {"params": best["params"], "metric": best[metric], "trial_id": best["trial"]}
