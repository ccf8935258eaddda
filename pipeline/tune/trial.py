"""One trial of a sweep: a pretraining run of the same driver and loop as jobs/pretrain.py, launched from
inside a Tune trial (Ray 2.60's pattern for Train inside Tune: the Tune function builds and fits a
TorchTrainer; a Train callback forwards each epoch's results to Tune).

Tune sees, per epoch, what the loop reports (loss, speed, the kNN monitor) plus `epochs_done`, the scheduler's
clock (not on the last epoch); then one last result with the linear probe of the pretrained backbone and
`final` = 1. A trial that ASHA stops (after an epoch before the last) never reaches that last result.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import ray.data
import ray.tune
import torch
from mlflow.tracking import MlflowClient
from ray.tune.integration.ray_train import TuneReportCallback

from pipeline.config import compose_config
from pipeline.mlflow_ui import report_name
from pipeline.train.launch import Trial, pretrain
from pipeline.train.prepare import resolve
from pipeline.tune.settings import trials_argv
from pipeline.tune.space import short

CLOCK = "epochs_done"  # ASHA's time attribute: 1-based epochs, the same after a resumed run as before
TRAINED = "trained_epochs"  # the same count on every result, the last epoch's too (the console, the curves)


def trial_number(trial_id: str) -> str:
    """A trial's number within its sweep: the end of Tune's trial id (`a1b2c_00003` -> `00003`)."""
    return trial_id.rsplit("_", 1)[-1]


class ForwardToTune(TuneReportCallback):
    """Rank 0's per-epoch results to Tune with `epochs_done`, each metric carried forward from its last epoch
    (every Tune result then holds the scheduler's metric even where the loop skips it).

    The last epoch's result goes without `epochs_done`: ASHA ignores a result without its clock, so it never
    stops a trial that trained to the end before its probe; the probe's result carries it (pipeline.tune.sweep
    sets ASHA's max_t to the epochs, so that result ends the trial)."""

    def __init__(self, epochs: int):
        super().__init__()
        self.epochs = epochs
        self.last: dict[str, int | float] = {}  # the numbers of the latest result

    def after_report(self, run_context, metrics, checkpoint):
        self.last.update({k: v for k, v in metrics[0].items() if isinstance(v, (int, float))})
        done = int(metrics[0]["epoch"]) + 1
        merged = {**self.last, TRAINED: done, **({CLOCK: done} if done < self.epochs else {})}
        super().after_report(run_context, [merged], checkpoint)


def run_trial(params: dict, setup: dict) -> None:
    """Tune's function: compose the trial's config (the sweep's command line plus its values), pretrain it as a
    child run of the sweep, then report the finished run's metrics, probe included, as the last result.

    `setup`: argv (the sweep's command line), sweep_run (its name), root, parent_run_id, tracking_uri, threads (torch
    threads per worker, so concurrent trials share the cores instead of oversubscribing them). Unless verbose,
    what the run prints goes to <paths.runs>/sweep/<sweep>/<trial id>.log: the sweep's console has a line per
    trial event instead."""
    torch.set_num_threads(setup["threads"])  # the probe runs here, beside the other trials' workers
    trial_id = ray.tune.get_context().get_trial_id()
    cfg = compose_config(trials_argv(setup, trial_id, params))
    cfg.pop("sweep", None)
    if cfg["trainer"]["torch_threads"] is None:
        cfg["trainer"]["torch_threads"] = setup["threads"]
    verbose = bool(cfg.get("verbose"))
    ray.data.DataContext.get_current().enable_progress_bars = verbose
    if verbose:
        return _pretrain_and_report(cfg, params, setup, trial_id)
    log = Path(cfg["paths"]["runs"]) / "sweep" / setup["sweep_run"] / f"{trial_id}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as f, contextlib.redirect_stdout(f), contextlib.redirect_stderr(f):
        _pretrain_and_report(cfg, params, setup, trial_id)


def _pretrain_and_report(cfg: dict, params: dict, setup: dict, trial_id: str) -> None:
    plan = resolve(cfg)
    label = f"{trial_number(trial_id)} {short(params)}"
    out = pretrain(cfg, plan, Trial(setup["parent_run_id"], trial_id, label, (ForwardToTune(cfg["train"]["epochs"]),)))
    logged = MlflowClient(setup["tracking_uri"]).get_run(out["run_id"]).data.metrics
    metrics = {report_name(k): v for k, v in logged.items()}  # probe/pretrained_r2 -> probe_pretrained_r2
    epochs = cfg["train"]["epochs"]
    ray.tune.report({**metrics, CLOCK: epochs, TRAINED: epochs, "final": 1})
