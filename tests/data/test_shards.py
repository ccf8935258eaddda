import importlib.util
import io
import json
import pickle
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
import webdataset as wds
from PIL import Image

from pipeline.data import shards
from pipeline.data import spirograph as sp
from pipeline.data.cifar import iter_cifar, make_cifar_split
from pipeline.data.imagefolder import make_imagefolder_split
from pipeline.data.manifest import BadShardError, check_shards, read_manifest, shard_problem, shard_samples
from pipeline.data.spirograph_shards import iter_spirograph, make_spirograph_splits

REPO = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------- helpers


def read_tar(path: Path) -> list[tuple[str, bytes]]:
    with tarfile.open(path) as tar:
        return [(m.name, tar.extractfile(m).read()) for m in tar]


def read_split(out: Path) -> list[dict]:
    """Samples of a split from its manifest, grouped from plain tar members (checks adjacency)."""
    manifest = json.loads((out / "manifest.json").read_text())
    samples: list[dict] = []
    for name in manifest["shards"]:
        members = read_tar(out / name)
        assert len(members) <= manifest["maxcount"] * 3
        for member, data in members:
            key, ext = member.split(".", 1)
            if not samples or samples[-1]["__key__"] != key:
                assert all(s["__key__"] != key for s in samples), f"members of {key} are not adjacent"
                samples.append({"__key__": key})
            samples[-1][ext] = data
    for s in samples:
        exts = [k for k in s if k != "__key__"]
        assert exts == sorted(exts)
    return samples


def read_wds(out: Path) -> list[dict]:
    urls = [str(out / n) for n in json.loads((out / "manifest.json").read_text())["shards"]]
    return list(wds.WebDataset(urls, shardshuffle=False))


def pixels(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def image_bytes(array: np.ndarray, fmt: str) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(array).save(buf, format=fmt)
    return buf.getvalue()


def no_leftovers(out: Path) -> None:
    assert not list(out.glob("*.tmp"))
    assert not (out / shards.PARTIAL_MARKER).exists()


# ---------------------------------------------------------------- ShardWriter / write_split


def test_shard_writer_encodes_and_rolls_over(tmp_path):
    with shards.ShardWriter(tmp_path, maxcount=2) as writer:
        for i in range(5):
            writer.write({"__key__": f"k{i}", "txt": f"é{i}", "cls": i, "json": {"a": i}, "bin": b"\x00\x01"})
    assert writer.shards == ["shard-000000.tar", "shard-000001.tar", "shard-000002.tar"]
    members = read_tar(tmp_path / "shard-000002.tar")
    assert members == [("k4.bin", b"\x00\x01"), ("k4.cls", b"4"), ("k4.json", b'{"a": 4}'), ("k4.txt", "é4".encode())]
    for bad in ({"__key__": "a.b", "x": b""}, {"__key__": "", "x": b""}, {"x": b""}):
        with pytest.raises(ValueError):
            shards.ShardWriter(tmp_path / "bad", maxcount=2).write(bad)


def test_writer_abort_leaves_only_complete_shards(tmp_path):
    with pytest.raises(RuntimeError):
        with shards.ShardWriter(tmp_path, maxcount=3) as writer:
            for i in range(4):
                writer.write({"__key__": f"k{i}", "cls": i})
            raise RuntimeError("boom")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shard-000000.tar"]


def _synthetic(n: int):
    for i in range(n):
        yield {"__key__": f"{i:04d}", "cls": i % 3, "txt": f"sample {i}"}


def _interrupted(n: int, fail_at: int):
    for i, sample in enumerate(_synthetic(n)):
        if i == fail_at:
            raise RuntimeError("interrupted")
        yield sample


def test_interrupted_write_resumes_to_identical_output(tmp_path):
    kwargs = dict(maxcount=10, class_names=["a", "b", "c"], source={"kind": "synthetic"}, progress=False)
    reference = shards.write_split(_synthetic(37), tmp_path / "ref", **kwargs)

    out = tmp_path / "resumed"
    with pytest.raises(RuntimeError):
        shards.write_split(_interrupted(37, fail_at=15), out, **kwargs)
    assert not (out / "manifest.json").exists()
    assert sorted(p.name for p in out.glob("*.tar")) == ["shard-000000.tar"]
    assert len(read_tar(out / "shard-000000.tar")) == 20  # 10 samples, complete
    assert not list(out.glob("*.tar.tmp"))

    starts = []

    def source(start):
        starts.append(start)
        return (s for i, s in enumerate(_synthetic(37)) if i >= start)

    manifest = shards.write_split(source, out, **kwargs)
    assert starts == [10]  # the finished shard was not produced again
    assert manifest == reference
    assert manifest["num_samples"] == 37 and len(manifest["shards"]) == 4
    for name in manifest["shards"]:
        assert (out / name).read_bytes() == (tmp_path / "ref" / name).read_bytes()
    no_leftovers(out)

    # complete manifest with the same source: no work at all
    assert shards.write_split(lambda start: pytest.fail("regenerated"), out, **kwargs) == reference


def test_changed_source_rewrites_split(tmp_path):
    kwargs = dict(maxcount=10, class_names=None, progress=False)
    shards.write_split(_synthetic(25), tmp_path, source="v1", **kwargs)
    manifest = shards.write_split(_synthetic(8), tmp_path, source="v2", **kwargs)
    assert manifest["num_samples"] == 8 and manifest["shards"] == ["shard-000000.tar"]
    assert sorted(p.name for p in tmp_path.glob("*.tar")) == ["shard-000000.tar"]

    # an interrupted run of another source never contributes shards to a resume
    with pytest.raises(RuntimeError):
        shards.write_split(_interrupted(30, fail_at=25), tmp_path, source="v3", **kwargs)
    manifest = shards.write_split(_synthetic(30), tmp_path, source="v4", **kwargs)
    assert [s["__key__"] for s in read_split(tmp_path)] == [f"{i:04d}" for i in range(30)]


# ---------------------------------------------------------------- ImageFolder


@pytest.fixture
def imagefolder(tmp_path):
    rng = np.random.default_rng(0)
    root = tmp_path / "imagenet" / "train"
    files = {}
    for cls, name, fmt in [
        ("cat", "a.jpg", "JPEG"),
        ("cat", "b.png", "PNG"),
        ("dog", "c1.JPEG", "JPEG"),
        ("dog", "d.v2.jpeg", "JPEG"),
        ("ant", "e.webp", "WEBP"),
    ]:
        (root / cls).mkdir(parents=True, exist_ok=True)
        data = image_bytes(rng.integers(0, 256, (8 + len(files), 10, 3), dtype=np.uint8), fmt)
        (root / cls / name).write_bytes(data)
        files[(cls, name)] = data
    (root / "dog" / "broken.jpg").write_bytes(b"\xff\xd8 this is not a jpeg")
    (root / "dog" / "notes.txt").write_text("not an image")
    return root, files


def test_imagefolder_round_trip(imagefolder, tmp_path):
    root, files = imagefolder
    out_root = tmp_path / "shards"
    manifest = make_imagefolder_split(root.parent, out_root, "train", maxcount=2, progress=False, seed=None)
    out = out_root / "train"
    assert manifest["class_names"] == ["ant", "cat", "dog"]
    assert manifest["num_samples"] == 5 and manifest["skipped"] == 1
    assert manifest["shards"] == ["shard-000000.tar", "shard-000001.tar", "shard-000002.tar"]
    assert manifest["image_ext"] == "jpg;png;webp"
    no_leftovers(out)

    expected = [
        ("ant", "e.webp", "webp"),
        ("cat", "a.jpg", "jpg"),
        ("cat", "b.png", "png"),
        ("dog", "c1.JPEG", "jpg"),
        ("dog", "d.v2.jpeg", "jpg"),
    ]
    keys = ["00000000_e", "00000001_a", "00000002_b", "00000003_c1", "00000004_d_v2"]
    classes = manifest["class_names"]
    for samples in (read_split(out), read_wds(out)):
        assert [s["__key__"] for s in samples] == keys
        for sample, (cls, name, ext) in zip(samples, expected):
            assert sample[ext] == files[(cls, name)]  # bytes kept verbatim
            assert int(sample["cls"]) == classes.index(cls)

    # the input folder itself (not its parent) works too, and a rerun is a no-op
    assert make_imagefolder_split(root, out_root, "train", maxcount=2, progress=False, seed=None) == manifest


# ---------------------------------------------------------------- CIFAR


def _cifar_rows(rng, n):
    return rng.integers(0, 256, (n, 3072), dtype=np.uint8)


def _dump(path: Path, obj) -> None:
    path.write_bytes(pickle.dumps(obj, protocol=2))


@pytest.fixture
def cifar10(tmp_path):
    rng = np.random.default_rng(1)
    folder = tmp_path / "c10" / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    names = [b"airplane", b"automobile", b"bird", b"cat", b"deer", b"dog", b"frog", b"horse", b"ship", b"truck"]
    # bytes keys, as in the official Python 2 pickles
    _dump(folder / "batches.meta", {b"label_names": names, b"num_vis": 3072})
    batches = {}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        data = _cifar_rows(rng, 3)
        labels = rng.integers(0, 10, 3).tolist()
        _dump(
            folder / name,
            {b"batch_label": name.encode(), b"data": data, b"labels": labels, b"filenames": [b"x.png"] * 3},
        )
        batches[name] = (data, labels)
    return folder, batches


@pytest.fixture
def cifar100(tmp_path):
    rng = np.random.default_rng(2)
    folder = tmp_path / "cifar-100-python"
    folder.mkdir()
    _dump(
        folder / "meta",
        {"fine_label_names": [f"class{i}" for i in range(100)], "coarse_label_names": [f"super{i}" for i in range(20)]},
    )
    batches = {}
    for name, n in (("train", 7), ("test", 4)):
        data = _cifar_rows(rng, n)
        labels = rng.integers(0, 100, n).tolist()
        _dump(folder / name, {"data": data, "fine_labels": labels, "coarse_labels": [0] * n})
        batches[name] = (data, labels)
    return folder, batches


def _check_cifar(out: Path, data: np.ndarray, labels: list[int]) -> None:
    for samples in (read_split(out), read_wds(out)):
        assert [s["__key__"] for s in samples] == [f"{i:06d}" for i in range(len(labels))]
        for i, sample in enumerate(samples):
            assert int(sample["cls"]) == labels[i]
            image = pixels(sample["png"])
            assert image.shape == (32, 32, 3)
            # R plane, then G plane, then B plane
            assert np.array_equal(image[..., 0].ravel(), data[i, :1024])
            assert np.array_equal(image[..., 2].ravel(), data[i, 2048:])


def test_cifar10_round_trip(cifar10, tmp_path):
    folder, batches = cifar10
    out_root = tmp_path / "out"
    train = make_cifar_split(folder.parent, out_root, "train", maxcount=4, progress=False)
    assert train["num_samples"] == 15 and len(train["shards"]) == 4
    assert train["class_names"][:2] == ["airplane", "automobile"] and train["image_ext"] == "png"
    data = np.concatenate([batches[f"data_batch_{i}"][0] for i in range(1, 6)])
    labels = sum((batches[f"data_batch_{i}"][1] for i in range(1, 6)), [])
    _check_cifar(out_root / "train", data, labels)

    test = make_cifar_split(folder, out_root, "test", maxcount=4, progress=False)
    assert test["num_samples"] == 3
    _check_cifar(out_root / "test", *batches["test_batch"])

    # start skips into later batches without changing the samples
    full = list(iter_cifar(folder, "train"))
    assert list(iter_cifar(folder, "train", start=5)) == full[5:]


def test_cifar100_round_trip(cifar100, tmp_path):
    folder, batches = cifar100
    manifest = make_cifar_split(folder, tmp_path / "out", "train", maxcount=5, progress=False)
    assert manifest["num_samples"] == 7 and len(manifest["class_names"]) == 100
    assert manifest["class_names"][3] == "class3"
    _check_cifar(tmp_path / "out" / "train", *batches["train"])
    with pytest.raises(ValueError):
        make_cifar_split(folder, tmp_path / "out", "validation", progress=False)


# ---------------------------------------------------------------- Spirograph


def test_spirograph_round_trip(tmp_path):
    manifests = make_spirograph_splits(tmp_path, n_train=25, n_val=7, seed=3, size=16, maxcount=10, progress=False)
    assert manifests["train"]["num_samples"] == 25 and len(manifests["train"]["shards"]) == 3
    assert manifests["val"]["num_samples"] == 7 and manifests["val"]["class_names"] is None

    params = sp.sample_params(25, torch.Generator().manual_seed(3))  # one chunk: seed + 0
    images = (sp.render_flat(params, size=16) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()
    for samples in (read_split(tmp_path / "train"), read_wds(tmp_path / "train")):
        assert [s["__key__"] for s in samples] == [f"{i:08d}" for i in range(25)]
        for i, sample in enumerate(samples):
            values = json.loads(sample["json"])
            assert set(values) == set(sp.PARAM_NAMES)
            for name in sp.PARAM_NAMES:
                assert values[name] == params[name][i].item()
            assert np.array_equal(pixels(sample["png"]), images[i])

    val = read_split(tmp_path / "val")
    val_params = sp.sample_params(7, torch.Generator().manual_seed(3 + 10**6))
    assert json.loads(val[0]["json"])["m"] == val_params["m"][0].item()


def test_spirograph_chunks_regenerate_independently():
    full = list(iter_spirograph(23, seed=5, size=8, chunk=10))
    assert len(full) == 23
    for start in (0, 7, 10, 22):
        assert list(iter_spirograph(23, seed=5, size=8, start=start, chunk=10)) == full[start:]
    chunk2 = sp.sample_params(3, torch.Generator().manual_seed(5 + 2))
    assert json.loads(json.dumps(full[20]["json"]))["b"] == chunk2["b"][0].item()


# ---------------------------------------------------------------- read_manifest


def test_read_manifest(tmp_path):
    shards.write_split(_synthetic(12), tmp_path / "ok", maxcount=5, class_names=None, source="s", progress=False)
    manifest, urls = read_manifest(tmp_path / "ok")
    assert manifest["num_samples"] == 12
    assert urls == [str(tmp_path / "ok" / f"shard-00000{i}.tar") for i in range(3)]
    via_uri, uri_urls = read_manifest(f"file://{tmp_path / 'ok'}/")
    assert via_uri == manifest
    assert uri_urls[0] == f"file://{tmp_path / 'ok'}/shard-000000.tar"

    missing = tmp_path / "nope"
    with pytest.raises(FileNotFoundError, match="not found: .*nope"):
        read_manifest(missing)
    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(FileNotFoundError, match="no manifest.json in .*empty_dir"):
        read_manifest(tmp_path / "empty_dir")

    shards.write_split(iter([]), tmp_path / "zero", maxcount=5, class_names=None, source="s", progress=False)
    with pytest.raises(ValueError, match="zero samples"):
        read_manifest(tmp_path / "zero")
    (tmp_path / "zero" / "manifest.json").write_text(json.dumps({"num_samples": 3, "complete": False}))
    with pytest.raises(ValueError, match="incomplete"):
        read_manifest(tmp_path / "zero")


# ---------------------------------------------------------------- CLI


def _load_job():
    spec = importlib.util.spec_from_file_location("make_shards_job", REPO / "jobs" / "make_shards.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cli(tmp_path, capsys):
    job = _load_job()
    assert job.main(["--help"]) == 0
    assert "source=imagefolder" in capsys.readouterr().out

    assert job.main(["source=cifar", f"input={tmp_path / 'missing'}", f"output={tmp_path / 'o'}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "input path does not exist" in err
    assert not (tmp_path / "o").exists()
    assert job.main(["source=spirograph", "output=x", "n=ten"]) == 2
    assert job.main(["source=spirograph", "output=x", "input=y"]) == 2

    out = tmp_path / "spiro"
    assert job.main(["source=spirograph", f"output={out}", "n=12", "n_val=3", "size=8", "maxcount=5"]) == 0
    assert read_manifest(out / "train")[0]["num_samples"] == 12
    assert read_manifest(out / "val")[0]["num_samples"] == 3


def test_read_manifest_from_s3(tmp_path, s3):
    from pyarrow import fs as pafs

    client, options = s3.client, s3.options
    client.create_bucket(Bucket="shards-test")
    shards.write_split(_synthetic(7), tmp_path, maxcount=5, class_names=None, source="s", progress=False)
    for path in tmp_path.iterdir():
        client.upload_file(str(path), "shards-test", f"ds/train/{path.name}")

    manifest, urls = read_manifest(f"s3://shards-test/ds/train{options}")
    assert manifest["num_samples"] == 7
    assert urls[1] == f"s3://shards-test/ds/train/shard-000001.tar{options}"
    filesystem, path = pafs.FileSystem.from_uri(urls[1])
    with filesystem.open_input_stream(path) as stream:
        assert stream.read() == (tmp_path / "shard-000001.tar").read_bytes()
    with pytest.raises(FileNotFoundError, match="s3://shards-test/ds/val"):
        read_manifest(f"s3://shards-test/ds/val{options}")


# ---------------------------------------------------------------- bad shards (issue #12)


def _cut_in_half(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def test_truncated_shard_is_named_and_refused_or_skipped(tmp_path):
    from pipeline.data.reader import iter_samples

    shards.write_split(_synthetic(30), tmp_path, maxcount=10, class_names=None, source="s", progress=False)
    bad_shard = tmp_path / "shard-000001.tar"
    _cut_in_half(bad_shard)

    manifest, uris, bad = check_shards(tmp_path)
    assert [u for u, _ in bad] == [str(bad_shard)] and "truncated" in bad[0][1]
    assert shard_samples(manifest) == [10, 10, 10]

    sizes = manifest["shard_bytes"]
    with pytest.raises(BadShardError, match="shard-000001.tar"):
        list(iter_samples(uris, on_bad_shard="fail", sizes=sizes))
    skipped: list = []
    samples = list(iter_samples(uris, on_bad_shard="skip", bad=skipped, sizes=sizes))
    assert [u for u, _ in skipped] == [str(bad_shard)]
    assert [s["__key__"] for s in samples] == [f"{i:04d}" for i in (*range(10), *range(20, 30))]

    # a corrupt header inside a shard of the right size is found while reading: the samples before it come
    # through, whole
    with shards.ShardWriter(tmp_path / "big", maxcount=10) as writer:
        for i in range(10):
            writer.write({"__key__": f"{i:04d}", "bin": bytes(range(256)) * 40, "cls": i})
    big = tmp_path / "big" / "shard-000000.tar"
    data = bytearray(big.read_bytes())
    sample = 512 + 10240 + 512 + 512  # the .bin header and data, the .cls header and data
    data[5 * sample : 5 * sample + 512] = b"garbage!" * 64
    big.write_bytes(bytes(data))
    assert shard_problem(big) is None  # not visible to the cheap check
    with pytest.raises(BadShardError, match="shard-000000.tar: ends after 5 of its 10 samples"):
        list(iter_samples([str(big)], on_bad_shard="fail", counts=[10]))
    got = list(iter_samples([str(big)], on_bad_shard="skip", counts=[10]))
    assert [s["__key__"] for s in got] == [f"{i:04d}" for i in range(4)]  # the last one read is not trusted
    assert all(set(s) == {"__key__", "bin", "cls"} and len(s["bin"]) == 10240 for s in got)


def test_prepare_data_applies_on_bad_shard(tmp_path):
    from pipeline.config import ConfigError, compose_config
    from pipeline.train.prepare import prepare_data

    for split in ("train", "val"):
        shards.write_split(
            _synthetic(30), tmp_path / split, maxcount=10, class_names=["a", "b", "c"], source="s", progress=False
        )
    _cut_in_half(tmp_path / "train" / "shard-000002.tar")
    (tmp_path / "val" / "shard-000000.tar").unlink()
    over = [
        f"paths.root={tmp_path}",
        "data=cifar10",
        f"data.train={tmp_path / 'train'}",
        f"data.val={tmp_path / 'val'}",
    ]

    with pytest.raises(ConfigError) as e:
        prepare_data(compose_config(over)["data"], str(tmp_path / "data"))  # data.on_bad_shard=fail, the default
    assert str(e.value).startswith(f"data.train={tmp_path / 'train'}: 1 bad shard(s) of 3: shard-000002.tar (")
    (tmp_path / "val" / "shard-000000.tar").write_bytes(b"")  # an empty file is no tar either
    manifest = prepare_data(compose_config(over + ["data.on_bad_shard=skip"])["data"], str(tmp_path / "data"))
    assert manifest["num_samples"] == 20 and manifest["bad_shards"] == [str(tmp_path / "train" / "shard-000002.tar")]


def test_ray_dataset_never_gets_a_bad_shard(tmp_path):
    from pipeline.data.reader import good_shards

    shards.write_split(_synthetic(30), tmp_path, maxcount=10, class_names=None, source="s", progress=False)
    _cut_in_half(tmp_path / "shard-000000.tar")
    assert good_shards(str(tmp_path)) == [str(tmp_path / f"shard-00000{i}.tar") for i in (1, 2)]
    with pytest.raises(BadShardError, match="shard-000000.tar"):
        good_shards(str(tmp_path), on_bad_shard="fail")


# ---------------------------------------------------------------- one list of image extensions


def test_every_image_format_the_writer_takes_is_read_back(tmp_path):
    from pipeline.data import reader

    assert shards.IMAGE_EXTS is reader.IMAGE_EXTS
    rng = np.random.default_rng(0)
    root = tmp_path / "folder"
    kinds = {
        "a.gif": "GIF",
        "b.tif": "TIFF",
        "c.tiff": "TIFF",
        "d.jpeg": "JPEG",
        "e.bmp": "BMP",
        "f.ppm": "PPM",
        "g.webp": "WEBP",
        "h.png": "PNG",
    }
    for i, (name, fmt) in enumerate(kinds.items()):
        (root / f"c{i % 2}").mkdir(parents=True, exist_ok=True)
        (root / f"c{i % 2}" / name).write_bytes(image_bytes(rng.integers(0, 256, (6, 6, 3), dtype=np.uint8), fmt))
    manifest = make_imagefolder_split(root, tmp_path / "out", "train", maxcount=3, progress=False)
    assert manifest["num_samples"] == len(kinds) and manifest["skipped"] == 0
    split = reader.load_split(str(tmp_path / "out" / "train"), "classification")
    assert len(split.encoded) == len(kinds)
    assert sorted(pixels(e).shape for e in split.encoded) == [(6, 6, 3)] * len(kinds)


# ---------------------------------------------------------------- imagefolder: shuffled across shards


def _classes_folder(root: Path, classes: int = 3, per_class: int = 30) -> Path:
    for c in range(classes):
        (root / f"class{c}").mkdir(parents=True)
        for i in range(per_class):
            image = image_bytes(np.full((4, 4, 3), c * 40 + i, np.uint8), "PNG")
            (root / f"class{c}" / f"{i:03d}.png").write_bytes(image)
    return root


def _shard_classes(out: Path) -> list[set[int]]:
    manifest = json.loads((out / "manifest.json").read_text())
    return [{int(data) for name, data in read_tar(out / s) if name.endswith(".cls")} for s in manifest["shards"]]


def test_make_shards_imagefolder_mixes_classes_with_a_seed(tmp_path):
    job = _load_job()
    src = _classes_folder(tmp_path / "src")
    for out, seed in (("a", 7), ("b", 7), ("c", 8)):
        assert (
            job.main(["source=imagefolder", f"input={src}", f"output={tmp_path / out}", "maxcount=10", f"seed={seed}"])
            == 0
        )
    a = tmp_path / "a" / "train"
    manifest = json.loads((a / "manifest.json").read_text())
    assert manifest["source"]["seed"] == 7 and manifest["num_samples"] == 90 and len(manifest["shards"]) == 9
    assert all(len(classes) >= 2 for classes in _shard_classes(a))
    for name in manifest["shards"]:  # the same seed: the same order, byte for byte
        assert (a / name).read_bytes() == (tmp_path / "b" / "train" / name).read_bytes()
    assert read_split(a) != read_split(tmp_path / "c" / "train")  # another seed: another order
    assert sorted(s["png"] for s in read_split(a)) == sorted(s["png"] for s in read_split(tmp_path / "c" / "train"))

    # without a seed: class order, one class per shard (what make_shards did before)
    make_imagefolder_split(src, tmp_path / "d", "train", maxcount=10, progress=False, seed=None)
    assert all(len(classes) == 1 for classes in _shard_classes(tmp_path / "d" / "train"))


# ---------------------------------------------------------------- make_shards' command line


def test_make_shards_help_lists_its_own_keys_and_no_arguments_is_an_error(tmp_path):
    import subprocess
    import sys

    cmd = [sys.executable, str(REPO / "jobs" / "make_shards.py")]
    r = subprocess.run([*cmd, "--help"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0
    assert "source: ???" in r.stdout and "maxcount:" in r.stdout and "seed:" in r.stdout
    assert "Config groups" not in r.stdout and "method:" not in r.stdout and "augment:" not in r.stdout

    r = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: source and output are required")
    assert list(tmp_path.iterdir()) == []
