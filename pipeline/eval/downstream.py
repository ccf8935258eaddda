"""What every downstream job (detect, finetune, knn) does with MLflow: one child run of the pretraining run per
set of settings, found again by a key of those settings, so a rerun of a finished evaluation prints its results
and an interrupted one continues its run; an error ends the run FAILED (KILLED on Ctrl-C) with the error kept."""

from __future__ import annotations

import contextlib
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline import tracking
from pipeline.eval.source import Source
from pipeline.store import Store

if TYPE_CHECKING:
    from mlflow.entities import Run


@dataclass
class EvalRun:
    name: str  # <pretraining run name>-<job>[-<what>]-<key>
    run_key: str  # <job>:<key>, the tag it is found again by
    found: Run | None  # the MLflow run of an earlier attempt

    @property
    def finished(self) -> bool:
        return self.found is not None and self.found.info.status == "FINISHED"


def settings_key(settings: dict) -> str:
    return hashlib.sha1(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:10]


def find(store: Store, src: Source, job: str, settings: dict, what: str = "") -> EvalRun:
    """The evaluation's name and key, and its run from an earlier attempt (looked for in the parent's experiment,
    where the child goes). Points MLflow at the store."""
    from mlflow.tracking import MlflowClient

    exp_id = tracking.setup(store)
    if src.run_id is not None:
        exp_id = MlflowClient().get_run(src.run_id).info.experiment_id
    key = settings_key(settings)
    parent = src.cfg.get("run", {}).get("name") or Path(src.ref).parent.name
    name = "-".join(p for p in (str(parent), job, what, key[:6]) if p)
    run_key = f"{job}:{key}"
    return EvalRun(name, run_key, tracking.find_run(exp_id, run_key))


@contextlib.contextmanager
def child_run(store: Store, src: Source, ev: EvalRun, job: str):
    """Open the evaluation's run (a child of the pretraining run, or a run of its own for a checkpoint from
    elsewhere), yield its id, end it FINISHED, or FAILED/KILLED with the error on the way out of an exception."""
    import mlflow

    run_id = (
        tracking.start_child(src.run_id, ev.run_key, ev.name, job=job)
        if src.run_id is not None
        else tracking.start_or_resume(store, ev.run_key, ev.name, job=job)
    )
    try:
        yield run_id
    except BaseException as e:
        status = tracking.end_failed(e)
        print(f"[{job}] MLflow run {run_id} ended {status}: {tracking.error_line(e)}", flush=True)
        raise
    mlflow.end_run()


def results_table(results: dict[str, dict[str, float]], keys: list[str], fmt: str = ".4f") -> str:
    """A markdown table of each backbone's results, a column per key ("-" where a backbone lacks it: one read back
    from an earlier attempt's summary metrics, say)."""
    lines = ["| backbone | " + " | ".join(keys) + " |", "| --- |" + " --- |" * len(keys)]
    lines += [
        f"| {b} | " + " | ".join(format(r[k], fmt) if k in r else "-" for k in keys) + " |" for b, r in results.items()
    ]
    return "\n".join(lines)


def pick_device(choice: str) -> str:
    """`auto` (cuda when torch sees it), `cpu` or `cuda`; ValueError with one line for cuda without a device."""
    import torch

    if choice == "cuda" and not torch.cuda.is_available():
        raise ValueError("device=cuda: torch sees no CUDA device here (device=auto picks what there is)")
    return "cuda" if choice == "cuda" or (choice == "auto" and torch.cuda.is_available()) else "cpu"
