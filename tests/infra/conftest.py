"""One multi-node cluster for the cluster tests of this folder (test_faults, test_multinode), on storage every node
shares: S3 (moto) holding the shards, Ray Train's checkpoints and Tune's state, and an MLflow server with a login
whose artifacts are on that S3 (tests/services.py). Package-scoped (this folder is a package for that): it starts
once, and stops when the folder's tests are done."""

import os

import pytest

from services import BUCKET, MlflowServer, MotoS3, write_credentials
from sim_cluster import SimCluster

DATA = {"n_train": 128, "n_val": 128, "seed": 0, "size": 32, "maxcount": 128}  # sim_cluster.TINY's, 128 samples


@pytest.fixture(scope="package")
def storage(tmp_path_factory):
    """(s3, server, home): S3 holding the shards under spirograph/, the MLflow server, a HOME with its login."""
    from pipeline.data.spirograph_shards import make_spirograph_splits

    s3 = MotoS3()
    server = None
    try:
        s3.client().create_bucket(Bucket=BUCKET)
        local = tmp_path_factory.mktemp("spirograph")
        make_spirograph_splits(local, progress=False, **DATA)
        s3.upload_tree(local, BUCKET, "spirograph")
        server = MlflowServer(tmp_path_factory.mktemp("mlflow"), f"s3://{BUCKET}/mlartifacts", s3.env)
        home = tmp_path_factory.mktemp("home")
        write_credentials(home, server.username, server.password)
        with pytest.MonkeyPatch.context() as mp:  # the tests' own clients log in through this process's environment
            mp.setenv("MLFLOW_TRACKING_USERNAME", server.username)
            mp.setenv("MLFLOW_TRACKING_PASSWORD", server.password)
            yield s3, server, home
    finally:
        if server is not None:
            server.stop()
        s3.stop()


@pytest.fixture(scope="package")
def cluster(storage):
    """A head (2 CPUs: the drivers' Ray Data tasks), `pair` (room for two workers) and `single_a`, `single_b`,
    `single_c` (one each: a 2-worker job on them has a spare node); a job's trainer.worker_resources picks which.
    Every node's environment has the S3 endpoint and keys and a HOME with the MLflow login, as a cloud node's
    role and file_mounts would give it."""
    s3, _, home = storage
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "AWS_"))}
    c = SimCluster(head_cpus=2, base_env={**keep, **s3.env, "HOME": str(home)})
    try:
        c.add_node("pair", 2, {"pair": 2})
        for name in ("single_a", "single_b", "single_c"):
            c.add_node(name, 1, {"single": 1})
        yield c
    finally:
        c.shutdown()
