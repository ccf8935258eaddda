"""Past one machine, on one machine: a Ray cluster of four nodes (tests/sim_cluster.py: a head and three worker
raylets, each with its own CPUs and custom resources), jobs joining it with trainer.address, Ray placing their
workers on different nodes, and the cluster refusing whoever lacks its token."""

import json
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from sim_cluster import TINY, SimCluster, store

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster():
    """head (2 CPUs: the drivers' Ray Data tasks), `pair` (room for two workers), `single_a`, `single_b` (one
    each): a job's trainer.worker_resources picks which."""
    c = SimCluster(head_cpus=2)
    try:
        c.add_node("pair", 2, {"pair": 2})
        c.add_node("single_a", 1, {"single": 1})
        c.add_node("single_b", 1, {"single": 1})
        yield c
    finally:
        c.shutdown()


def _pretrain(c: SimCluster, root: Path, *overrides: str) -> str:
    job = c.job("pretrain.py", root, *TINY, *overrides)
    out = job.communicate(timeout=600)[0]
    assert job.returncode == 0, f"pretrain failed ({job.returncode}):\n{out[-6000:]}"
    return out


def _run(root: Path, name: str):
    client = store(root)
    exp = client.get_experiment_by_name("augssl")
    runs = client.search_runs([exp.experiment_id], f"attributes.run_name = '{name}'")
    assert len(runs) == 1, [r.info.run_name for r in runs]
    run = runs[0]
    losses = [m.value for m in sorted(client.get_metric_history(run.info.run_id, "train/loss"), key=lambda m: m.step)]
    return run, np.array(losses)


def test_one_node_two_workers_and_two_nodes_one_worker_give_the_same_curve(cluster, tmp_path):
    same = [
        "trainer.num_workers=2",
        "trainer.cpus_per_worker=1",
        "trainer.torch_threads=1",
        "train.deterministic_data=true",
        "seed=3",
    ]
    # the run's identity leaves the worker layout out (a run resumes on another layout): two names
    jobs = [
        _pretrain(cluster, tmp_path, *same, "trainer.worker_resources={pair:1}", "run.name=one_node"),
        _pretrain(cluster, tmp_path, *same, "trainer.worker_resources={single:1}", "run.name=two_nodes"),
    ]
    nodes = {name: n["node_id"] for name, n in cluster.nodes().items()}
    one, loss_one = _run(tmp_path, "one_node")
    two, loss_two = _run(tmp_path, "two_nodes")
    # Ray's placement, as each worker saw it (rank order)
    assert one.data.tags["worker_nodes"].split(",") == [nodes["pair"]] * 2
    assert sorted(two.data.tags["worker_nodes"].split(",")) == sorted([nodes["single_a"], nodes["single_b"]])
    assert one.info.status == two.info.status == "FINISHED"
    assert len(loss_one) == len(loss_two) >= 8
    np.testing.assert_allclose(loss_one, loss_two, rtol=1e-4, atol=1e-5)
    # the cluster's token reached neither the jobs' output nor what their runs logged
    token = cluster.token_path.read_text().strip()
    for job in jobs:
        assert token not in job
    for run in (one, two):
        assert not any(token in str(v) for v in [*run.data.params.values(), *run.data.tags.values()])


def test_a_sweeps_two_concurrent_trials_train_on_two_nodes(cluster, tmp_path):
    sweep = cluster.job(
        "tune.py",
        tmp_path,
        "+sweep=smoke",
        "trainer.worker_resources={single:1}",
        "trainer.torch_threads=1",
        "sweep.max_concurrent_trials=2",
        "gallery.at_pretrain=false",
        "data.generate.n_train=256",
        "data.generate.n_val=128",
        "data.generate.maxcount=128",
        "eval.knn.bank_size=256",
        "eval.knn.val_size=128",
        "eval.probe.steps=10",
    )
    out = sweep.communicate(timeout=600)[0]
    assert sweep.returncode == 0, out[-6000:]
    client = store(tmp_path)
    runs = client.search_runs([client.get_experiment_by_name("augssl").experiment_id])
    trials = [t for t in runs if t.data.tags.get("job") == "tune-trial"]
    assert len(trials) == 2 and all(t.info.status == "FINISHED" for t in trials)
    nodes = {name: n["node_id"] for name, n in cluster.nodes().items()}
    # each trial's one worker asked for `single`: the two ran at once, so on the two nodes that have it
    assert sorted(t.data.tags["worker_nodes"] for t in trials) == sorted([nodes["single_a"], nodes["single_b"]])


def test_the_cluster_refuses_a_driver_and_a_dashboard_call_without_its_token(cluster, tmp_path):
    env = cluster.job_env(HOME=str(tmp_path))  # no ~/.ray/auth_token there either
    no_token = {k: v for k, v in env.items() if k != "RAY_AUTH_TOKEN_PATH"}
    code = f"import ray; ray.init(address={cluster.address!r}); print('joined', len(ray.nodes()))"
    submit = [str(Path(sys.executable).with_name("ray")), "job", "submit", "--address", cluster.dashboard]
    # at once (each is a Python start and a refused handshake): drivers without a token and with a wrong one, and
    # `ray job submit` without the token
    tries = {
        "no token": ([sys.executable, "-c", code], no_token | {"RAY_AUTH_MODE": "disabled"}),
        "wrong token": ([sys.executable, "-c", code], no_token | {"RAY_AUTH_TOKEN": "0" * 64}),
        "job submit": ([*submit, "--", "echo", "ran"], no_token | {"RAY_AUTH_MODE": "disabled"}),
    }
    procs = {
        name: subprocess.Popen(cmd, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for name, (cmd, e) in tries.items()
    }
    done = {name: (p.communicate(timeout=120), p.returncode) for name, p in procs.items()}
    for name in ("no token", "wrong token"):
        (out, err), rc = done[name]
        assert rc != 0 and "joined" not in out, (name, out)
        assert "AuthenticationError" in err or "InvalidAuthToken" in err, (name, err[-2000:])
    (out, _), rc = done["job submit"]
    assert rc != 0 and "ran" not in out.splitlines(), out[-2000:]
    # the dashboard's job API: refused without the token, answered with it, and no job was made above
    url = f"{cluster.dashboard}/api/jobs/"
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(url, timeout=30)
    assert refused.value.code in (401, 403)
    token = cluster.token_path.read_text().strip()
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    jobs = json.loads(urllib.request.urlopen(req, timeout=30).read())
    assert [j for j in jobs if j["type"] == "SUBMISSION"] == []  # the drivers of the tests above are listed too
