"""What ends a pretraining job early, and the same command resuming after each, on a real, small tmpfs: a run whose
first checkpoints cannot fit is refused in one line before anything is written; Ctrl-C, a worker's failure and a
disk that fills during training, one after another on one run, each end its job as a user should see it, and the
same command resumes after each into the same MLflow run. Needs root to mount a tmpfs (CI and the development
machines are root); skipped with the reason elsewhere."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_e2e import SMALL, SPIRO, job_env, mlflow_runs

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def small_disk(tmp_path):
    mounted: list[Path] = []

    def mount(size_mb: int) -> Path:
        where = tmp_path / f"disk{len(mounted)}"
        where.mkdir()
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(where)], capture_output=True)
        if r.returncode:
            pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode().strip()[:200]}")
        mounted.append(where)
        return where

    yield mount
    for where in mounted:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def _job(root: Path, data: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        str(ROOT / "jobs" / "pretrain.py"),
        f"paths.root={root}",
        f"paths.data={data}",
        *SPIRO,
        *SMALL,
        "eval.probe.after_pretrain=false",
        "eval.knn.every=0",
        *extra,
    ]


@pytest.mark.slow
def test_a_disk_too_small_for_two_checkpoints_is_refused_in_one_line(tmp_path, small_disk):
    disk = small_disk(6)  # SMALL's checkpoint is ~4.2 MB: two need 8.4
    r = subprocess.run(
        _job(disk, tmp_path / "data"), cwd=ROOT, env=job_env(), capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    (line,) = [ln for ln in r.stderr.splitlines() if not ln.startswith("[shards]")]  # the data it made first
    assert line.startswith(f"error: disk full ahead: {disk} has ") and "first two checkpoints need" in line
    assert not (disk / "runs" / "mlflow.db").exists()


@pytest.mark.slow
def test_ctrl_c_a_worker_failure_and_a_full_disk_then_the_same_command_resumes_each_time(tmp_path, small_disk):
    """One run (run.name=interrupted), its runs/ on a 48 MB tmpfs, its data beside it:
    1. SIGINT to the driver (what Ctrl-C sends) once two checkpoints exist: the job stops, its run is KILLED and the
       checkpoints it reported load;
    2. the same run with a shorter budget resumes after the last one (even one Ray had not registered when
       interrupted), trains an epoch and fails once in the worker: FAILED, the worker's error on the run;
    3. the same command resumes after the failure; the disk fills mid-run: one error line naming the folder, no
       traceback;
    4. with the space freed, the same command says why the last job ended, resumes and finishes: FINISHED, one
       MLflow run all along, every epoch logged once across the four jobs."""
    import signal

    import torch

    disk = small_disk(48)
    marker = tmp_path / "failed-once"
    base = _job(disk, tmp_path / "data", "trainer.num_workers=1", "run.name=interrupted")
    proc = subprocess.Popen(
        [*base, "train.epochs=30"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=job_env()
    )
    storage = disk / "runs" / "ray"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and len(list(storage.glob("*/checkpoint_*/state.pt"))) < 2:
        assert proc.poll() is None, proc.stdout.read()[-3000:]
        time.sleep(1)
    proc.send_signal(signal.SIGINT)
    try:
        out, _ = proc.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError("the job did not stop within 3 minutes of SIGINT")
    assert proc.returncode != 0
    states = sorted(storage.glob("*/checkpoint_*/state.pt"))
    assert states, out[-3000:]
    last = max(torch.load(p, map_location="cpu", weights_only=False)["epoch"] for p in states)
    assert last >= 1
    client, runs = mlflow_runs(disk)
    assert len(runs) == 1 and runs[0].info.status == "KILLED"
    assert runs[0].data.tags["error"].startswith(("KeyboardInterrupt", "SystemExit"))
    run_id, epochs = runs[0].info.run_id, last + 6
    cmd = [*base, f"train.epochs={epochs}", f"debug.fail_at_epoch={last + 2}", f"debug.fail_marker={marker}"]

    # 2. trains epoch last + 1, fails in the worker at the start of the next
    failed = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900, env=job_env())
    said = failed.stdout + failed.stderr
    assert failed.returncode != 0 and marker.exists(), said[-3000:]
    assert f"resumed from the checkpoint of epoch {last + 1}/{epochs} " in said, said[-2000:]
    client, runs = mlflow_runs(disk)
    assert len(runs) == 1 and runs[0].info.status == "FAILED" and runs[0].info.run_id == run_id
    # the worker's error, recorded on the run: one line in a tag, the traceback's tail as a text artifact
    assert f"RuntimeError: injected failure at epoch {last + 2}" in runs[0].data.tags["error"]
    assert any(a.path.endswith("-failed.txt") for a in client.list_artifacts(run_id, "errors"))

    # 3. resumes (the marker says the failure happened); the disk fills once this job's first epoch is checkpointed
    job = subprocess.Popen(cmd, cwd=ROOT, env=job_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert job.stdout is not None and job.stderr is not None
    lines: list[str] = []
    done = 0
    for line in job.stdout:
        lines.append(line)
        done += line.startswith("[train] epoch ") and " done" in line
        if done == 2:  # the first epoch's checkpoint is complete: fill the disk
            with (disk / "filler").open("wb") as f:
                try:
                    while True:
                        f.write(b"\0" * 2**20)
                except OSError:
                    pass
            break
    lines += job.stdout.readlines()
    err = job.stderr.read()
    assert job.wait(timeout=600) == 1, "".join(lines)[-3000:] + err[-3000:]
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(f"error: disk full at {disk}"), err[-3000:]
    assert "rerun the same command" in errors[0]
    assert "Traceback" not in err and "Traceback" not in "".join(lines), err[-3000:]

    # 4. space freed: the same command finishes
    (disk / "filler").unlink()
    time.sleep(1)
    again = subprocess.run(cmd, cwd=ROOT, env=job_env(), capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    said = again.stdout + again.stderr
    assert "its last job failed: disk full at" in said or "FAILED: disk full at" in said, said[-3000:]
    assert "resumed from the checkpoint of epoch" in said
    client, runs = mlflow_runs(disk)
    assert len(runs) == 1 and runs[0].info.status == "FINISHED" and runs[0].info.run_id == run_id
    assert "error" not in runs[0].data.tags
    losses = client.get_metric_history(run_id, "train/epoch_loss")
    assert len({m.step for m in losses}) == epochs  # every epoch logged, across the four jobs
