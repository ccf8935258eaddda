"""MLflow helpers: one run per job, found again by its run key so a resumed job continues its run; a job that
fails or is interrupted after its run opened ends it FAILED or KILLED with the error recorded."""

from __future__ import annotations

import logging
import os
import re
import time
import traceback
from pathlib import Path

import mlflow
from mlflow.entities import Run
from mlflow.tracking import MlflowClient

from pipeline.mlflow_ui import NOTE_TAG, command_line, mark_model_training
from pipeline.preflight import check_server
from pipeline.store import Store


def tracking_uri(store: Store) -> str:
    """`tracking.uri`, else $MLFLOW_TRACKING_URI, else a SQLite store in the runs folder (MLflow 3 refuses
    a plain ./mlruns folder store)."""
    uri = store.given_uri
    if uri:
        return uri
    store.local_db.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{store.local_db}"


def artifact_root(store: Store) -> str | None:
    if store.given_uri:
        return None  # the server decides
    return (Path(store.runs) / "mlartifacts").as_uri()


def setup(store: Store) -> str:
    """Point MLflow at the store and make sure the experiment exists; returns the experiment id. MLflow's own
    set-up lines (a new store's tables) and its download bars are for verbose=true only."""
    if not store.verbose:
        logging.getLogger("mlflow").setLevel(logging.WARNING)
        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    root = artifact_root(store)  # before set_tracking_uri, which exports MLFLOW_TRACKING_URI and would hide ours
    uri = tracking_uri(store)
    check_server(uri, store.experiment)  # one error line, not MLflow's minutes of retries
    mlflow.set_tracking_uri(uri)
    name = store.experiment
    exp = mlflow.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    return mlflow.create_experiment(name, artifact_location=root)


def find_run(exp_id: str, run_key: str) -> Run | None:
    """The newest run tagged with `run_key`, or None."""
    found = MlflowClient().search_runs(
        [exp_id], filter_string=f"tags.run_key = '{run_key}'", max_results=1, order_by=["attributes.start_time DESC"]
    )
    return found[0] if found else None


def active_run_id() -> str:
    """The id of the run this process has open, for code that runs inside one (a job's child run)."""
    run = mlflow.active_run()
    assert run is not None, "no MLflow run is open"
    return run.info.run_id


def start_or_resume(store: Store, run_key: str, run_name: str, job: str) -> str:
    """The MLflow run tagged with `run_key` (resume) or a new one; returns its run id."""
    exp_id = setup(store)
    return _open(exp_id, find_run(exp_id, run_key), {"run_key": run_key, "job": job}, run_name)


def start_child(parent_run_id: str, run_key: str, run_name: str, job: str, tags: dict | None = None) -> str:
    """A child run of `parent_run_id` (in its experiment, tagged mlflow.parentRunId) found again by `run_key`,
    else a new one; returns its run id. The parent itself is not reopened: its status stays as it is."""
    exp_id = MlflowClient().get_run(parent_run_id).info.experiment_id
    return _open(
        exp_id,
        find_run(exp_id, run_key),
        {"run_key": run_key, "job": job, "mlflow.parentRunId": parent_run_id, **(tags or {})},
        run_name,
    )


def _open(exp_id: str, found: Run | None, tags: dict[str, str], run_name: str) -> str:
    mark_model_training(exp_id)  # the UI's model-training view, not its GenAI overview
    if found:
        run_id = found.info.run_id
        if "error" in found.data.tags:  # an earlier attempt's; its traceback stays under errors/
            MlflowClient().delete_tag(run_id, "error")
        mlflow.start_run(run_id=run_id)
        return run_id
    # the run page's Description starts as the command that made the run (pretraining says more)
    tags = {NOTE_TAG: f"{tags['job']}: `{command_line()}`", **tags}
    return mlflow.start_run(experiment_id=exp_id, run_name=run_name, tags=tags).info.run_id


_NAMED_ERROR = re.compile(r"^[\w.]*(Error|Exception|Failure)\w*: \S")


def error_line(exc: BaseException) -> str:
    """One line naming what went wrong. A Ray Train failure wraps the worker's traceback in its message: the
    last `Name: message` line there is the worker's own error."""
    if isinstance(exc, KeyboardInterrupt):
        return "KeyboardInterrupt (Ctrl-C)"
    if isinstance(exc, SystemExit):
        return f"SystemExit({exc.code}) (stopped, e.g. SIGTERM or ray job stop)"
    lines = [ln.strip() for ln in "".join(traceback.format_exception_only(type(exc), exc)).splitlines() if ln.strip()]
    named = [ln for ln in lines if _NAMED_ERROR.match(ln)]
    return (named[-1] if named else lines[0] if lines else type(exc).__name__)[:1000]


def end_failed(exc: BaseException, status: str | None = None, line: str | None = None) -> str:
    """End the active run FAILED (an exception) or KILLED (KeyboardInterrupt, SystemExit), or `status`, with its
    error: the tag `error` (`line`, else error_line(exc)) and the artifact errors/<time>-<status>.txt (the
    traceback's tail). Returns the status, with " (not recorded)" where the store could not take it (a full disk,
    a server away): the job's own line says what happened, and its status file keeps it for the next start."""
    status = status or ("KILLED" if isinstance(exc, (KeyboardInterrupt, SystemExit)) else "FAILED")
    line = line or error_line(exc)
    try:
        mlflow.set_tag("error", line)
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        stamp = time.strftime("%Y%m%d-%H%M%S")
        mlflow.log_text(f"{status}: {line}\n\n{text[-20000:]}", f"errors/{stamp}-{status.lower()}.txt")
        mlflow.end_run(status=status)
    except Exception:  # noqa: BLE001 - the store being the failure must not hide the original error
        try:
            mlflow.end_run(status=status)
        except Exception:  # noqa: BLE001
            _forget_active_run()
            return f"{status} (not recorded)"
    return status


def _forget_active_run() -> None:
    """Drop the fluent API's active run without writing to the store (which refused its end)."""
    while mlflow.active_run() is not None:
        try:
            mlflow.tracking.fluent._active_run_stack.get().pop()  # noqa: SLF001 - MLflow has no public call for this
        except Exception:  # noqa: BLE001
            break


def flatten(d: dict, prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = str(v)[:500]
    return out
