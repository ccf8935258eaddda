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


def _through(proxy, uri: str) -> str:
    """The same s3:// URI, its endpoint the fault-injecting proxy."""
    host = uri[uri.index("endpoint_override=") :].split("&")[0].split("=")[1]
    return uri.replace(host, proxy.endpoint.split("//")[1])


def _moto(uri: str) -> str:
    return "http://" + uri[uri.index("endpoint_override=") :].split("&")[0].split("=")[1]


@pytest.mark.parametrize("reset", [False, True], ids=["503-slow-down", "connection-reset"])
def test_throttled_or_reset_s3_reads_lose_no_sample(s3_spirograph, reset):
    """Every shard's first GET answered `503 SlowDown` (S3's throttling) or cut without an answer: Ray Data's
    training stream and the eval reader still read every sample once (pyarrow's S3 client retries)."""
    import ray

    from services import FlakyS3

    uri, local = s3_spirograph
    proxy = FlakyS3(_moto(uri), fails=1, reset=reset, keys=".tar")
    ray.init(address="local", num_cpus=2, include_dashboard=False)
    try:
        rows = train_dataset(_through(proxy, uri), shuffle_files=False).take_all()
    finally:
        ray.shutdown()
    assert sorted(proxy.failed.values()) == [1, 1, 1]  # each of the 3 shards refused once
    same = load_split(str(local / "train"), "regression", ["m", "b", "sigma", "f_r"])
    assert sorted(r["png"] for r in rows) == sorted(same.encoded)
    proxy.failed.clear()
    again = FlakyS3(_moto(uri), fails=1, reset=reset, keys=".tar")
    split = load_split(_through(again, uri), "regression", ["m", "b", "sigma", "f_r"])
    assert sorted(again.failed.values()) == [1, 1, 1]
    assert split.encoded == same.encoded and (split.y == same.y).all()
    proxy.stop()
    again.stop()


def test_an_s3_shard_failing_past_pyarrows_retries_is_read_again_then_named_never_skipped(
    s3_spirograph, monkeypatch, capsys
):
    """The eval reader past pyarrow's own retries: a shard refused 40 times in a row is read again after a pause
    and the split is whole; one refused for good raises StoreReadError naming it once the retry budget is spent,
    rather than being skipped as a bad shard (which would quietly shrink the split)."""
    import pipeline.data.reader as reader
    from services import FlakyS3

    uri, local = s3_spirograph
    same = load_split(str(local / "train"), "regression", ["m", "b", "sigma", "f_r"])
    monkeypatch.setattr(reader, "STORE_RETRY_S", 30.0)  # pyarrow's own retries of one read take ~6 s here
    busy = FlakyS3(_moto(uri), fails=40, keys="shard-000001.tar")
    split = load_split(_through(busy, uri), "regression", ["m", "b", "sigma", "f_r"])
    assert busy.failed["ssl/spiro/train/shard-000001.tar"] == 40
    assert split.encoded == same.encoded
    assert "shard-000001.tar: AWS Error SERVICE_UNAVAILABLE" in capsys.readouterr().err
    monkeypatch.setattr(reader, "STORE_RETRY_S", 3.0)
    down = FlakyS3(_moto(uri), fails=10**9, keys="shard-000001.tar")
    with pytest.raises(reader.StoreReadError, match=r"^s3://ssl/spiro/train/shard-000001.tar: .*still failing after"):
        load_split(_through(down, uri), "regression", ["m", "b", "sigma", "f_r"])
    busy.stop()
    down.stop()
