"""Run identity: the run lock, a finished run rerun, a failed run recorded and resumed, probes by run id.

No Ray here: pretrain() runs in-process with Ray Train's fit() replaced, and the jobs that stop before Ray
(a locked run, a probe) run as the README shows them."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from test_e2e import SMALL, SPIRO, job_env

from pipeline.plan import RunPlan

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def store(tmp_path, monkeypatch):
    """tmp_path as paths.root and cwd, its own MLflow store (runs/mlflow.db); MLflow's process-wide tracking
    URI and run stack are put back afterwards."""
    import mlflow
    from mlflow.tracking._tracking_service import utils as mlflow_uri

    monkeypatch.setenv("MLFLOW_TRACKING_URI", "")  # tracking.setup exports it; monkeypatch restores it
    monkeypatch.setattr(mlflow_uri, "_tracking_uri", mlflow_uri._tracking_uri)
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    while mlflow.active_run():
        mlflow.end_run()


def _client(root: Path):
    import mlflow

    return mlflow.MlflowClient(f"sqlite:///{root / 'runs' / 'mlflow.db'}")


def _cfg(root: Path, name: str, *overrides: str) -> dict:
    """A composed config; with PLAN given, pretrain() skips resolve() (no data needed)."""
    from pipeline.config import compose_config

    cfg = compose_config(
        [f"paths.root={root}", f"run.name={name}", "model.width=8", "gallery.at_pretrain=false", *overrides]
    )
    return cfg


PLAN = RunPlan(workers=1, batch_size=64, num_train_samples=64, epochs=1, warmup_epochs=0, lr=0.1)


@pytest.fixture
def no_ray(monkeypatch):
    """pretrain() without Ray: no cluster, no resource check, a fit() that returns a checkpoint at once (or
    raises what `fit_error` holds)."""
    from pipeline.train import launch, resources

    calls = SimpleNamespace(fit=0, fit_error=None)

    def fit():
        calls.fit += 1
        if calls.fit_error is not None:
            raise calls.fit_error
        return SimpleNamespace(checkpoint=SimpleNamespace(path="memory://"))

    monkeypatch.setattr(launch, "init_ray", lambda trainer, verbose=False: None)
    monkeypatch.setattr(resources, "check_resources", lambda *a, **k: None)
    monkeypatch.setattr(launch, "build_trainer", lambda cfg, plan, callbacks=(): SimpleNamespace(fit=fit))
    return calls


def test_failure_after_the_run_opened_is_recorded_and_the_rerun_resumes_then_a_finished_rerun_logs_nothing(
    store, no_ray, monkeypatch, capsys
):
    import mlflow

    from pipeline.eval.probe import compare as run_probe
    from pipeline.train import launch

    def broken(checkpoint, cfg, model=True):
        raise OSError("disk full while logging the backbone")

    monkeypatch.setattr(launch, "log_checkpoint", broken)
    with pytest.raises(OSError):
        launch.pretrain(_cfg(store, "r1"), PLAN)
    client = _client(store)
    (run,) = client.search_runs([client.get_experiment_by_name("augssl").experiment_id])
    assert run.info.status == "FAILED"  # not FINISHED: the error came after fit()
    assert run.data.tags["error"] == "OSError: disk full while logging the backbone"
    (err,) = client.list_artifacts(run.info.run_id, "errors")
    text = Path(client.download_artifacts(run.info.run_id, err.path, str(store / "dl"))).read_text()
    assert text.startswith("FAILED: OSError") and "in broken" in text  # the traceback's tail
    assert not mlflow.active_run()

    # the same command again resumes the run and finishes it; the probe logs into it
    def logged_probe(cfg, ckpt, run_name=None, baseline=True):
        results = {"pretrained": {"r2_m": 0.5, "mse_m": 0.2}, "random": {"r2_m": 0.1, "mse_m": 0.4}}
        mlflow.log_metrics({f"probe/{k}_{m}": v for k, r in results.items() for m, v in r.items()})
        return results

    monkeypatch.setattr(launch, "log_checkpoint", lambda checkpoint, cfg, model=True: store / "ckpt")
    monkeypatch.setattr(run_probe, "compare_with_random", logged_probe)
    out = launch.pretrain(_cfg(store, "r1"), PLAN)
    run = client.get_run(run.info.run_id)
    assert out["run_id"] == run.info.run_id and run.info.status == "FINISHED"
    assert "error" not in run.data.tags and no_ray.fit == 2
    assert "resuming run r1" in capsys.readouterr().out

    # and again: a finished run prints its results, starts nothing and logs nothing
    monkeypatch.setattr(launch, "init_ray", lambda *a: pytest.fail("a finished run started Ray"))

    def logged(r):
        return (
            {k: len(client.get_metric_history(r.info.run_id, k)) for k in r.data.metrics},
            r.data.metrics,
            r.data.params,
            [a.path for a in client.list_artifacts(r.info.run_id)],
        )

    before = logged(run)
    out = launch.pretrain(_cfg(store, "r1"), PLAN)
    shown = capsys.readouterr().out
    after = client.get_run(run.info.run_id)
    assert logged(after) == before
    assert after.info.end_time == run.info.end_time and no_ray.fit == 2
    assert out["run_id"] == run.info.run_id and out["probe"]["pretrained"]["r2_m"] == 0.5
    assert f"finished before (MLflow run {run.info.run_id}" in shown
    assert "checkpoint/state.pt" in shown
    assert [ln.split() for ln in shown.splitlines() if ln.startswith("r2_m")] == [["r2_m", "0.5000", "0.1000"]]


def test_a_finished_run_never_probed_is_probed_on_rerun_and_stays_finished_if_the_probe_fails(
    store, no_ray, monkeypatch
):
    import mlflow

    from pipeline.eval.probe import compare as run_probe
    from pipeline.train import launch

    local = store / "runs" / "checkpoints" / "r3"
    local.mkdir(parents=True)
    torch.save({"cfg": {}, "method": {}}, local / "state.pt")
    monkeypatch.setattr(launch, "log_checkpoint", lambda checkpoint, cfg, model=True: local)
    out = launch.pretrain(_cfg(store, "r3", "eval.probe.after_pretrain=false"), PLAN)
    assert out["probe"] is None and no_ray.fit == 1

    probed = []

    def logged_probe(cfg, ckpt, run_name=None, baseline=True):
        probed.append((sorted(ckpt) if isinstance(ckpt, dict) else ckpt, run_name, mlflow.active_run().info.run_id))
        if len(probed) == 1:
            raise MemoryError("probe out of memory")
        mlflow.log_metrics({"probe/pretrained_r2_m": 0.5, "probe/random_r2_m": 0.1})
        return {"pretrained": {"r2_m": 0.5}, "random": {"r2_m": 0.1}}

    monkeypatch.setattr(run_probe, "compare_with_random", logged_probe)
    client = _client(store)
    # a failed probe leaves the trained run FINISHED, with the error recorded ...
    with pytest.raises(MemoryError):
        launch.pretrain(_cfg(store, "r3"), PLAN)
    run = client.get_run(out["run_id"])
    assert run.info.status == "FINISHED" and run.data.tags["error"] == "MemoryError: probe out of memory"
    # ... the next rerun probes the finished run's checkpoint into it; the one after that only shows it
    for _ in range(2):
        again = launch.pretrain(_cfg(store, "r3"), PLAN)
        assert again["run_id"] == out["run_id"] and again["probe"]["pretrained"] == {"r2_m": 0.5}
    assert probed == [(["cfg", "method"], "r3", out["run_id"])] * 2 and no_ray.fit == 1
    run = client.get_run(out["run_id"])
    assert run.info.status == "FINISHED" and "error" not in run.data.tags


def test_interrupted_run_is_killed_with_the_interrupt_recorded(store, no_ray):
    from pipeline.train import launch

    no_ray.fit_error = KeyboardInterrupt()
    with pytest.raises(KeyboardInterrupt):
        launch.pretrain(_cfg(store, "r2"), PLAN)
    client = _client(store)
    (run,) = client.search_runs([client.get_experiment_by_name("augssl").experiment_id])
    assert run.info.status == "KILLED" and run.data.tags["error"].startswith("KeyboardInterrupt")
    assert [a.path.endswith("-killed.txt") for a in client.list_artifacts(run.info.run_id, "errors")] == [True]


def test_error_line_names_the_workers_error_inside_a_ray_failure():
    from pipeline.tracking import error_line

    wrapped = RuntimeError(
        "Training failed due to worker errors:\n[Rank 0 Error Snippet]:\nTraceback (most recent "
        'call last):\n  File "loop.py", line 3, in f\nValueError: injected failure at epoch 1\n'
    )
    assert error_line(wrapped) == "ValueError: injected failure at epoch 1"
    assert error_line(ZeroDivisionError("division by zero")) == "ZeroDivisionError: division by zero"


def test_a_second_job_on_a_running_run_fails_in_one_line_before_ray_or_mlflow(tmp_path):
    from pipeline.config import compose_config
    from pipeline.train.run_lock import run_lock

    args = [f"paths.root={tmp_path}", *SPIRO, *SMALL, "run.name=busy", "train.epochs=1"]
    cfg = compose_config(args)
    with run_lock(cfg["paths"]["runs"], "busy"):  # this process is the running job
        t0 = time.monotonic()
        r = subprocess.run(
            [sys.executable, str(ROOT / "jobs" / "pretrain.py"), *args],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
            env=job_env(),
        )
        took = time.monotonic() - t0
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    # one error line, the last (progress lines of the data generation before it are no error)
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert errors == r.stderr.strip().splitlines()[-1:] and "Traceback" not in r.stderr, r.stderr
    assert errors[0].startswith("error: run busy is already running: "), r.stderr
    assert f"pid {os.getpid()} " in errors[0] and time.strftime(" since %Y-%m-%d ") in errors[0]
    assert took < 60
    assert not (tmp_path / "runs" / "mlflow.db").exists() and not (tmp_path / "runs" / "ray").exists()


def test_a_lock_left_by_a_dead_job_does_not_block(store):
    from pipeline.train.run_lock import lock_path, run_lock

    cfg = _cfg(store, "stale")
    where = (cfg["paths"]["runs"], cfg["run"]["name"])
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; sys.path.insert(0, sys.argv[1]); from pipeline.config import "
            "compose_config; from pipeline.train.run_lock import run_lock\n"
            f"with run_lock(compose_config(['paths.root={store}'])['paths']['runs'], 'stale'):\n"
            "    print('locked', flush=True); time.sleep(600)",
            str(ROOT),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        from pipeline.train.run_lock import RunBusy

        with pytest.raises(RunBusy, match=f"pid {holder.pid} "):
            with run_lock(*where):
                pass
    finally:
        holder.send_signal(signal.SIGKILL)  # no clean-up runs: only the kernel drops the lock
        holder.wait()
    assert f'"pid": {holder.pid}' in lock_path(*where).read_text()  # its record stays behind ...
    with run_lock(*where):  # ... and does not block
        assert f'"pid": {os.getpid()}' in lock_path(*where).read_text()


def test_probe_by_run_id_uses_the_runs_config_logs_a_child_run_and_leaves_no_files(store):
    """A run pretrained at 24 px on its own data folder, probed with no data= on the command line."""
    import mlflow

    from pipeline import checkpoint as ck
    from pipeline import tracking
    from pipeline.build import build_method
    from pipeline.config import compose_config, to_yaml
    from pipeline.data.spirograph_shards import make_spirograph_splits
    from pipeline.store import Store

    make_spirograph_splits(store / "spiro24", 200, 100, seed=0, size=24, maxcount=100, progress=False)
    cfg = compose_config(
        [
            f"paths.root={store}",
            "run.name=at24",
            "model.width=8",
            "method.bn_splits=1",
            f"data.train={store / 'spiro24' / 'train'}",
            f"data.val={store / 'spiro24' / 'val'}",
            "data.image_size=24",
        ]
    )
    method = build_method(cfg)
    (store / "ckpt").mkdir()
    ck.save(store / "ckpt", method, torch.optim.SGD(method.parameters(), lr=0.1), 0, 1, cfg)
    run_id = tracking.start_or_resume(Store.of(cfg), "at24", "at24", job="pretrain")
    mlflow.log_text(to_yaml(cfg), "config.yaml")
    mlflow.log_artifact(str(store / "ckpt" / ck.STATE_FILE), "checkpoint")
    mlflow.end_run()

    (store / "work").mkdir()
    (store / "tmp").mkdir()
    probe = subprocess.run(
        [
            sys.executable,
            str(ROOT / "jobs" / "linear_probe.py"),
            f"paths.root={store}",
            f"eval.probe.checkpoint={run_id}",
            "eval.probe.steps=10",
        ],
        cwd=store / "work",
        capture_output=True,
        text=True,
        timeout=300,
        env={**job_env(), "TMPDIR": str(store / "tmp")},
    )
    assert probe.returncode == 0, probe.stdout[-2000:] + probe.stderr[-3000:]
    assert "Linear probe on spirograph at 24 px" in probe.stdout
    client = _client(store)
    runs = client.search_runs([client.get_experiment_by_name("augssl").experiment_id])
    (child,) = [r for r in runs if r.info.run_id != run_id]
    assert child.data.tags["mlflow.parentRunId"] == run_id and child.info.status == "FINISHED"
    assert child.data.params["image_size"] == "24" and child.data.params["data.val"] == str(store / "spiro24" / "val")
    assert "probe/pretrained_r2_m" in child.data.metrics
    assert client.get_run(run_id).info.status == "FINISHED"  # the parent is left as it was
    assert not list((store / "work").rglob("*")) and not list((store / "tmp").rglob(ck.STATE_FILE))
    assert (store / "runs" / "probe" / f"{child.info.run_name}.png").exists()
    assert child.info.run_name.startswith("at24-probe-") and not (store / "runs" / "probe.png").exists()
    assert f"mlflow run {child.info.run_id}" in probe.stdout
