"""The sweep driver behind jobs/tune.py: check everything, make the data once, then run the trials on Ray Tune,
each trial a pretraining run (pipeline.tune.trial), tracked in MLflow as children of one sweep run.

A sweep has an identity (settings.sweep_name) and a lock, like a pretraining run: rerunning an interrupted sweep
restores Tune's experiment (finished trials kept, unfinished ones resumed from their Train checkpoints);
rerunning a finished one prints its results and logs nothing.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

from pipeline.config import ConfigError, to_yaml
from pipeline.plan import RunPlan
from pipeline.train.run_lock import RunBusy, run_lock
from pipeline.tune.settings import check_sweep, compose_sweep, sweep_name
from pipeline.tune.space import Dim, num_trials, short

TABLE, PLOT, BEST = "sweep/table.md", "sweep/sweep.png", "sweep/best.yaml"


def _log(msg: str) -> None:
    print(f"[tune] {msg}", flush=True)


def prepare(argv: list[str]) -> tuple[dict, list[str], list[Dim], RunPlan]:
    """Compose and check the sweep, make its data; (base config, the sweep's command line, dimensions, the base
    config's plan: each trial makes its own).
    ConfigError with one line on bad input, before Ray or MLflow is touched."""
    from pipeline.train.prepare import resolve

    cfg, full = compose_sweep(argv)
    dims = check_sweep(cfg, full)
    cfg["run"]["name"] = sweep_name(cfg)
    plan = resolve(cfg)  # validates again, makes the Spirograph data once for every trial, checks the shards
    return cfg, full, dims, plan


def run_sweep(cfg: dict, argv: list[str], dims: list[Dim], plan: RunPlan) -> dict:
    """Run (or resume, or report) the sweep; returns {"run_id", "rows", "best", "baseline", "text", "table", "plot"}
    (rows and table are None for a sweep that finished before; best is None when no trial finished)."""
    import mlflow

    from pipeline import tracking
    from pipeline.cluster import init_ray, quiet_logs

    quiet_logs(cfg)
    name, s = cfg["run"]["name"], cfg["sweep"]
    with run_lock(cfg):
        found = tracking.find_run(tracking.setup(cfg), name)
        if found is not None and found.info.status == "FINISHED":
            return _finished(cfg, found)
        if found is not None:
            _log(f"resuming sweep {name} (MLflow run {found.info.run_id}, {found.info.status})")
        init_ray(cfg, trials=s["max_concurrent_trials"])
        asked = _check_room(cfg)
        run_id = tracking.start_or_resume(cfg, name, name, job="tune")
        try:
            out = _run(cfg, argv, dims, plan, run_id)
        except BaseException as e:
            status = tracking.end_failed(e)
            _log(f"MLflow run {run_id} ended {status}: {tracking.error_line(e)}")
            raise
        finally:
            if asked:  # the autoscaler may remove the sweep's nodes once they idle
                from pipeline.train.resources import withdraw_request

                withdraw_request(_log)
        failed = [r for r in out["rows"] if r["status"].startswith("failed")]
        if out.get("interrupted"):
            mlflow.end_run(status="KILLED")
            _log("interrupted: rerun the same command to resume the sweep")
        elif failed:  # FAILED, so the same command retries them (from their checkpoints) instead of reporting
            mlflow.set_tag(
                "error",
                f"{len(failed)} trial(s) failed; trial {failed[0]['trial']}: {failed[0]['status'][len('failed: ') :]}",
            )
            mlflow.end_run(status="FAILED")
            _log(
                f"{len(failed)} trial(s) failed (each trial's output: runs/sweep/{name}/<trial id>.log; its error: "
                f"its MLflow run's errors/ and Tune's error.txt under {cfg['trainer']['storage']}/{name}); rerun "
                f"the same command to retry them"
            )
        else:
            mlflow.end_run()
    return out


def _check_room(cfg: dict) -> bool:
    """On a joined cluster, sweep.max_concurrent_trials Train runs at once must fit its nodes (a private local
    cluster was checked against this machine's cores before Ray started: settings._check_local_room). True when
    it asked an autoscaler for them (the sweep withdraws the request at its end)."""
    from pipeline.cluster import cluster_address
    from pipeline.train.resources import check_resources

    tr = cfg["trainer"]
    return bool(cluster_address(tr)) and check_resources(tr, log=_log, trials=cfg["sweep"]["max_concurrent_trials"])


def _threads(cfg: dict, dims: list[Dim]) -> int:
    """Torch threads per worker: this machine's cores shared by every worker of every concurrent trial (no more
    trials run at once than the sweep has: a one-trial sweep's workers get every core, as pretrain's do)."""
    s = cfg["sweep"]
    concurrent = min(s["max_concurrent_trials"], num_trials(dims, s["num_samples"]))
    return max(1, (os.cpu_count() or 1) // (concurrent * cfg["trainer"]["num_workers"]))


def _run(cfg: dict, argv: list[str], dims: list[Dim], plan: RunPlan, run_id: str) -> dict:
    import mlflow

    from pipeline import mlflow_ui, tracking
    from pipeline.train.artifacts import log_gallery

    s, name = cfg["sweep"], cfg["run"]["name"]
    uri = tracking.tracking_uri(cfg)
    if not mlflow.get_run(run_id).data.params:
        mlflow.log_params(
            {
                **{f"sweep.{k}": v for k, v in s.items() if k not in ("space", "sizes")},
                **{f"space.{d.key}": d.describe() for d in dims},
                "command": " ".join(argv),
            }
        )
        mlflow.log_text(to_yaml(cfg), "config.yaml")
        mlflow_ui.log_datasets(
            cfg, plan.num_train_samples
        )  # the data every trial trains on, on the sweep's own page too
        if cfg["gallery"]["at_pretrain"]:
            log_gallery(cfg)
    total = num_trials(dims, s["num_samples"])
    _log(
        f"sweep {name}: {total} trial(s) of {s['metric']} ({s['mode']}), {s['scheduler'].upper()}, "
        f"{s['max_concurrent_trials']} at a time; MLflow run {run_id} in {uri}"
    )
    t0 = time.monotonic()
    setup = {
        "argv": argv,
        "sweep_run": name,
        "root": cfg["paths"]["root"],
        "parent_run_id": run_id,
        "threads": _threads(cfg, dims),
        "tracking_uri": uri,
    }
    grid = _tuner(cfg, dims, setup).fit()
    minutes = (time.monotonic() - t0) / 60
    interrupted = grid.num_terminated + grid.num_errors < max(len(grid), total)
    rows = _rows(grid, cfg, dims, interrupted)
    _close_children(uri, run_id, rows)
    if interrupted:  # no table or plot of a sweep half run: the rerun resumes it and reports
        return {
            "run_id": run_id,
            "rows": rows,
            "best": None,
            "baseline": None,
            "text": None,
            "table": None,
            "plot": None,
            "interrupted": True,
        }
    return {**_report(cfg, argv, dims, rows, run_id, minutes), "interrupted": False}


def _move(src: str, dst: str) -> None:
    """Rename a folder on local disk or on object storage (trainer.storage=s3://...)."""
    if "://" not in src:
        os.rename(src, dst)
        return
    import pyarrow.fs as pafs

    fs, from_path = pafs.FileSystem.from_uri(src)
    pafs.copy_files(src, dst)  # object stores rename files, not folders: copy, then delete
    fs.delete_dir(from_path)


def _tuner(cfg: dict, dims: list[Dim], setup: dict):
    """A new Tune experiment, or the interrupted one restored from trainer.storage/<sweep name>."""
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, TrialScheduler
    from ray.tune.search.basic_variant import BasicVariantGenerator

    from pipeline.tune.console import Console
    from pipeline.tune.space import to_tune
    from pipeline.tune.trial import CLOCK, run_trial

    s, name, storage = cfg["sweep"], cfg["run"]["name"], cfg["trainer"]["storage"]
    if not cfg.get("verbose"):  # Tune's status tables and "View detailed results here": the Console says enough
        os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    # The trial itself only drives its Train run (the workers hold the CPUs): a token of CPU so Tune can place it,
    # on the head, beside the sweep's driver: its log and probe go under paths.root there, and a worker node lost
    # (a spot instance, a scale-down) takes only Train workers, which Train restarts, never a trial's driver.
    trainable = tune.with_resources(
        tune.with_parameters(run_trial, setup=setup), {"cpu": 0.01, "node:__internal_head__": 0.01}
    )
    path = f"{storage.rstrip('/')}/{name}"
    if tune.Tuner.can_restore(path):
        _log(
            f"restoring the Tune experiment {path}: finished trials are kept, the others resume "
            f"(ASHA's rungs start empty again: Tune does not save a scheduler's state)"
        )
        try:
            return tune.Tuner.restore(path, trainable, resume_unfinished=True, resume_errored=True)
        except (ValueError, RuntimeError, FileNotFoundError) as e:  # killed before Tune saved its first state
            aside = f"{path}.unrestorable-{time.strftime('%Y%m%d-%H%M%S')}"
            _log(
                f"it cannot be restored ({type(e).__name__}: {str(e).splitlines()[0][:200]}); moved to {aside}, "
                f"starting it afresh"
            )
            _move(path, aside)
    scheduler: TrialScheduler
    if s["scheduler"] == "asha":
        # its rungs fall on the epochs before the last; the last epoch's result has no clock (trial.ForwardToTune)
        scheduler = ASHAScheduler(
            time_attr=CLOCK,
            metric=s["stop_metric"],
            mode=s["stop_mode"],
            max_t=cfg["train"]["epochs"],
            grace_period=s["grace_period"],
            reduction_factor=s["reduction_factor"],
        )
    else:
        scheduler = FIFOScheduler()
    return tune.Tuner(
        trainable,
        param_space=to_tune(dims),
        # the generator itself limits the trials in flight (Tune ignores TuneConfig.max_concurrent_trials when it
        # is handed a generator), and its random_state makes the draws the same on every run of the command
        tune_config=tune.TuneConfig(
            num_samples=s["num_samples"],
            scheduler=scheduler,
            search_alg=BasicVariantGenerator(random_state=s["seed"], max_concurrent=s["max_concurrent_trials"]),
            trial_dirname_creator=lambda t: t.trial_id,
        ),
        run_config=tune.RunConfig(
            name=name,
            storage_path=storage,
            verbose=1 if cfg.get("verbose") else 0,
            callbacks=[Console(cfg["train"]["epochs"], s["metric"], s.get("stop_metric"))],
        ),
    )


def _rows(grid, cfg: dict, dims: list[Dim], interrupted: bool) -> list[dict]:
    from pipeline import tracking
    from pipeline.tune.trial import TRAINED, trial_number

    s, epochs = cfg["sweep"], cfg["train"]["epochs"]
    curve_metric = _curve_metric(cfg)
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
                "metric": m.get(s["metric"]) if status == "done" else None,
                "curve": curve,
            }
        )
    return rows


def _curve_metric(cfg: dict) -> str:
    """The per-epoch metric the plot follows: ASHA's, else the kNN monitor's, else the loss."""
    if cfg["sweep"].get("stop_metric"):
        return cfg["sweep"]["stop_metric"]
    from pipeline.tune.space import reported_metrics

    epoch, _ = reported_metrics(cfg)
    knn = sorted(k for k in epoch if k in ("knn_r2", "knn_top1"))
    return knn[0] if knn else "epoch_loss"


def _close_children(uri: str, parent: str, rows: list[dict]) -> None:
    """Trial runs the scheduler stopped end KILLED with the reason (also where their process, torn down
    mid-training, had ended them FAILED); a failed trial's run that its process could not close ends FAILED."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_run(parent).info.experiment_id
    children = client.search_runs([exp], filter_string=f"tags.`mlflow.parentRunId` = '{parent}'")
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


def _report(cfg: dict, argv: list[str], dims: list[Dim], rows: list[dict], run_id: str, minutes: float) -> dict:
    """The table, the plot and the best trial: printed, written under <paths.runs>/sweep/, logged to the parent."""
    import mlflow

    from pipeline.tune import report

    s, name = cfg["sweep"], cfg["run"]["name"]
    baseline = _random_baseline(cfg)
    out_dir = Path(cfg["paths"]["runs"]) / "sweep"
    text = report.table(rows, dims, s["metric"], s["mode"], baseline)
    table_path = out_dir / f"{name}.md"
    out_dir.mkdir(parents=True, exist_ok=True)
    table_path.write_text(f"# {name}\n\n{text}")
    plot_path = report.plot(
        rows,
        dims,
        s["metric"],
        s["mode"],
        out_dir / f"{name}.png",
        name,
        curve_metric=_curve_metric(cfg),
        baseline=baseline,
    )
    top = report.best(rows, s["mode"])
    mlflow.log_text(text, TABLE)
    with tempfile.TemporaryDirectory() as d:  # the same artifact name in every sweep's run
        mlflow.log_artifact(str(shutil.copy(plot_path, Path(d) / Path(PLOT).name)), "sweep")
    # under sweep/, as every job groups its metrics (train/, knn/, probe/, ...) for the UI's charts and search
    counts = {f"sweep/trials_{k}": sum(r["status"].startswith(k) for r in rows) for k in ("done", "stopped", "failed")}
    mlflow.log_metrics({**counts, "sweep/minutes": minutes})
    if baseline is not None:
        mlflow.log_metric(f"sweep/random_{s['metric']}", baseline)
    if top is not None:
        mlflow.log_metric(f"sweep/best_{s['metric']}", top["metric"])
        best = {
            "trial": top["trial_id"],
            "mlflow_run_id": top.get("run_id"),
            s["metric"]: top["metric"],
            "params": top["params"],
            "command": _pretrain_command(argv, top["params"]),
        }
        mlflow.log_text(to_yaml(best), BEST)
    print(f"\n{text}", flush=True)
    print(f"Done: sweep {name}, {len(rows)} trial(s) in {minutes:.1f} min.", flush=True)
    print(f"  table  {table_path}\n  plot   {plot_path}\n  MLflow run {run_id} (its trials are child runs)", flush=True)
    if top is not None:
        print(f"  best   trial {top['trial']}: {short(top['params'])} -> {s['metric']}={top['metric']:.4g}", flush=True)
    return {
        "run_id": run_id,
        "rows": rows,
        "best": top,
        "baseline": baseline,
        "text": text,
        "table": table_path,
        "plot": plot_path,
    }


def _pretrain_command(argv: list[str], params: dict) -> str:
    from pipeline.tune.space import override

    return " ".join(["python jobs/pretrain.py", *argv, *[override(k, v) for k, v in params.items()]])


def _random_baseline(cfg: dict) -> float | None:
    """The sweep's metric for a random-init backbone under the same linear probe (once per sweep, not per trial);
    None for metrics other than the plain probe's."""
    metric = cfg["sweep"]["metric"]
    prefix = "probe_pretrained_"
    if not metric.startswith(prefix) or metric.startswith(prefix + "fa_"):
        return None
    from pipeline.eval.run_probe import probe_backbone, random_backbone

    _log("probing a random-init backbone once, as the sweep's baseline")
    return probe_backbone(random_backbone(cfg["model"], cfg["seed"]), cfg).get(metric[len(prefix) :])


def _finished(cfg: dict, run) -> dict:
    """A finished sweep found again: print its table and where its results are; train and log nothing."""
    import mlflow

    name, run_id = cfg["run"]["name"], run.info.run_id
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime((run.info.end_time or run.info.start_time) / 1000))
    _log(f"sweep {name} finished before (MLflow run {run_id}, {when}): nothing to run; its results:")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    try:
        text = mlflow.artifacts.load_text(f"runs:/{run_id}/{TABLE}")
    except Exception as e:  # noqa: BLE001  a store without the artifact: say so, do not rerun
        text = f"(its table could not be read: {type(e).__name__})"
    print(f"\n{text}", flush=True)
    plot = Path(cfg["paths"]["runs"]) / "sweep" / f"{name}.png"
    if plot.exists():
        print(f"  plot   {plot}", flush=True)
    print(f"  MLflow run {run_id}; sweep again under another name with sweep.name=<name>", flush=True)
    metric = cfg["sweep"]["metric"]
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
    import mlflow
    import yaml

    try:
        best = yaml.safe_load(mlflow.artifacts.load_text(f"runs:/{run_id}/{BEST}"))
    except Exception:  # noqa: BLE001  no trial finished, or a store without the artifact
        return None
    return {"params": best["params"], "metric": best[metric], "trial_id": best["trial"]}


def main(argv: list[str]) -> int:
    from pipeline.config import fail

    try:
        run_sweep(*prepare(argv))
    except (ConfigError, RunBusy) as e:
        fail(str(e))
    return 0
