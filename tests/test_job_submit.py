"""`ray start --head` + token auth + `ray job submit --working-dir . -- python jobs/pretrain.py ...`,
exactly as README documents it, on this machine."""
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
pytestmark = pytest.mark.slow


def _ray(*args, env, timeout=300, check=True):
    r = subprocess.run([str(BIN / "ray"), *args], env=env, capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise AssertionError(f"ray {' '.join(args)} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return r


def _submit(args, cwd, env, timeout):
    """`ray job submit`, retried while the head's dashboard agent is still starting (it answers
    "No available agent" for a few seconds after `ray start`; over two minutes on a loaded 2-core machine)."""
    deadline = time.monotonic() + 360
    while True:
        r = subprocess.run([str(BIN / "ray"), "job", "submit", "--address", "http://127.0.0.1:8365",
                            "--working-dir", ".", "--", *args], cwd=cwd, env=env, capture_output=True, text=True,
                           timeout=timeout)
        if "No available agent" not in r.stderr or time.monotonic() > deadline:
            return r
        time.sleep(3)


def test_job_submit_with_token_auth(tmp_path):
    env = {**os.environ, "RAY_AUTH_MODE": "token", "HOME": str(tmp_path / "home"),
           "PATH": f"{BIN}:{os.environ['PATH']}"}
    env.pop("RAY_ADDRESS", None)
    env.pop("MLFLOW_TRACKING_URI", None)
    (tmp_path / "home").mkdir()
    token = _ray("get-auth-token", "--generate", env=env).stdout.strip()
    assert token
    # a copy of the project, so the upload is what a user's checkout would send
    work = tmp_path / "project"
    top_level = {".venv", "data", "runs", ".git", ".pytest_cache"}
    shutil.copytree(ROOT, work, ignore=lambda d, names: [n for n in names if (Path(d) == ROOT and n in top_level)
                                                         or n == "__pycache__" or n.endswith(".egg-info")])
    (work / "data").mkdir()
    (work / "data" / "big.bin").write_bytes(b"\0" * (2 << 20))  # must be kept out by .rayignore
    _ray("start", "--head", "--num-cpus", "4", "--dashboard-port", "8365", "--port", "6390",
         "--disable-usage-stats", env=env)
    try:
        r = _submit(
            ["python", "jobs/pretrain.py", f"paths.root={tmp_path / 'store'}", "data.generate.n_train=256",
             "data.generate.n_val=64", "model.width=8", "train.batch_size=64", "train.epochs=1",
             "eval.knn.bank_size=128", "eval.knn.val_size=64", "eval.probe.steps=10"], work, env, 900)
        out = r.stdout + r.stderr
        assert r.returncode == 0, out[-4000:]
        assert "succeeded" in out.lower() and "Linear probe on spirograph" in out
        assert (tmp_path / "store" / "runs" / "mlflow.db").exists()
        # .rayignore kept data/ out of the uploaded working directory
        probe = _submit(["python", "-c", "import os; print('UPLOADED', os.path.exists('data/big.bin'), "
                         "os.path.exists('jobs'))"], work, env, 300)
        assert "UPLOADED False True" in probe.stdout, probe.stdout[-2000:] + probe.stderr[-2000:]
    finally:
        _ray("stop", "--force", env=env, check=False)
