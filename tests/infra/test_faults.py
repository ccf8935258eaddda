"""Faults on the multi-node harness, each with nothing lost beyond one checkpoint interval and one MLflow run: a
sweep trial's worker node removed mid-epoch, and a tracking server that refuses a job without its login. The fault
reports the steps redone: from the last step seen logged before the fault to the checkpoint the run resumed from (a
lower bound: the step logger flushes every few seconds), at most one checkpoint interval. A training worker process
killed mid-epoch (one rank of two, on two nodes) is test_multinode.py's, on the run whose curve it checks; a killed
driver is tests/tune/test_tune.py's (a sweep's, SIGKILL: its trial's run left RUNNING and resumed), Ctrl-C and a
worker's own error tests/test_interrupted_runs.py's; a lost node of a plain pretraining job is the same Train restart
as the sweep trial's here, so it is not run twice.

The cluster runs as a real one must, on storage every node shares (tests/services.py): the shards, Ray Train's
checkpoints and run state on S3 (moto's server), MLflow on a tracking server that asks for a login (its basic-auth
app) with its artifacts on the same S3. The nodes and the jobs reach S3 through their environment and log in to
MLflow with a credentials file in their HOME; nothing of either is in a job's command line or Ray's runtime env."""

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from services import BUCKET, on_storage
from sim_cluster import ROOT, TINY, SimCluster

pytestmark = pytest.mark.slow

EPOCHS, STEPS_PER_EPOCH = 3, 8  # 128 samples in batches of 16; a checkpoint every epoch
FAULTY = [
    *TINY,
    "data.generate.n_train=128",
    "train.batch_size=16",
    f"train.epochs={EPOCHS}",
    "train.checkpoint_every=1",
    "trainer.num_workers=1",
    "trainer.torch_threads=1",
    "trainer.worker_resources={single:1}",
    "trainer.max_failures=2",  # Ray Train restarts the worker group from the last checkpoint
    "tracking.flush_every_s=0",  # every step in the store at once: the fault's step is known
]


def _node_of_rank(c: SimCluster, run, rank: int) -> str:
    node_id = run.data.tags["worker_nodes"].split(",")[rank]
    return next(name for name, n in c.nodes().items() if n["node_id"] == node_id)


def _on_shared_storage(storage, c: SimCluster, root: Path, run, out: str, keys_before: set, prefix: str = "ray/"):
    """The job's checkpoints are on S3 under `prefix` (keys that were not there before it) and not on local disk; the
    run's artifacts are on S3 through the server; the server's password is in no output, param, tag or Ray log."""
    s3, server, _ = storage
    checkpoints = {k for k in s3.keys(BUCKET, prefix) if k.endswith("/state.pt")} - keys_before
    assert checkpoints, s3.keys(BUCKET, "ray/")
    assert not (root / "runs" / "ray").exists()
    artifacts = s3.keys(BUCKET, f"mlartifacts/{run.info.experiment_id}/{run.info.run_id}/artifacts/")
    assert any(k.endswith("checkpoint/state.pt") for k in artifacts) and any(
        k.endswith("config.yaml") for k in artifacts
    )
    assert server.password not in out
    assert not any(server.password in v for v in (*run.data.params.values(), *run.data.tags.values()))
    logs = [p for p in (c.dir / "ray").rglob("*") if p.is_file() and p.suffix in (".log", ".out", ".err", ".json")]
    assert logs and not any(server.password in p.read_text(errors="replace") for p in logs)
    # and detect-secrets, which finds a planted high-entropy token among such params, finds none in them
    dump = root / "params.json"
    dump.write_text(json.dumps(run.data.params, indent=1, sort_keys=True))
    scan = subprocess.run([sys.executable, "-m", "detect_secrets", "scan", str(dump)], capture_output=True, text=True)
    assert scan.returncode == 0 and json.loads(scan.stdout)["results"] == {}, scan.stdout[-2000:]


def test_the_tracking_server_refuses_whoever_lacks_its_login(storage, cluster, tmp_path):
    """No login, a wrong one: the server answers 401 to the REST API and to MlflowClient, and a job says so in one
    error line before it starts Ray or opens a run."""
    import requests

    s3, server, _ = storage
    api = f"{server.uri}/api/2.0/mlflow/experiments/search"
    assert requests.post(api, json={"max_results": 1}, timeout=30).status_code == 401
    assert requests.post(api, json={"max_results": 1}, auth=(server.username, "wrong"), timeout=30).status_code == 401
    assert requests.post(api, json={"max_results": 1}, auth=(server.username, server.password)).status_code == 200
    home = tmp_path / "home"  # a user without ~/.mlflow/credentials
    home.mkdir()
    env = {**cluster.job_env(), "HOME": str(home)}
    code = f"import mlflow; mlflow.MlflowClient({server.uri!r}).search_experiments()"
    r = subprocess.run(
        [sys.executable, "-c", code],
        env={**env, "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode != 0 and "401" in r.stderr, r.stderr[-2000:]
    job = subprocess.run(
        [
            sys.executable,
            str(ROOT / "jobs" / "pretrain.py"),
            f"paths.root={tmp_path}",
            f"trainer.address={cluster.address}",
            f"tracking.uri={server.uri}",
            *TINY,
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert job.returncode != 0
    assert job.stderr.strip().splitlines() == [
        f"error: tracking.uri={server.uri}: the MLflow server asks for a login and none is set (HTTP 401); set "
        "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD, or put them in ~/.mlflow/credentials"
    ], job.stderr[-3000:]
    assert not (tmp_path / "runs" / "mlflow.db").exists()


def test_a_sweep_trials_worker_node_lost(storage, cluster, tmp_path):
    """Two concurrent trials, one worker each on its own node; one trial's node is lost mid-epoch. Its Train run
    goes on from its last checkpoint on the spare node, inside the same trial (the trials' own actors live on the
    head), and the sweep ends with both trials finished, each one MLflow run with every step logged, and Tune's
    experiment state on S3."""
    s3, server, _ = storage
    name = "sweep_lost_node"
    keys_before = set(s3.keys(BUCKET, "ray/"))
    sweep = cluster.job(
        "tune.py",
        tmp_path,
        "+sweep=smoke",
        *FAULTY,
        "sweep.scheduler=fifo",
        "sweep.max_concurrent_trials=2",
        *on_storage(server, name),
    )
    client = server.client()
    # a generous bound: on a loaded 2-core machine the two trials' starts alone have taken over five minutes
    deadline, hit, placed = time.monotonic() + 900, None, {}
    while hit is None and time.monotonic() < deadline:
        assert sweep.poll() is None, sweep.communicate()[0][-4000:]
        exp = client.get_experiment_by_name(name)
        for run in client.search_runs([exp.experiment_id], "tags.job = 'tune-trial'") if exp else []:
            if "worker_nodes" not in run.data.tags:
                continue
            placed[run.info.run_id] = run.data.tags["worker_nodes"]
            history = client.get_metric_history(run.info.run_id, "train/loss")
            last = max((m.step for m in history), default=0)
            # a trial still training, past its first checkpoint: losing the node of one that ended tests nothing
            running = run.info.status == "RUNNING" and last < EPOCHS * STEPS_PER_EPOCH
            if len(placed) == 2 and running and last >= STEPS_PER_EPOCH + 3:
                hit = run, last
                break
        time.sleep(0.5)
    assert hit is not None, f"no trial reached step {STEPS_PER_EPOCH + 3} while both ran"
    # the two trials ran at once, each one worker asking for `single`: on two different nodes that have it
    singles = {n["node_id"] for n in cluster.nodes().values() if "single" in n["resources"]}
    assert len(set(placed.values())) == 2 and set(placed.values()) <= singles, (placed, singles)
    run, seen = hit
    lost = _node_of_rank(cluster, run, 0)
    cluster.remove_node(lost)
    try:
        out = sweep.communicate(timeout=600)[0]
        assert sweep.returncode == 0, out[-4000:]
    finally:
        cluster.add_node(lost + "_again", 1, {"single": 1})
    trials = client.search_runs([run.info.experiment_id], "tags.job = 'tune-trial'")
    assert len(trials) == 2 and all(t.info.status == "FINISHED" for t in trials), [t.info.status for t in trials]
    for t in trials:
        steps = {m.step for m in client.get_metric_history(t.info.run_id, "train/loss")}
        assert steps == set(range(1, EPOCHS * STEPS_PER_EPOCH + 1)), (t.info.run_name, sorted(steps))
    # the lost trial's Train run resumed once, from its last checkpoint (the Train workers' lines reach the sweep's
    # console; only the lost trial's workers resume)
    resumed = sorted({int(s) for s in re.findall(r"resumed from the checkpoint of epoch \d+/\d+ \(step (\d+)\)", out)})
    assert len(resumed) == 1 and resumed[0] % STEPS_PER_EPOCH == 0 and resumed[0] >= seen - STEPS_PER_EPOCH, (
        resumed,
        seen,
    )
    redone = max(0, seen - resumed[0])
    print(f"[{name}] node lost after step {seen}, the trial resumed at step {resumed[0]}: {redone} steps redone")
    assert any(k.endswith(".json") for k in s3.keys(BUCKET, "ray/sweep-smoke-")), s3.keys(BUCKET, "ray/")
    _on_shared_storage(storage, cluster, tmp_path, client.get_run(run.info.run_id), out, keys_before)
