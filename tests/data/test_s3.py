"""Object-store shards: the manifest, Ray Data's training stream and the eval reader all work on s3://
(a local moto S3 server on loopback stands in for the cloud)."""

import pytest

from pipeline.data.reader import load_split, train_dataset
from pipeline.data.spirograph_shards import make_spirograph_splits

pytestmark = pytest.mark.slow


@pytest.fixture
def s3_spirograph(tmp_path, s3):
    s3.client.create_bucket(Bucket="ssl")
    make_spirograph_splits(tmp_path, 40, 10, seed=3, size=16, maxcount=15, progress=False)
    for split in ("train", "val"):
        for path in (tmp_path / split).iterdir():
            s3.client.upload_file(str(path), "ssl", f"spiro/{split}/{path.name}")
    return f"s3://ssl/spiro/train{s3.options}", tmp_path


def test_ray_data_and_eval_reader_stream_s3_shards(s3_spirograph):
    import ray

    uri, local = s3_spirograph
    ray.init(address="local", num_cpus=2, include_dashboard=False)
    try:
        rows = train_dataset(uri, shuffle_files=False).take_all()
    finally:
        ray.shutdown()
    assert len(rows) == 40
    assert all(isinstance(r["png"], bytes) and r["png"][:4] == b"\x89PNG" for r in rows)  # bytes untouched
    split = load_split(uri, "regression", ["m", "b", "sigma", "f_r"])
    same = load_split(str(local / "train"), "regression", ["m", "b", "sigma", "f_r"])
    assert split.encoded == same.encoded and (split.y == same.y).all()
    assert sorted(r["png"] for r in rows) == sorted(same.encoded)


@pytest.mark.parametrize("where", ["missing-bucket/spiro", "ssl/no-such-prefix"])
def test_s3_shards_that_are_not_there_stop_the_job_in_one_line_before_ray(s3_spirograph, tmp_path, where):
    """An object store that answers with an error (a bucket or key that is not there; pyarrow's S3 client has
    already retried what it retries): `jobs/pretrain.py` says so in one `error:` line naming the key, before Ray or
    MLflow, and writes nothing."""
    import subprocess
    import sys
    from pathlib import Path

    from helpers import job_env

    uri, _ = s3_spirograph
    host = uri[uri.index("endpoint_override=") :].split("&")[0].split("=")[1]
    env = {**job_env(), "AWS_ENDPOINT_URL": f"http://{host}"}  # plain s3:// URIs, as a user's cluster has them
    root = Path(__file__).resolve().parents[2]
    r = subprocess.run(
        [
            sys.executable,
            str(root / "jobs" / "pretrain.py"),
            f"paths.root={tmp_path / 'job'}",
            "data=cifar10",
            f"data.train=s3://{where}/train",
            f"data.val=s3://{where}/val",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: data.train=s3://{where}/train"), lines
    assert not (tmp_path / "job" / "runs").exists()
