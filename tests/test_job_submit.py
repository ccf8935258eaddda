"""`make cluster`, then `.venv/bin/ray job submit --working-dir . -- python jobs/pretrain.py ...` from a shell whose
PATH has no .venv on it, exactly as the README shows; `make cluster-stop` stops that head and no other Ray."""

import os
import re
import shlex
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def _clean_env(home: Path) -> dict:
    """The user's shell: no .venv on PATH, no Ray address or MLflow store exported, its own HOME (auth token)."""
    path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if ".venv" not in p)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RAY_ADDRESS", "RAY_AUTH_MODE", "MLFLOW_TRACKING_URI", "VIRTUAL_ENV", "PYTHONPATH")
    }
    return {**env, "PATH": path, "HOME": str(home)}


def _make(target, cwd, env, **settings):
    # -o: the copy's .venv is the real one, installed already; a pyproject.toml newer than its stamp must not make
    # the copy reinstall the project into it (that would point the editable install at this temporary copy)
    return subprocess.run(
        ["make", "-s", "-o", ".venv/.installed", target],
        cwd=cwd,
        env={**env, **settings},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_make_cluster_then_job_submit_from_a_plain_shell(tmp_path):
    import tempfile

    if not (ROOT / ".venv" / "bin" / "ray").exists():
        pytest.skip(
            "make cluster runs its head from .venv, which this checkout has not (a node set up from an offline "
            "bundle starts its head with ray start: docs/cluster.md)"
        )
    (tmp_path / "home").mkdir()
    short = Path(tempfile.mkdtemp(prefix="rt", dir="/tmp"))  # Ray's socket paths must stay under 107 characters
    env = _clean_env(tmp_path / "home")
    assert shutil.which("python", path=env["PATH"]) != str(ROOT / ".venv" / "bin" / "python")
    # a copy of the project, so the upload is what a user's checkout would send; its .venv is the real one
    work = tmp_path / "project"
    top_level = {".venv", "data", "runs", ".git", ".pytest_cache"}
    shutil.copytree(
        ROOT,
        work,
        ignore=lambda d, names: [
            n for n in names if (Path(d) == ROOT and n in top_level) or n == "__pycache__" or n.endswith(".egg-info")
        ],
    )
    (work / ".venv").symlink_to(ROOT / ".venv")
    (work / "data").mkdir()
    (work / "data" / "big.bin").write_bytes(b"\0" * (2 << 20))  # must be kept out by .rayignore

    ours = {
        "RAY_PORT": "6392",
        "RAY_DASHBOARD_PORT": "8367",
        "RAY_CLIENT_PORT": "9312",
        "RAY_AGENT_PORT": "52412",
        "RAY_TEMP_DIR": str(short / "r1"),
    }
    other = {
        "RAY_PORT": "6393",
        "RAY_DASHBOARD_PORT": "8368",
        "RAY_CLIENT_PORT": "9313",
        "RAY_AGENT_PORT": "52413",
        "RAY_TEMP_DIR": str(short / "r2"),
    }
    try:
        r = _make("cluster", work, env, **ours)
        assert r.returncode == 0, r.stdout + r.stderr
        exports = dict(re.findall(r"^export (\w+)=(\S+)$", r.stdout, flags=re.M))
        assert exports.get("RAY_ADDRESS") == "http://127.0.0.1:8367" and exports.get("RAY_AUTH_MODE") == "token"
        assert "make cluster-stop" in r.stdout
        shell = {**env, **exports}

        # the pretraining job as the README submits it; the same entrypoint first says where it runs: in .venv,
        # without data/, which .rayignore kept out of the upload
        where = "import os, sys; print('UPLOADED', os.path.exists('data/big.bin'), os.path.exists('jobs'), sys.prefix)"
        small = [
            f"paths.root={tmp_path / 'store'}",
            "data.generate.n_train=256",
            "data.generate.n_val=64",
            "model.width=8",
            "train.batch_size=64",
            "eval.knn.bank_size=128",
            "eval.knn.val_size=64",
            "eval.probe.steps=10",
        ]
        # another Ray on the machine while the jobs run (Train's placement-group cleaner, asking the state API
        # without an address, once failed with a traceback finding two), which must survive our cluster-stop
        started = _make("cluster", work, env, **other)
        assert started.returncode == 0, started.stderr
        _readme_job_beside_another(work, shell, small, where, tmp_path / "store")
        assert (tmp_path / "store" / "runs" / "mlflow.db").exists()
        stop = _make("cluster-stop", work, env, **ours)
        assert stop.returncode == 0 and "stopped" in stop.stdout, stop.stdout + stop.stderr
        assert subprocess.run(["pgrep", "-f", str(short / "r1")], capture_output=True).returncode == 1
        assert subprocess.run(["pgrep", "-f", str(short / "r2")], capture_output=True).returncode == 0
    finally:
        _make("cluster-stop", work, env, **ours)
        _make("cluster-stop", work, env, **other)
    assert subprocess.run(["pgrep", "-f", str(short / "r2")], capture_output=True).returncode == 1
    shutil.rmtree(short, ignore_errors=True)


def _ray_job(work: Path, shell: dict, *args: str) -> subprocess.CompletedProcess:
    """`.venv/bin/ray job <args>` from the copy of the project, in the user's shell."""
    return subprocess.run(
        [".venv/bin/ray", "job", *args], cwd=work, env=shell, capture_output=True, text=True, timeout=300
    )


def _started(args: list[str], cwd: Path, env: dict) -> tuple[subprocess.Popen, str]:
    """`.venv/bin/ray job submit` as the README runs it (it waits, streaming the job's logs), once the head's agent
    answers; returns the running client and the job's id."""
    deadline = time.monotonic() + 360
    while True:
        client = subprocess.Popen(
            [".venv/bin/ray", "job", "submit", "--working-dir", ".", "--", *args],
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert client.stdout is not None
        seen = []
        for line in client.stdout:
            seen.append(line)
            found = re.search(r"Job '(raysubmit_\w+)' submitted successfully", line)
            if found:
                return client, found[1]
        client.wait()
        if "No available agent" not in "".join(seen) or time.monotonic() > deadline:
            raise AssertionError("".join(seen)[-3000:])
        time.sleep(3)


_ENDED = r"Job '\S+' (?:was )?(succeeded|failed|stopped)"


def _follow_until(work: Path, shell: dict, job_id: str, text: str | None, timeout: float) -> str:
    """The job's log once it says `text` (None: once the job has ended). `ray job logs -f` streams it, one client
    rather than a `ray job` process (an import of Ray, a CPU-second or two) every few seconds; but Ray's stream can
    stay silent while the job writes (ray-project/ray#51601 and kin; CI once saw 600 s of nothing while the job's log
    had the line), so after each minute without the answer the whole log is read once, and the job's status."""
    deadline = time.monotonic() + timeout
    while True:
        said, ended = _follow(work, shell, job_id, text, max(1.0, min(60.0, deadline - time.monotonic())))
        if text is not None:
            if text in said:
                return said
            said = _ray_job(work, shell, "logs", job_id).stdout
            if text in said:
                return said
        elif re.search(_ENDED, _status(work, shell, job_id)):  # a stream may also end early, the job still running
            return said if ended else _ray_job(work, shell, "logs", job_id).stdout
        if time.monotonic() > deadline:
            raise AssertionError(f"{job_id} never said {text!r} within {timeout:.0f} s:\n{said[-3000:]}")


def _follow(work: Path, shell: dict, job_id: str, text: str | None, timeout: float) -> tuple[str, bool]:
    """`ray job logs -f` until `text` appears or `timeout`; returns what it said and whether the stream ended by
    itself (the job ended)."""
    follow = subprocess.Popen(
        [".venv/bin/ray", "job", "logs", "-f", job_id],
        cwd=work,
        env=shell,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    timer = threading.Timer(timeout, follow.kill)
    timer.start()
    seen = []
    try:
        assert follow.stdout is not None
        for line in follow.stdout:
            seen.append(line)
            if text is not None and text in line:
                break
    finally:
        timer.cancel()
        follow.kill()
        follow.wait()
    return "".join(seen), follow.returncode == 0


def _status(work: Path, shell: dict, job_id: str) -> str:
    st = _ray_job(work, shell, "status", job_id)
    return st.stdout + st.stderr


def _no_wait(work: Path, shell: dict, job: list[str]) -> str:
    """`ray job submit --no-wait`, once the head's agent answers; returns the job's id."""
    deadline = time.monotonic() + 360
    while True:
        r = _ray_job(work, shell, "submit", "--no-wait", "--working-dir", ".", "--", *job)
        if r.returncode == 0 or "No available agent" not in r.stdout + r.stderr or time.monotonic() > deadline:
            break
        time.sleep(3)
    assert r.returncode == 0, r.stdout + r.stderr
    (job_id,) = re.findall(r"Job '(raysubmit_\w+)' submitted successfully", r.stdout + r.stderr)
    return job_id


def _readme_job_beside_another(work: Path, shell: dict, small: list[str], where: str, store: Path) -> None:
    """On a head of 4 logical CPUs, every job asking for a 3-CPU worker: a job that holds the room, then the
    pretraining job as the README submits it (in .venv, without data/, which .rayignore kept out of the upload),
    which says in one line that other jobs hold the room and waits, and a one-trial sweep, whose trial waits in
    Tune's queue. The first job is then stopped (what it would train is the README job's story again): the README
    job and the sweep finish, in runs, locks and checkpoints of their own (different seeds: different run names, one
    store)."""
    one_worker = ["trainer.num_workers=1", "trainer.cpus_per_worker=3"]
    # epochs it cannot finish before it is stopped (200 once ended first, 8 min, on a quiet machine)
    holder = ["python", "jobs/pretrain.py", *small, "train.epochs=5000", "seed=2", *one_worker]
    holder += ["eval.probe.after_pretrain=false", "eval.knn.every=0"]
    first = _no_wait(work, shell, holder)
    _follow_until(work, shell, first, "worker(s), rank 0", 600)  # its worker placed: the room is held
    readme = ["python", "jobs/pretrain.py", *small, "train.epochs=2", "seed=1", "eval.knn.every=0", *one_worker]
    client, second = _started(
        ["sh", "-c", f"{shlex.join(['python', '-c', where])} && {shlex.join(readme)}"], work, shell
    )
    try:
        _follow_until(work, shell, second, "other jobs hold it now", 600)  # it waits: then the sweep
        # and a sweep beside them: its trial (3 CPUs) waits until the jobs' workers are gone. One trial: the hang this
        # guards against (a trial's driver holding the CPU Ray Data's read task needed) shows with one
        one_trial = "sweep.space={method.temperature: {grid: [0.2]}}"
        sweep = ["python", "jobs/tune.py", "+sweep=smoke", small[0], one_trial, "sweep.max_concurrent_trials=1"]
        sweep += one_worker
        third = _no_wait(work, shell, sweep)
        stop = _ray_job(work, shell, "stop", first)
        assert stop.returncode == 0, stop.stdout + stop.stderr
        out, _ = client.communicate(timeout=900)
    finally:
        client.kill()
    assert client.returncode == 0, out[-4000:]
    assert re.search(r"UPLOADED False True \S*/\.venv$", out, flags=re.M), out[-4000:]
    assert "succeeded" in out.lower() and "Linear probe on spirograph" in out
    logs = {second: _ray_job(work, shell, "logs", second).stdout}
    for job_id, end in ((first, "stopped"), (third, "succeeded")):
        logs[job_id] = _follow_until(work, shell, job_id, None, 600)  # to the job's end
        st = _status(work, shell, job_id)
        ended = re.search(_ENDED, st)
        assert ended and ended[1] == end, st[-2000:] + logs[job_id][-3000:]
    for job_id, said in {**logs, "the README job's client": out}.items():  # the stopped one may say how it ended
        assert "multiple active Ray instances" not in said, (job_id, said[-3000:])
        assert job_id == first or "Traceback" not in said, (job_id, said[-3000:])
    sweep_log = logs.pop(third)
    assert re.search(r"^Done: sweep \S+, 1 trial\(s\)", sweep_log, re.M), sweep_log[-3000:]  # its trial ran
    waited = [i for i in (first, second) if "other jobs hold it now" in logs[i]]
    assert waited == [second], {i: logs[i][-1500:] for i in logs}  # the first started, the second said so and waited
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{store / 'runs' / 'mlflow.db'}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    jobs = sorted((r.data.tags.get("job"), r.info.run_name) for r in runs)
    names = {re.search(r"^\[pretrain\] run (\S+)", logs[i], re.M)[1] for i in (first, second)}
    assert [job for job, _ in jobs] == ["pretrain", "pretrain", "tune", "tune-trial"], jobs
    assert len(names) == 2 and names == {name for job, name in jobs if job == "pretrain"}, (names, jobs)
    finished = {r.info.run_name: r.info.status for r in runs if r.data.tags.get("job") != "pretrain"}
    assert set(finished.values()) == {"FINISHED"}, finished
