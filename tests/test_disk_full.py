"""jobs/pretrain.py on a real, small tmpfs: a run whose first checkpoints cannot fit is refused in one line before
anything is written; a disk that fills during training ends the job in one error line naming the folder, the
failure is kept where the full disk could still take it (the MLflow store on it could not), and once space is
freed the same command says why the last job ended and resumes to FINISHED. Needs root to mount a tmpfs (CI and
the development machines are root); skipped with the reason elsewhere."""

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
def test_a_disk_that_fills_mid_run_ends_in_one_line_and_the_run_resumes(tmp_path, small_disk):
    disk = small_disk(48)
    cmd = _job(disk, tmp_path / "data", "train.epochs=4")
    job = subprocess.Popen(cmd, cwd=ROOT, env=job_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert job.stdout is not None and job.stderr is not None
    out: list[str] = []
    for line in job.stdout:
        out.append(line)
        if line.startswith("[train] epoch 2/4 done"):  # epoch 1's checkpoint is complete: fill the disk
            filler = disk / "filler"
            with filler.open("wb") as f:
                try:
                    while True:
                        f.write(b"\0" * 2**20)
                except OSError:
                    pass
            break
    out += job.stdout.readlines()
    err = job.stderr.read()
    assert job.wait(timeout=600) == 1, "".join(out)[-3000:] + err[-3000:]
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(f"error: disk full at {disk}"), err[-3000:]
    assert "rerun the same command" in errors[0]
    assert "Traceback" not in err and "Traceback" not in "".join(out), err[-3000:]
    (disk / "filler").unlink()
    time.sleep(1)
    again = subprocess.run(cmd, cwd=ROOT, env=job_env(), capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    said = again.stdout + again.stderr
    assert "its last job failed: disk full at" in said or "FAILED: disk full at" in said, said[-3000:]
    assert "resumed from the checkpoint of epoch" in said
    _, runs = mlflow_runs(disk)
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
