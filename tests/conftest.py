"""Shared fixtures, and how `make test` spreads the suite over pytest-xdist's workers."""

import os
from collections import Counter
from dataclasses import dataclass

import pytest

# Train's preemption watcher (one actor per run, polling for nodes being drained: spot instances) on the simulated
# clusters too, where no node is ever drained: a process and a share of two cores per run. A private cluster turns
# it off itself (pipeline.cluster.init_ray); the jobs the tests start inherit this.
os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")

if os.environ.get("PYTEST_XDIST_WORKER"):
    # `make test`'s two workers on two cores: torch's default of a thread per core puts four busy threads on two
    # cores whenever both run torch, and OpenMP's spinning threads then slow each other down (a ResNet-50 fine-tune
    # took 10 s in one run of the suite and 82 s in the next). One each keeps both cores busy without that.
    import torch

    torch.set_num_threads(1)
    # and the jobs the tests start: each worker's share of the cores (pipeline/cores.py), which sizes the threads
    # a job leaves to the machine. At a thread per core, a 1-worker job beside the other pytest worker's busy
    # process trained 20 times slower for 4 times the CPU (OpenMP's threads spinning for a descheduled peer)
    share = (os.cpu_count() or 1) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    os.environ.setdefault("AUGSSL_CORES", str(max(1, share)))

# A folder whose tests share a package-scoped fixture (tests/infra: one multi-node cluster) is one unit of work, so
# that one worker starts it; every other file is a unit of its own (what --dist loadfile does).
SHARED_FOLDERS = ("tests/infra/",)


def work_unit(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    return next((folder for folder in SHARED_FOLDERS if path.startswith(folder)), path)


def pytest_collection_modifyitems(config, items):
    """The units with the most end-to-end (`slow`) tests first, the rest after in their own order, so the two
    workers do not end on one long unit the other waits for; a unit's tests keep their order. With AUGSSL_SLOW_LAST
    set (make gpu-check: one process, a time cap) the `slow` tests go last instead, so that a cap stopping an
    end-to-end run has not cost the unit tests."""
    order = {id(item): i for i, item in enumerate(items)}
    if os.environ.get("AUGSSL_SLOW_LAST"):
        items.sort(key=lambda item: (item.get_closest_marker("slow") is not None, order[id(item)]))
        return
    slow = Counter(work_unit(item.nodeid) for item in items if item.get_closest_marker("slow"))
    items.sort(key=lambda item: (-slow[work_unit(item.nodeid)], order[id(item)]))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    # xdist would otherwise hand out the units with the most tests first (many fast parametrised cases), which put
    # the end-to-end files last: one worker ran tests/test_e2e.py alone for the suite's last minutes
    config.option.loadscopereorder = False

    class ByWorkUnit(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return ByWorkUnit(config, log)


@dataclass
class S3:
    client: object  # boto3 S3 client on the local server
    options: str  # URI query that points pyarrow at it: s3://bucket/key<options>


@pytest.fixture
def s3(monkeypatch):
    """A moto S3 server on loopback standing in for the cloud object store."""
    moto_server = pytest.importorskip("moto.server")
    boto3 = pytest.importorskip("boto3")
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(var, "test")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield S3(
            boto3.client("s3", endpoint_url=f"http://{host}:{port}"),
            f"?endpoint_override={host}:{port}&scheme=http&region=us-east-1",
        )
    finally:
        server.stop()


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny convolutions: one intra-op thread is far faster than several on a shared machine."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
