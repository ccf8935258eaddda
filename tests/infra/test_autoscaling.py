"""Autoscaling on this machine: Ray's fake multi-node provider (worker nodes are raylets it starts and stops here)
driven by a cluster config made from infra/aws.yaml's node types. A pretraining job asking for more workers than the
head holds makes the autoscaler add nodes, trains on them, and once it ends the idle nodes are removed: each step
read from the autoscaler's own state (autoscaler v2's cluster status)."""

import time
from pathlib import Path

import pytest
import yaml

from sim_cluster import TINY, SimCluster, fake_autoscaling_config, store

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def _nodes_of(status: dict, node_type: str) -> int:
    """The running nodes of that type, busy or idle (a launch still pending is not a node yet)."""
    return status["active"].get(node_type, 0) + status["idle"].get(node_type, 0)


def test_a_job_bigger_than_the_head_makes_the_autoscaler_add_nodes_and_remove_them_after(tmp_path):
    from ray.autoscaler._private.fake_multi_node.node_provider import FAKE_HEAD_NODE_ID

    launcher = yaml.safe_load((ROOT / "infra" / "aws.yaml").read_text())
    (worker_type,) = [t for t in launcher["available_node_types"] if t != launcher["head_node_type"]]
    config = fake_autoscaling_config(launcher, head_cpus=2, worker_cpus=1, max_workers=2, idle_minutes=0.1)
    t0 = time.monotonic()
    c = SimCluster(head_cpus=2, autoscaling=config)
    try:
        assert _nodes_of(c.status(), worker_type) == 0  # the launcher's min_workers: 0
        job = c.job(
            "pretrain.py",
            tmp_path,
            *TINY,
            "trainer.num_workers=2",
            "trainer.torch_threads=1",
            f"trainer.worker_resources={{{worker_type}:1}}",
            "trainer.autoscale=true",
            "trainer.resource_wait_s=240",
            "eval.probe.after_pretrain=false",
        )
        most = 0
        while job.poll() is None and time.monotonic() - t0 < 420:
            most = max(most, _nodes_of(c.status(), worker_type))
            time.sleep(2)
        out = job.communicate(timeout=60)[0]
        assert job.returncode == 0, out[-4000:]
        assert f"asked the autoscaler for trainer.num_workers=2 x (1 CPU + 1 {worker_type})" in out
        assert most == 2  # one node per worker: each offers one unit of its type's resource

        client = store(tmp_path)
        (run,) = client.search_runs([client.get_experiment_by_name("augssl").experiment_id])
        assert run.info.status == "FINISHED"
        placed = run.data.tags["worker_nodes"].split(",")
        # the provider's nodes (fixed ids it gives them), two of them, not the head
        assert len(set(placed)) == 2 and FAKE_HEAD_NODE_ID not in placed
        assert all(p.startswith("fffff") for p in placed)

        # the job withdrew its request: idle past idle_timeout_minutes (6 s), the nodes are removed
        deadline = time.monotonic() + 120
        while _nodes_of(c.status(), worker_type) and time.monotonic() < deadline:
            time.sleep(2)
        assert _nodes_of(c.status(), worker_type) == 0
    finally:
        c.shutdown()
    assert time.monotonic() - t0 < 300  # the bound for this test
