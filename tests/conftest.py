"""Shared fixtures."""

from dataclasses import dataclass

import pytest


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
