"""The run of jobs/linear_probe.py (its settings and checks: pipeline.eval.probe.job, which imports this module when
it runs): the probe of a pretraining run's backbone beside a random-init twin, logged into a child run of the run, or
a finished probe's results read back."""

from __future__ import annotations

import mlflow
from mlflow.tracking import MlflowClient

from pipeline import mlflow_ui, tracking
from pipeline.augment.view_makers import eval_settings
from pipeline.cluster import init_ray
from pipeline.config import ConfigError
from pipeline.eval.downstream import settings_key
from pipeline.eval.evaluation import Job
from pipeline.eval.job_errors import ProbeError
from pipeline.eval.job_settings import ProbeRequest
from pipeline.eval.probe.compare import check_probe_actors, compare_with_random, config_for_run, probe_solver
from pipeline.eval.probe.spec import ProbeSpec
from pipeline.eval.results import format_table, probe_results
from pipeline.eval.source import load_source
from pipeline.schema import validate


def run(job: Job[ProbeRequest]) -> dict:
    """Probe and log; returns compare_with_random's results (or the finished run's, read back)."""
    exp_id = tracking.setup(job.store)
    try:
        src = load_source(job.source)
    except FileNotFoundError as e:
        raise ProbeError(str(e)) from None
    try:
        cfg = config_for_run(job.own, src.cfg)
        # the run's sections with the command line's on top: one line, before anything is logged
        checked = validate(cfg)
    except (ValueError, ConfigError) as e:
        raise ProbeError(str(e)) from None
    spec = ProbeSpec.of(checked)
    parent = src.run_id
    parent_run = MlflowClient().get_run(parent) if parent else None

    # One child run per (checkpoint, data, probe settings)
    probe_eval = {k: v for k, v in cfg["eval"].items() if k != "knn"}
    # what is probed, not where: the checkpoint is the source, the actors place the extraction
    placing = ("checkpoint", "actors", "actor_resources")
    probe_eval["probe"] = {k: v for k, v in cfg["eval"]["probe"].items() if k not in placing}
    settings = {
        "source": src.ref,
        "data": cfg["data"],
        "augment": {k: v for k, v in cfg["augment"].items() if k != "fuse"},  # how views are made, not which
        "seed": cfg["seed"],
        "eval": probe_eval,
    }
    key = settings_key(settings)
    params = {
        "checkpoint": src.ref,
        "data.name": cfg["data"]["name"],
        "data.train": cfg["data"]["train"],
        "data.val": cfg["data"]["val"],
        "image_size": eval_settings(cfg["augment"])[0],
        **tracking.flatten(probe_eval, "eval."),
    }
    run_key = f"probe:{parent}:{key}" if parent_run is not None else f"probe:{key}"
    if parent_run is not None:
        exp_id = parent_run.info.experiment_id
    found = tracking.find_run(exp_id, run_key)
    if found is not None and found.info.status == "FINISHED":
        results = probe_results(found.data.metrics)
        print(
            f"[probe] {found.info.run_name} finished before (MLflow run {found.info.run_id}); nothing to run. "
            f"Its results:",
            flush=True,
        )
        print(format_table({k: v for k, v in results.items() if k != "invariance"}), flush=True)
        return results
    if probe_solver(spec) == "sgd":  # before the run is made: Ray Data's actors, can they be placed?
        init_ray(cfg["trainer"], bool(cfg.get("verbose")))
        try:
            check_probe_actors(spec)
        except ConfigError as e:
            raise ProbeError(str(e)) from None
    if parent_run is not None:
        name = f"{parent_run.info.run_name}-probe-{key[:6]}"
        assert parent is not None  # parent_run is its run
        run_id = tracking.start_child(parent, run_key, name, job="linear_probe")
    else:
        name = f"probe-{cfg['data']['name']}-{key[:6]}"
        run_id = tracking.start_or_resume(job.store, run_key, name, job="linear_probe")
    try:
        if found is None:
            mlflow.log_params(params)
            mlflow_ui.log_datasets(cfg["data"])  # the splits it probed on, as the run page's dataset inputs
        results = compare_with_random(spec, src.state, run_name=name)  # the SGD probe starts Ray itself
    except (FloatingPointError, ValueError) as e:  # a diverging probe, data without decodable images
        tracking.end_failed(e)
        raise ProbeError(str(e)) from None
    except BaseException as e:
        tracking.end_failed(e)
        raise
    mlflow.end_run()
    where = f" (a child of run {parent_run.info.run_name}, {parent})" if parent_run is not None else ""
    print(f"mlflow run {run_id}{where}")
    return results
