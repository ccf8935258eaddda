"""The cluster can hold the workers asked for, or the job says so in one line before any MLflow run; an autoscaling
cluster is waited for, saying what for."""

import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.config import ConfigError
from pipeline.train import resources
from pipeline.train.resources import check_resources, withdraw_request, worker_bundle, workers_that_fit

ROOT = Path(__file__).resolve().parents[2]
GPU_TRAINER = {"num_workers": 2, "use_gpu": True, "cpus_per_worker": 1, "gpus_per_worker": 1}


def test_workers_fit_per_node_not_in_the_sum():
    bundle = {"CPU": 4.0, "GPU": 1.0}
    assert workers_that_fit([{"CPU": 16, "GPU": 1}], bundle) == 1
    assert workers_that_fit([{"CPU": 16, "GPU": 8}], bundle) == 4  # CPU-bound on that node
    # 2 GPUs and 8 CPUs in all, but no node has both a GPU and 4 CPUs
    assert workers_that_fit([{"CPU": 2, "GPU": 1}, {"CPU": 2, "GPU": 1}, {"CPU": 4}], bundle) == 0
    assert workers_that_fit([{"CPU": 3.0}], {"CPU": 1.5}) == 2
    assert workers_that_fit([{"CPU": 2}], {"CPU": 1, "GPU": 0.5}) == 0


def test_worker_bundle_asks_for_gpus_only_with_use_gpu():
    assert worker_bundle({**GPU_TRAINER, "use_gpu": False}) == {"CPU": 1.0}
    assert worker_bundle(GPU_TRAINER) == {"CPU": 1.0, "GPU": 1.0}


def test_worker_bundle_adds_the_custom_resources_and_strict_spread_places_one_a_node():
    trainer = {**GPU_TRAINER, "use_gpu": False, "worker_resources": {"single": 1}}
    assert worker_bundle(trainer) == {"CPU": 1.0, "single": 1.0}
    nodes = [{"CPU": 4.0, "single": 2.0}, {"CPU": 4.0}]
    assert workers_that_fit(nodes, worker_bundle(trainer)) == 2  # both on the first node
    assert workers_that_fit(nodes, worker_bundle(trainer), one_per_node=True) == 1
    check_resources(trainer, nodes=lambda: nodes, sleep=pytest.fail)
    with pytest.raises(ConfigError, match="room for 1 .*STRICT_SPREAD places one worker a node"):
        check_resources({**trainer, "placement_strategy": "STRICT_SPREAD"}, nodes=lambda: nodes, sleep=pytest.fail)
    with pytest.raises(ConfigError, match=r"\(1 CPU \+ 1 single \+ 1 gpu_node\).*room for 0.*no node offers gpu_node"):
        check_resources(
            {**trainer, "worker_resources": {"single": 1, "gpu_node": 1}}, nodes=lambda: nodes, sleep=pytest.fail
        )


def test_a_fixed_cluster_too_small_fails_in_one_line_naming_both_sides():
    with pytest.raises(ConfigError) as e:
        check_resources(GPU_TRAINER, nodes=lambda: [{"CPU": 16.0, "GPU": 1.0}], sleep=pytest.fail)
    msg = str(e.value)
    assert "\n" not in msg
    assert "trainer.num_workers=2 x (1 CPU + 1 GPU)" in msg and "16 CPU, 1 GPU" in msg and "room for 1" in msg


def test_enough_resources_pass_without_waiting():
    check_resources(GPU_TRAINER, nodes=lambda: [{"CPU": 8.0, "GPU": 2.0}], sleep=pytest.fail)


def test_an_autoscaling_cluster_is_asked_for_the_workers_then_waited_for_with_progress():
    offers = iter([[{"CPU": 8.0}], [{"CPU": 8.0}], [{"CPU": 8.0}, {"CPU": 8.0, "GPU": 4.0}]])
    said, slept, asked = [], [], []
    assert check_resources(
        {**GPU_TRAINER, "autoscale": True, "resource_wait_s": 60},
        nodes=lambda: next(offers),
        sleep=slept.append,
        log=said.append,
        poll_s=0.01,
        request=asked.append,
    )
    # the autoscaler sees no pending work before Train asks: the job asks it for the workers itself
    assert asked == [[{"CPU": 1.0, "GPU": 1.0}] * 2]
    assert len(slept) == 2
    assert "asked the autoscaler for trainer.num_workers=2 x (1 CPU + 1 GPU)" in said[0]
    assert "waiting for the autoscaler" in said[1] and "0 GPU" in said[1]


def test_a_cluster_that_fits_is_neither_asked_nor_waited_for():
    assert not check_resources(
        {**GPU_TRAINER, "autoscale": True},
        nodes=lambda: [{"CPU": 8.0, "GPU": 2.0}],
        sleep=pytest.fail,
        request=pytest.fail,
    )


def test_an_autoscaling_cluster_that_never_grows_fails_after_the_wait_and_withdraws_the_request():
    asked = []
    with pytest.raises(ConfigError, match="still cannot be placed"):
        check_resources(
            {**GPU_TRAINER, "autoscale": True, "resource_wait_s": 0.05},
            nodes=lambda: [{"CPU": 2.0}],
            sleep=time.sleep,
            log=lambda s: None,
            poll_s=0.01,
            request=asked.append,
        )
    assert asked == [[{"CPU": 1.0, "GPU": 1.0}] * 2, []]


@pytest.mark.slow
def test_gpu_workers_on_a_machine_without_them_fail_fast_without_an_mlflow_run(tmp_path):
    """The H100 report: 2 workers x 1 GPU on a 1-GPU machine hung with no message. Here: GPUs on a machine with
    none, the same shape of mistake, through the command a user types."""
    t0 = time.monotonic()
    r = subprocess.run(
        [
            sys.executable,
            str(ROOT / "jobs" / "pretrain.py"),
            f"paths.root={tmp_path}",
            "data.generate.n_train=300",
            "data.generate.n_val=100",
            "trainer.use_gpu=true",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
    )
    took = time.monotonic() - t0
    assert r.returncode == 2, r.stderr[-3000:]
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "GPU" in errors[0] and "trainer.num_workers=2" in errors[0], r.stderr[-3000:]
    assert took < 120, f"took {took:.0f} s"
    db = tmp_path / "runs" / "mlflow.db"
    if db.exists():  # the store may exist; no run in it
        import sqlite3

        with sqlite3.connect(db) as c:
            assert c.execute("select count(*) from runs").fetchone()[0] == 0


def test_withdrawing_the_request_never_raises_and_says_what_is_left(monkeypatch):
    def gone(bundles):
        raise ConnectionError("the cluster is gone")

    monkeypatch.setattr(resources, "request_workers", gone)
    said = []
    withdraw_request(said.append)
    assert len(said) == 1 and "ConnectionError: the cluster is gone" in said[0] and "stay up" in said[0]


def test_workers_that_fit_but_are_held_by_other_jobs_are_waited_for_and_said_once_a_minute(monkeypatch):
    """Two jobs on one head: the totals fit, the free room does not until the other job ends."""
    trainer = {"num_workers": 1, "cpus_per_worker": 2, "use_gpu": False, "resource_wait_s": 300}
    nodes = [{"CPU": 4.0}]
    frees = iter([{"CPU": 1.0}] * 8 + [{"CPU": 3.0}])
    clock = {"t": 0.0}
    said: list[str] = []

    def sleep(s):
        clock["t"] += s

    monkeypatch.setattr(resources.time, "monotonic", lambda: clock["t"])  # the waits pass on this clock
    assert not check_resources(trainer, nodes=lambda: nodes, sleep=sleep, log=said.append, free=lambda: next(frees))
    assert said[0].startswith("waiting for trainer.num_workers=1 x (2 CPU): the cluster has room for them but other")
    assert "(free: 1 CPU)" in said[0] and "trainer.resource_wait_s=300 s" in said[0]
    assert len([s for s in said if s.startswith("waiting")]) == 2  # 80 s of waiting: said at 0 and at 60 s
    assert said[-1] == "trainer.num_workers=1 x (2 CPU) free now: starting"
    # never free: one line after resource_wait_s, no hang
    with pytest.raises(ConfigError, match=r"still held by other jobs after trainer.resource_wait_s=300 s"):
        check_resources(trainer, nodes=lambda: nodes, sleep=sleep, log=said.append, free=lambda: {"CPU": 1.0})
    # free room: no wait at all
    assert not check_resources(trainer, nodes=lambda: nodes, sleep=pytest.fail, free=lambda: {"CPU": 4.0})
