"""A real tracking server stopped under a training job and started again: the run ends FINISHED with every step's
metrics, and the console says the outage once, in the job's words, and its end once; no urllib3 retry warning, no
MLflow "View run" link (docs/tracking.md, "When the store goes away")."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from test_e2e import SMALL, SPIRO, job_env

from helpers import free_port
from services import MLFLOW

ROOT = Path(__file__).resolve().parents[1]
SESSION_LOGS = "ray/session_2*/logs"  # Ray's session folders by date; not session_latest, a link to one of them


class PlainServer:
    """`mlflow server` on loopback with its runs in a SQLite file: stop() and start() keep the port and the runs."""

    def __init__(self, folder: Path):
        self.folder, self.port = folder, free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
        cmd = [MLFLOW, "server", "--host=127.0.0.1", f"--port={self.port}", "--workers=1"]
        cmd += [f"--backend-store-uri=sqlite:///{self.folder / 'mlflow.db'}", f"--artifacts-destination={self.folder}"]
        with (self.folder / "server.log").open("a") as out:
            # a session of its own: `mlflow server` serves from child processes, stopped with it as a group
            self.process = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        import requests

        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if requests.get(f"{self.uri}/health", timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                time.sleep(0.5)
        raise RuntimeError((self.folder / "server.log").read_text()[-3000:])

    def stop(self) -> None:
        """Gone at once, as a crashed or preempted server is (a graceful SIGTERM waits on the job's open requests)."""
        assert self.process is not None
        if self.process.poll() is not None:  # stopped already
            return
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)
        import requests

        deadline = time.monotonic() + 30  # its workers gone too: nothing answers on the port
        while time.monotonic() < deadline:
            try:
                requests.get(f"{self.uri}/health", timeout=1)
            except requests.RequestException:
                return
            time.sleep(0.5)
        raise RuntimeError(f"the server at {self.uri} still answers after it was stopped")


@pytest.mark.slow
def test_a_run_survives_its_tracking_server_going_away(tmp_path):
    server = PlainServer(tmp_path / "server")
    server.folder.mkdir()
    server.start()
    cmd = [sys.executable, str(ROOT / "jobs" / "pretrain.py"), f"paths.root={tmp_path}", *SPIRO, *SMALL]
    cmd += [
        f"tracking.uri={server.uri}",
        "tracking.flush_every_s=1",
        "train.epochs=3",
        "eval.probe.after_pretrain=false",
        "eval.knn.every=0",  # only the training's own writes are checked
    ]
    # the job's private Ray under a folder of this test's (short: Ray's socket paths stay under 107 characters), so
    # its workers' own output can be read where Ray writes it
    ray_tmp = Path(tempfile.mkdtemp(prefix="rt", dir="/tmp"))
    env = {**job_env(), "RAY_TMPDIR": str(ray_tmp)}
    job = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []

    def read() -> None:
        assert job.stdout is not None
        for line in job.stdout:
            lines.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()

    def workers_said() -> list[str]:
        """The training workers' lines where Ray writes them: Ray forwards them to the console, but its forwarding
        once stalled for 5 minutes on a loaded machine (the worker's file had the outage line, the console not)."""
        files = ray_tmp.glob(f"{SESSION_LOGS}/worker-*.out")
        return [ln for f in files for ln in f.read_text(errors="replace").splitlines(keepends=True)]

    def wait_for(text: str, workers: bool = False) -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and job.poll() is None:
            if any(text in ln for ln in lines + (workers_said() if workers else [])):
                return
            time.sleep(0.5)
        reader.join(10)
        assert any(text in ln for ln in lines), f"the job never said {text!r}:\n" + "".join(lines)[-4000:]

    try:
        # the server goes away as the driver hands over to training (the gallery is its last write before it), and
        # comes back once the rank-0 logger has found it gone (training cannot end without writing to it)
        wait_for("[pretrain] views gallery")
        server.stop()
        stopped = time.monotonic()
        wait_for("does not answer", workers=True)
        time.sleep(max(0.0, 20 - (time.monotonic() - stopped)))  # away 20 s at least: several flushes fail
        server.start()
        assert job.wait(timeout=600) == 0, "".join(lines)[-4000:]
        reader.join(30)
    finally:
        if job.poll() is None:
            job.kill()
        server.stop()
    out = "".join(lines)
    said = workers_said()
    errs = "".join(f.read_text(errors="replace") for f in ray_tmp.glob(f"{SESSION_LOGS}/worker-*.err"))
    shutil.rmtree(ray_tmp, ignore_errors=True)
    # the outage said once and its end once, in the job's words (at the workers' source; the console has what Ray
    # forwarded of them, never a line twice)
    for words in ("does not answer", "is back after"):
        at_source, on_console = sum(words in ln for ln in said), sum(words in ln for ln in lines)
        assert at_source == 1 and on_console <= 1, (words, at_source, on_console, "".join(said)[-2000:], out[-3000:])
    assert "Retrying" not in out + errs and "View run" not in out and "Traceback" not in out, out[-4000:]
    assert time.monotonic() - stopped > 20
    import mlflow

    # what the server stored, read from its SQLite file (a third start of the server would only serve the same rows)
    client = mlflow.MlflowClient(f"sqlite:///{server.folder / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("augssl").experiment_id])
    assert run.info.status == "FINISHED"
    steps = sorted(m.step for m in client.get_metric_history(run.info.run_id, "train/loss"))
    assert steps == list(range(2, 3 * 512 // 64 + 1, 2)), steps  # log_every=2: every logged step, once
