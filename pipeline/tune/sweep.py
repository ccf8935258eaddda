"""The sweep driver behind jobs/tune.py: run the trials on Ray Tune, each trial a pretraining run
(pipeline.tune.trial), tracked in MLflow as children of one sweep run. The command line, the checks and the data
before it are pipeline.tune.sweep_job's.

A sweep has an identity (settings.sweep_name) and a lock, like a pretraining run: rerunning an interrupted sweep
restores Tune's experiment (finished trials kept, unfinished ones resumed from their Train checkpoints);
rerunning a finished one prints its results and logs nothing. The results (rows, child runs closed, table, plot,
best trial) are pipeline.tune.results'.
"""

from __future__ import annotations

import os
import time

import mlflow
import pyarrow.fs as pafs

from pipeline import mlflow_ui, tracking
from pipeline.cluster import cluster_address, init_ray, quiet_logs
from pipeline.config import to_yaml
from pipeline.cores import cores
from pipeline.fields import Checked
from pipeline.plan import RunPlan
from pipeline.sections import Config
from pipeline.train import resources
from pipeline.train.artifacts import log_gallery
from pipeline.train.run_lock import run_lock
from pipeline.train.spec import PretrainSpec
from pipeline.tune.results import _close_children, _finished, _log, _report, _rows
from pipeline.tune.settings import SweepSpec
from pipeline.tune.space import Dim, num_trials, to_tune


def run_sweep(spec: SweepSpec, argv: list[str], dims: list[Dim], plan: RunPlan) -> dict:
    """Run (or resume, or report) the sweep; returns {"run_id", "rows", "best", "baseline", "text", "table", "plot"}
    (rows and table are None for a sweep that finished before; best is None when no trial finished)."""
    quiet_logs(spec.verbose)
    name, store = spec.name, spec.store
    with run_lock(spec.runs, name):
        found = tracking.find_run(tracking.setup(store), name)
        if found is not None and found.info.status == "FINISHED":
            return _finished(spec, found)
        if found is not None:
            _log(f"resuming sweep {name} (MLflow run {found.info.run_id}, {found.info.status})")
        init_ray(spec.trainer, spec.verbose, trials=spec.sweep.max_concurrent_trials)
        asked = _check_room(spec)
        run_id = tracking.start_or_resume(store, name, name, job="tune")
        try:
            out = _run(spec, argv, dims, plan, run_id)
        except BaseException as e:
            status = tracking.end_failed(e)
            _log(f"MLflow run {run_id} ended {status}: {tracking.error_line(e)}")
            raise
        finally:
            if asked:  # the autoscaler may remove the sweep's nodes once they idle
                resources.withdraw_request(_log)
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
                f"its MLflow run's errors/ and Tune's error.txt under {spec.storage}/{name}); rerun "
                f"the same command to retry them"
            )
        else:
            mlflow.end_run()
    return out


def _check_room(spec: SweepSpec) -> bool:
    """On a joined cluster, sweep.max_concurrent_trials Train runs at once must fit its nodes (a private local
    cluster was checked against this machine's cores before Ray started: settings._check_local_room). True when
    it asked an autoscaler for them (the sweep withdraws the request at its end)."""
    tr = spec.trainer
    return bool(cluster_address(tr)) and resources.check_resources(
        tr, log=_log, trials=spec.sweep.max_concurrent_trials
    )


def _threads(spec: SweepSpec, dims: list[Dim]) -> int:
    """Torch threads per worker: this machine's cores shared by every worker of every concurrent trial (no more
    trials run at once than the sweep has: a one-trial sweep's workers get every core, as pretrain's do)."""
    s = spec.sweep
    concurrent = min(s.max_concurrent_trials, num_trials(dims, s.num_samples))
    return max(1, cores() // (concurrent * spec.trainer["num_workers"]))


def _run(spec: SweepSpec, argv: list[str], dims: list[Dim], plan: RunPlan, run_id: str) -> dict:
    """The sweep inside its open MLflow run."""
    s, name, cfg = spec.sweep, spec.name, spec.config
    uri = tracking.tracking_uri(spec.store)
    if not mlflow.get_run(run_id).data.params:  # what the sweep was made from, as its config has it
        mlflow.log_params(
            {
                **{f"sweep.{k}": v for k, v in cfg["sweep"].items() if k not in ("space", "sizes")},
                **{f"space.{d.key}": d.describe() for d in dims},
                "command": " ".join(argv),
            }
        )
        mlflow.log_text(to_yaml(cfg), "config.yaml")
        # the data every trial trains on, on the sweep's own page too
        mlflow_ui.log_datasets(cfg["data"], plan.num_train_samples)
        if cfg["gallery"]["at_pretrain"]:
            log_gallery(PretrainSpec.of(Checked.of(Config, cfg)))
    total = num_trials(dims, s.num_samples)
    _log(
        f"sweep {name}: {total} trial(s) of {s.metric} ({s.mode}), {s.scheduler.upper()}, "
        f"{s.max_concurrent_trials} at a time; MLflow run {run_id} in {uri}"
    )
    t0 = time.monotonic()
    setup = {
        "argv": argv,
        "sweep_run": name,
        "root": spec.root,
        "parent_run_id": run_id,
        "threads": _threads(spec, dims),
        "tracking_uri": uri,
    }
    grid = _tuner(spec, dims, setup).fit()
    minutes = (time.monotonic() - t0) / 60
    interrupted = grid.num_terminated + grid.num_errors < max(len(grid), total)
    rows = _rows(grid, spec, dims, interrupted)
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
    return {**_report(spec, argv, dims, rows, run_id, minutes), "interrupted": False}


def _move(src: str, dst: str) -> None:
    """Rename a folder on local disk or on object storage (trainer.storage=s3://...)."""
    if "://" not in src:
        os.rename(src, dst)
        return
    fs, from_path = pafs.FileSystem.from_uri(src)
    pafs.copy_files(src, dst)  # object stores rename files, not folders: copy, then delete
    fs.delete_dir(from_path)


def _tuner(spec: SweepSpec, dims: list[Dim], setup: dict):
    """A new Tune experiment, or the interrupted one restored from trainer.storage/<sweep name>."""
    # Ray loads here, for a sweep that trains: a finished sweep's rerun reports its results without it
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, TrialScheduler
    from ray.tune.search.basic_variant import BasicVariantGenerator

    from pipeline.tune.console import Console
    from pipeline.tune.scheduler_state import SchedulerState
    from pipeline.tune.trial import CLOCK, run_trial

    s, name, storage = spec.sweep, spec.name, spec.storage
    if not spec.verbose:  # Tune's status tables and "View detailed results here": the Console says enough
        os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    # The trial itself only drives its Train run (the workers hold the CPUs): no CPU of its own, a token of the head
    # node's resource so Tune places it there, beside the sweep's driver: its log and probe go under paths.root
    # there, and a worker node lost (a spot instance, a scale-down) takes only Train workers, which Train restarts,
    # never a trial's driver. A token CPU (0.01) left a 4-CPU head 0.99 CPU beside a 3-CPU worker, and Ray Data's
    # read task, which asks 1, then never ran: the trial hung.
    trainable = tune.with_resources(
        tune.with_parameters(run_trial, setup=setup), {"cpu": 0, "node:__internal_head__": 0.01}
    )
    path = f"{storage.rstrip('/')}/{name}"
    if tune.Tuner.can_restore(path):
        _log(f"restoring the Tune experiment {path}: finished trials are kept, the others resume")
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
    if s.scheduler == "asha":
        # its rungs fall on the epochs before the last; the last epoch's result has no clock (trial.ForwardToTune)
        scheduler = ASHAScheduler(
            time_attr=CLOCK,
            metric=s.stop_metric,
            mode=s.stop_mode,
            max_t=spec.epochs,
            grace_period=s.grace_period,
            reduction_factor=s.reduction_factor,
        )
    else:
        scheduler = FIFOScheduler()
    return tune.Tuner(
        trainable,
        param_space=to_tune(dims),
        # the generator itself limits the trials in flight (Tune ignores TuneConfig.max_concurrent_trials when it
        # is handed a generator), and its random_state makes the draws the same on every run of the command
        tune_config=tune.TuneConfig(
            num_samples=s.num_samples,
            scheduler=scheduler,
            search_alg=BasicVariantGenerator(random_state=s.seed, max_concurrent=s.max_concurrent_trials),
            trial_dirname_creator=lambda t: t.trial_id,
        ),
        run_config=tune.RunConfig(
            name=name,
            storage_path=storage,
            verbose=1 if spec.verbose else 0,
            # ASHA's rungs saved with the experiment, so that a restored sweep judges its next trials as before
            callbacks=[Console(spec.epochs, s.metric, s.stop_metric), SchedulerState(scheduler)],
        ),
    )
