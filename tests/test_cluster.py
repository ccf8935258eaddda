"""How a job starts or joins Ray (pipeline/cluster.py), with ray.init replaced: what the real clusters do with it is
tests/test_job_submit.py's (a job submitted to `make cluster`'s head while another Ray runs on the machine)."""

import socket
import threading
import time

import pytest
import ray.data
import ray.util

import pipeline.cluster
from helpers import free_port
from pipeline.cluster import init_ray, unreachable

# Ray Data's context, made on first use, names its own deprecated settings
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:ray.data.context")


@pytest.fixture
def inits(monkeypatch):
    """ray.init's keyword arguments, call by call; what init_ray sets in this process is put back after."""
    calls: list[dict] = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: calls.append(kw))
    monkeypatch.setattr(pipeline.cluster, "unreachable", lambda address: None)  # the addresses here are made up
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    for var in ("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "RAY_prestart_worker_first_driver"):
        monkeypatch.setenv(var, "0")
    ctx = ray.data.DataContext.get_current()
    monkeypatch.setattr(ctx, "enable_progress_bars", ctx.enable_progress_bars)
    return calls


@pytest.mark.parametrize("address", ["10.0.0.5:6379", "head.internal:6379"])
def test_a_joined_clusters_gcs_is_named_to_the_jobs_workers(inits, address):
    init_ray({"address": address, "num_workers": 1, "cpus_per_worker": 1})
    (kw,) = inits
    assert kw["address"] == address and kw["runtime_env"] == {"env_vars": {"RAY_ADDRESS": address}}


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "[::1]"])
def test_a_loopback_gcs_is_named_by_this_nodes_address(inits, monkeypatch, host):
    """A worker on another node would read loopback as itself."""
    monkeypatch.setattr(ray.util, "get_node_ip_address", lambda: "10.0.0.7")
    init_ray({"address": f"{host}:6379", "num_workers": 1, "cpus_per_worker": 1})
    assert inits[0]["address"] == f"{host}:6379"  # the driver joins as told
    assert inits[0]["runtime_env"] == {"env_vars": {"RAY_ADDRESS": "10.0.0.7:6379"}}


def test_ray_job_submits_address_reaches_the_workers_too(inits, monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "192.0.2.2:6392")  # what `ray job submit` hands its driver: the node's GCS
    init_ray({"address": None, "num_workers": 1, "cpus_per_worker": 1})
    assert inits[0]["runtime_env"] == {"env_vars": {"RAY_ADDRESS": "192.0.2.2:6392"}}


@pytest.mark.parametrize("address", ["auto", "ray://10.0.0.5:10001", "http://127.0.0.1:8265"])
def test_addresses_that_are_not_a_gcs_leave_the_runtime_env_alone(inits, address):
    init_ray({"address": address, "num_workers": 1, "cpus_per_worker": 1})
    assert inits[0]["address"] == address and "runtime_env" not in inits[0]


def test_a_private_cluster_names_its_own_gcs_to_its_workers(inits):
    init_ray({"address": None, "num_workers": 1, "cpus_per_worker": 1})
    (kw,) = inits
    gcs = kw["runtime_env"]["env_vars"]["RAY_ADDRESS"]
    assert kw["address"] == "local" and gcs.startswith("127.0.0.1:") and gcs.rpartition(":")[2].isdigit()


def test_a_submitted_job_whose_runtime_env_sets_ray_address_keeps_it(inits, monkeypatch):
    """Ray refuses to merge two values of one env var: the job's own stands."""
    job = '{"runtime_env": {"env_vars": {"RAY_ADDRESS": "10.0.0.9:6379"}}, "metadata": {}}'
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", job)
    init_ray({"address": "10.0.0.5:6379", "num_workers": 1, "cpus_per_worker": 1})
    assert "runtime_env" not in inits[0]


def test_a_cluster_that_is_not_there_is_one_config_error_line(monkeypatch):
    """What Ray raises when it finds no cluster at the address (or, for auto, two on this machine): one line."""
    from pipeline.config import ConfigError

    def refused(**kw):
        raise ConnectionError("Could not find any running Ray instance.\nPlease specify the one to connect to.")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", refused)
    monkeypatch.setattr(pipeline.cluster, "unreachable", lambda address: None)
    with pytest.raises(ConfigError) as e:
        init_ray({"address": "auto", "num_workers": 1, "cpus_per_worker": 1})
    assert str(e.value) == (
        "trainer.address=auto: Could not find any running Ray instance. Please specify the one to connect to."
    )


@pytest.mark.parametrize("key", ["trainer.address", "RAY_ADDRESS"])
def test_a_cluster_that_has_gone_is_one_line_in_seconds_without_ray(monkeypatch, key):
    """A stale RAY_ADDRESS (a head stopped since) or a wrong port: a TCP connect refused past the wait says so,
    where ray.init retries the GCS for minutes, printing a warning a second."""
    from pipeline.config import ConfigError

    def joined(**kw):
        raise AssertionError("ray.init was called")

    address = f"127.0.0.1:{free_port()}"
    monkeypatch.setattr(pipeline.cluster, "REFUSED_WAIT_S", 1.0)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", joined)
    if key == "RAY_ADDRESS":
        monkeypatch.setenv("RAY_ADDRESS", address)
    t0 = time.monotonic()
    with pytest.raises(ConfigError) as e:
        init_ray({"address": address if key == "trainer.address" else None, "num_workers": 1, "cpus_per_worker": 1})
    assert str(e.value) == f"{key}={address}: nothing answers there (Connection refused); is the cluster up?"
    assert time.monotonic() - t0 < 10


@pytest.mark.parametrize("family, host", [(socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "[::1]")])
def test_an_address_something_listens_on_is_reachable(family, host):
    with socket.socket(family) as server:
        try:
            server.bind((host.strip("[]"), 0))
        except OSError as e:
            pytest.skip(f"no {host} here: {e}")
        server.listen()
        assert unreachable(f"{host}:{server.getsockname()[1]}") is None


def test_a_head_that_starts_listening_within_the_wait_is_reachable(monkeypatch):
    """A head still starting refuses for a moment: the check waits it out (up to REFUSED_WAIT_S)."""
    monkeypatch.setattr(pipeline.cluster, "REFUSED_WAIT_S", 20.0)
    port = free_port()
    server = socket.socket()

    def listen_later():
        time.sleep(1.5)
        server.bind(("127.0.0.1", port))
        server.listen()

    later = threading.Thread(target=listen_later)
    later.start()
    try:
        assert unreachable(f"127.0.0.1:{port}") is None
    finally:
        later.join()
        server.close()


def test_addresses_ray_resolves_or_reaches_otherwise_are_not_checked():
    assert unreachable("no-such-host.invalid:6379")  # the resolver's reason, at once
    for address in ("auto", "http://127.0.0.1:8265", f"ray://127.0.0.1:{free_port()}"):
        assert unreachable(address) is None, address  # Ray's to resolve; a client may go through a proxy
