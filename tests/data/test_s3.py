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
