"""Faults on the multi-node harness, each with nothing lost beyond one checkpoint interval and one MLflow run: a
training worker process killed mid-epoch, a whole worker node removed mid-epoch, the driver killed and the job
run again. Each test reports the steps redone: from the last step seen logged before the fault to the checkpoint the
run resumed from (a lower bound: the step logger flushes every few seconds), at most one checkpoint interval."""

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from sim_cluster import TINY, SimCluster, store

pytestmark = pytest.mark.slow

EPOCHS, STEPS_PER_EPOCH = 3, 8  # 128 samples in batches of 16; a checkpoint every epoch
FAULTY = [
    *TINY,
    "data.generate.n_train=128",
    "train.batch_size=16",
    f"train.epochs={EPOCHS}",
    "train.checkpoint_every=1",
    "trainer.num_workers=2",
    "trainer.torch_threads=1",
    "trainer.worker_resources={single:1}",
    "trainer.max_failures=2",  # Ray Train restarts the worker group from the last checkpoint
    "eval.probe.after_pretrain=false",
    "tracking.flush_every_s=0",  # every step in the store at once: the fault's step is known
]


@pytest.fixture(scope="module")
def cluster():
    """head (2 CPUs) and three nodes with room for one worker each: a 2-worker job has a spare node."""
    c = SimCluster(head_cpus=2)
    try:
        for name in ("single_a", "single_b", "single_c"):
            c.add_node(name, 1, {"single": 1})
        yield c
    finally:
        c.shutdown()


def _job(c: SimCluster, root: Path, name: str) -> subprocess.Popen:
    return c.job("pretrain.py", root, *FAULTY, f"run.name={name}")


def _runs(root: Path, name: str) -> list:
    client = store(root)
    exp = client.get_experiment_by_name("augssl")
    return client.search_runs([exp.experiment_id], f"attributes.run_name = '{name}'") if exp else []


def _wait_for_step(root: Path, name: str, step: int, job: subprocess.Popen, timeout: float = 300) -> tuple:
    """(the run, the last step it logged) once its logged loss reaches `step` (past the first checkpoint)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert job.poll() is None, job.communicate()[0][-4000:]
        runs = _runs(root, name)
        if runs:
            history = store(root).get_metric_history(runs[0].info.run_id, "train/loss")
            if history and max(m.step for m in history) >= step:
                return runs[0], max(m.step for m in history)
        time.sleep(0.5)
    raise AssertionError(f"the run never reached step {step}")


def _finished_with_nothing_lost(root: Path, name: str, out: str, seen: int) -> int:
    """One FINISHED run whose loss covers every step, resumed from the last checkpoint before step `seen` (the last
    logged before the fault) or a later one; returns the steps redone."""
    runs = _runs(root, name)
    assert len(runs) == 1 and runs[0].info.status == "FINISHED", [(r.info.run_id, r.info.status) for r in runs]
    steps = [m.step for m in store(root).get_metric_history(runs[0].info.run_id, "train/loss")]
    assert sorted(set(steps)) == list(range(1, EPOCHS * STEPS_PER_EPOCH + 1))  # every step trained and logged
    # one resume (Ray may echo the worker's line more than once)
    resumed = sorted({int(s) for s in re.findall(r"resumed from the checkpoint of epoch \d+/\d+ \(step (\d+)\)", out)})
    assert len(resumed) == 1, out[-3000:]
    assert resumed[0] % STEPS_PER_EPOCH == 0 and resumed[0] >= seen - STEPS_PER_EPOCH, (resumed, seen)
    redone = max(0, seen - resumed[0])
    print(
        f"[{name}] fault after step {seen}, resumed at step {resumed[0]}: {redone} steps redone at least "
        f"(one checkpoint interval: {STEPS_PER_EPOCH})"
    )
    return redone


def _node_of_rank(c: SimCluster, run, rank: int) -> str:
    node_id = run.data.tags["worker_nodes"].split(",")[rank]
    return next(name for name, n in c.nodes().items() if n["node_id"] == node_id)


def test_a_worker_process_killed_mid_epoch(cluster, tmp_path):
    job = _job(cluster, tmp_path, "killed_worker")
    run, seen = _wait_for_step(tmp_path, "killed_worker", STEPS_PER_EPOCH + 3, job)
    node = _node_of_rank(cluster, run, 1)
    (worker,) = cluster.processes(node, "RayTrainWorker")
    os.kill(worker, signal.SIGKILL)
    out = job.communicate(timeout=600)[0]
    assert job.returncode == 0, out[-4000:]
    _finished_with_nothing_lost(tmp_path, "killed_worker", out, seen)


def test_a_worker_node_removed_mid_epoch(cluster, tmp_path):
    job = _job(cluster, tmp_path, "lost_node")
    run, seen = _wait_for_step(tmp_path, "lost_node", STEPS_PER_EPOCH + 3, job)
    lost = _node_of_rank(cluster, run, 1)
    cluster.remove_node(lost)
    try:
        out = job.communicate(timeout=600)[0]
        assert job.returncode == 0, out[-4000:]
        _finished_with_nothing_lost(tmp_path, "lost_node", out, seen)
        # it went on over the two nodes left (the spare one took the lost one's place)
        placed = set(_runs(tmp_path, "lost_node")[0].data.tags["worker_nodes"].split(","))
        assert lost not in {name for name, n in cluster.nodes().items() if n["node_id"] in placed}
    finally:
        cluster.add_node(lost + "_again", 1, {"single": 1})  # the next test's spare


def test_the_driver_killed_then_the_job_run_again(cluster, tmp_path):
    job = _job(cluster, tmp_path, "killed_driver")
    _, seen = _wait_for_step(tmp_path, "killed_driver", STEPS_PER_EPOCH + 3, job)
    job.send_signal(signal.SIGKILL)
    job.wait(timeout=60)
    assert _runs(tmp_path, "killed_driver")[0].info.status == "RUNNING"  # killed outright: nobody closed it
    again = _job(cluster, tmp_path, "killed_driver")
    out = again.communicate(timeout=600)[0]
    assert again.returncode == 0, out[-4000:]
    assert "resuming run killed_driver" in out
    _finished_with_nothing_lost(tmp_path, "killed_driver", out, seen)
