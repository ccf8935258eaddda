"""The pretraining run: start or resume the MLflow run, fit a Ray Train TorchTrainer, log its artifacts
(pipeline.train.artifacts), run the linear probe. The command line and the checks before it are
pipeline.train.pretrain_job's; a sweep's trials (pipeline.tune.trial) and the reproductions call `pretrain`."""

from __future__ import annotations

import os
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Mapping

import mlflow

from pipeline import mlflow_ui, tracking
from pipeline.build import plugin_notes
from pipeline.cluster import init_ray, quiet_logs
from pipeline.config import to_yaml
from pipeline.data.reader import train_dataset
from pipeline.disk_space import DiskFull, check_space, checkpoint_bytes, full_disk_line, is_disk_full
from pipeline.eval.probe import compare as run_probe
from pipeline.fields import Checked
from pipeline.plan import RunPlan
from pipeline.sections import Config
from pipeline.train import resources
from pipeline.train.artifacts import (
    describe_pretrain,
    log_checkpoint,
    log_curves,
    log_gallery,
    print_summary,
    report_finished,
)
from pipeline.train.prepare import resolve
from pipeline.train.run_lock import last_end, record_end, run_lock
from pipeline.train.spec import PretrainSpec
from pipeline.worker_check import check_workers_see


def _log(msg: str) -> None:
    print(f"[pretrain] {msg}", flush=True)


@dataclass(frozen=True)
class Trial:
    """A pretraining run as one trial of a sweep (pipeline.tune): its MLflow run is a child of the sweep's, its
    Train results go to Tune through `callbacks`, and it leaves out what every trial would repeat (the views
    gallery, the exported model, the random-init probe: the sweep logs those once)."""

    parent_run_id: str
    trial_id: str
    label: str  # the trial's values in short, its MLflow run name
    callbacks: tuple = field(default=())


def build_trainer(spec: PretrainSpec, plan: RunPlan, callbacks: tuple = ()):
    # Ray loads here, for a run that trains: a finished run's rerun reports its results without it
    import ray.train
    from ray.train.torch import TorchTrainer

    from pipeline.train.loop import train_loop_per_worker

    # Train V2 routes workers' print() through its logger as well, which shows every line twice on the
    # console; plain prints are enough (the driver propagates this variable to the workers).
    os.environ.setdefault("RAY_TRAIN_ENABLE_PRINT_PATCH", "0")
    tr = spec.trainer
    # Ray Data hands blocks to whichever worker asks first; keeping their order makes each worker's batches a
    # function of the seed alone (the same curve on 1 node x 2 workers and 2 nodes x 1), at some throughput
    with warnings.catch_warnings():  # Ray's own default sets the option it calls deprecated (Ray 2.60)
        warnings.filterwarnings("ignore", message=".*exclude_resources.*deprecated")
        ingest = ray.train.DataConfig.default_ingest_options()
    ingest.preserve_order = spec.train.deterministic_data
    return TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"spec": spec, "plan": plan},
        scaling_config=ray.train.ScalingConfig(
            num_workers=tr.num_workers,
            use_gpu=tr.use_gpu,
            resources_per_worker=resources.worker_bundle(spec.config["trainer"]),
            placement_strategy=tr.placement_strategy,
        ),
        # ray.train re-exports Train V2's RunConfig at runtime (it takes logging_config); mypy sees V1's
        run_config=ray.train.RunConfig(  # type: ignore[call-arg]
            name=spec.name,
            storage_path=tr.storage,
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=2),
            failure_config=ray.train.FailureConfig(max_failures=tr.max_failures),
            # Train's own console lines, its "Reporting training result ..." and its copies (tracebacks) of an error
            # the job reports in one line of its own: verbose=true only (Ray's session logs keep them all)
            logging_config=ray.train.LoggingConfig(log_level="INFO" if spec.verbose else "CRITICAL"),
            callbacks=list(callbacks),
        ),
        datasets={"train": train_dataset(spec.data.train, seed=spec.seed)},
        dataset_config=ray.train.DataConfig(execution_options=ingest),
    )


def pretrain(cfg: dict, plan: RunPlan | None = None, trial: Trial | None = None) -> dict:
    """Run (or resume) one pretraining job end to end; returns {"run_id", "checkpoint", "probe"}.

    The run is the config's hash (or run.name). One process at a time holds it (run_lock, before Ray or
    MLflow is touched); a run MLflow has as FINISHED is not trained again: its results are printed (probed
    first if it never was and eval.probe.after_pretrain asks for it). A FAILED, KILLED or interrupted one
    resumes from its last checkpoint into the same MLflow run. Any error after the MLflow run opened ends it
    FAILED (KILLED on Ctrl-C or SIGTERM) with the error recorded (tracking.end_failed). As a sweep's `trial`,
    its MLflow run is a child of the sweep's run."""
    if plan is None:  # resolve() not run yet: the config is checked and completed, the data made
        plan = resolve(cfg)
    # the config is complete (named, the method's settings settled): from here on the run reads the spec alone
    spec = PretrainSpec.of(Checked.of(Config, cfg))
    quiet_logs(spec.verbose)
    name = spec.name
    ckpt = _checkpoint_size(spec.config)
    if ckpt:  # before the lock, the store and Ray: a run whose first checkpoints cannot fit is refused in one line
        check_space(spec.trainer.storage, str(spec.runs), ckpt, warn=_log)
    with run_lock(spec.runs, name):
        found = tracking.find_run(tracking.setup(spec.store), name)
        if found is not None and found.info.status == "FINISHED":
            return report_finished(spec, found)
        if found is not None:  # FAILED, KILLED, or RUNNING: left so by a job killed outright (we hold the lock)
            last = last_end(spec.runs, name)  # what a job that could not write the store left beside its lock
            why = found.data.tags.get("error") or (
                (f"its last job failed: {last}" if last else "its job ended without a status (killed?)")
                if found.info.status == "RUNNING"
                else ""
            )
            status = found.info.status + (f": {why}" if why else "")
            _log(f"resuming run {name} (MLflow run {found.info.run_id}, {status})")
        init_ray(spec.config["trainer"], spec.verbose)
        # an outside method or plug-in the nodes cannot load: one line, before any MLflow run
        check_workers_see(spec.method.kind, spec.config.get("plugin") or {})
        # before any MLflow run: a job that cannot start leaves none (nor one whose probe's actors cannot be placed)
        if spec.probe is not None:
            run_probe.check_probe_actors(spec.probe)
        # a job waits for room other jobs hold; a sweep's trial does not: Tune reserved its workers' room already
        free = resources.free_resources if trial is None else None
        asked = resources.check_resources(spec.config["trainer"], log=_log, free=free)
        record_end(spec.runs, name, "")
        try:
            out = _run(spec, plan, trial, ckpt)
        finally:
            if asked:  # the autoscaler may remove the job's nodes once they idle
                resources.withdraw_request(_log)
    return out


def _checkpoint_size(config: Mapping[str, Any]) -> int | None:
    """One checkpoint's bytes (disk_space.checkpoint_bytes), or None where the model cannot be built here."""
    try:
        return checkpoint_bytes(config)
    except Exception:  # noqa: BLE001 - an estimate only: the run's own build says what is wrong
        return None


def _run(spec: PretrainSpec, plan: RunPlan, trial: Trial | None, ckpt: int | None = None) -> dict:
    """Open (or resume) the job's MLflow run and train in it; any error ends the run FAILED (KILLED on Ctrl-C)."""
    if trial is None:
        run_id = tracking.start_or_resume(spec.store, spec.name, spec.name, job="pretrain")
    else:
        run_id = tracking.start_child(
            trial.parent_run_id, spec.name, trial.label, job="tune-trial", tags={"tune_trial_id": trial.trial_id}
        )
    try:
        out = _train_and_log(spec, plan, run_id, trial)
    except BaseException as e:
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            # Ctrl-C: Ray Train aborts the run gracefully; checkpoints already reported stay usable
            _log("interrupted: the last reported checkpoint stays usable; rerun the same command to resume")
        full = is_disk_full(e)
        folders = {"trainer.storage": spec.trainer.storage, "paths.runs": str(spec.runs), "tmp": tempfile.gettempdir()}
        line = full_disk_line(e, folders, ckpt or 0) if full else tracking.error_line(e)
        record_end(spec.runs, spec.name, line)  # in space reserved at the start: readable when the store is not
        status = tracking.end_failed(e, line=line)
        if full:
            raise DiskFull(line) from None
        _log(f"MLflow run {run_id} ended {status}: {line}")
        raise
    mlflow.end_run()
    return out


def _train_and_log(spec: PretrainSpec, plan: RunPlan, run_id: str, trial: Trial | None = None) -> dict:
    """The job's body inside its open MLflow run: params, gallery, fit, curves, checkpoint and backbone, probe."""
    uri = tracking.tracking_uri(spec.store)
    # the workers log into this run; a terminal gets progress bars, a file (ray job logs, CI) plain lines
    plan = plan.opened(run_id, uri, trial.label if trial else None, sys.stdout.isatty())
    _log(f"run {spec.name}  mlflow run {run_id}  store {uri}")
    notes = plugin_notes(spec.method.kind, spec.config.get("plugin") or {})
    for line in notes:  # a plug-in on a framework its paper did not define it on: said, and recorded on the run
        _log(f"notice: {line}")
    if notes:
        mlflow.set_tag("plugin_notes", "\n".join(notes))
    if not mlflow.get_run(run_id).data.params:  # what the run was made from, as the config has it
        cfg = dict(spec.config)
        mlflow.log_params(tracking.flatten(cfg))
        mlflow.log_text(to_yaml(cfg), "config.yaml")
        datasets = mlflow_ui.log_datasets(cfg["data"], plan.num_train_samples)
        mlflow_ui.set_description(run_id, describe_pretrain(spec, datasets, trial.label if trial else None))
        if spec.gallery.at_pretrain and trial is None:
            log_gallery(spec)

    t0 = time.monotonic()
    result = build_trainer(spec, plan, trial.callbacks if trial else ()).fit()
    if result.checkpoint is None:
        raise RuntimeError("training produced no checkpoint")
    minutes = (time.monotonic() - t0) / 60
    _log(f"training finished in {minutes:.1f} min; checkpoint {result.checkpoint.path}")
    mlflow.log_metric("train/minutes", minutes)
    log_curves(spec, run_id, uri)
    ckpt_dir = log_checkpoint(result.checkpoint, spec, model=trial is None)
    out: dict[str, Any] = {"run_id": run_id, "checkpoint": str(ckpt_dir), "probe": None}
    if spec.probe is not None:
        out["probe"] = run_probe.compare_with_random(
            spec.probe, ckpt_dir, run_name=spec.name, baseline=None if trial is None else False
        )
    metrics = mlflow.get_run(run_id).data.metrics
    mlflow_ui.append_description(run_id, mlflow_ui.describe_results(metrics, out["probe"], minutes))
    if trial is None:
        print_summary(spec, run_id, uri, ckpt_dir, minutes)
    return out
