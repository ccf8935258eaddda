"""Bad input fails with one clear line, before Ray starts (and without leaving anything behind)."""

import os
import sqlite3
import subprocess
import sys
from dataclasses import FrozenInstanceError
from pathlib import Path

import pytest

from helpers import heavy_imports, optim, probed
from pipeline.config import ConfigError, compose_config
from pipeline.plan import RunPlan
from pipeline.train.prepare import resolve

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["data.generate.n_train=300", "data.generate.n_val=100"]


def _run(args, cwd, job="pretrain.py", record: Path | None = None):
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "RAY_ADDRESS")}
    env = probed(env, record) if record else env
    return subprocess.run(
        [sys.executable, str(ROOT / "jobs" / job), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


def _garbage(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\x00\x17 these bytes are no SQLite database \xff" * 64)
    return path


# setups: make the bad state under tmp_path, return the overrides that point at it
def _root_is_a_file(tmp):
    (tmp / "afile").write_text("not a folder")
    return [f"paths.root={tmp / 'afile'}"]


def _corrupt_default_store(tmp):
    _garbage(tmp / "runs" / "mlflow.db")  # where tracking.uri=null puts the store
    return []


def _corrupt_store_uri(tmp):
    return [f"tracking.uri=sqlite:///{_garbage(tmp / 'elsewhere' / 'store.db')}"]


def _truncated_shard(tmp):
    from pipeline.data.shards import write_split

    for split in ("train", "val"):
        samples = ({"__key__": f"{i:04d}", "cls": i % 2, "txt": "x" * 500} for i in range(30))
        write_split(samples, tmp / "shards" / split, maxcount=10, class_names=["a", "b"], source="t", progress=False)
    shard = tmp / "shards" / "train" / "shard-000001.tar"
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])  # cut in half
    return ["data=cifar10", f"data.train={tmp / 'shards' / 'train'}", f"data.val={tmp / 'shards' / 'val'}"]


@pytest.mark.parametrize(
    "args,needles,setup",
    [
        (["method=nosuch"], ["method/nosuch"], None),
        (["train.epochs"], ["malformed override"], None),
        (["train.epochs=[1"], ["error:"], None),
        (["data=cifar10"], ["data.train=", "cifar10/train"], None),  # shards not made: the missing path is named
        (["data.train=/nonexistent/shards"], ["data.train=/nonexistent/shards"], None),
        (["trainer.num_workers=3"], ["train.batch_size=256", "does not split evenly"], None),
        (["augment=mocov2", "augment.p_blur=1.5"], ["augment.p_blur=1.5: expected a number in [0, 1]"], None),
        # issue #12: each once failed late (after Ray started and an MLflow run was made) or with a traceback
        (["train.batch_size=0"], ["train.batch_size=0", "integer >= 1"], None),
        (["model.backbone=resnet999"], ["model.backbone=resnet999", "resnet18, resnet34, resnet50"], None),
        (["train.epochs=abc"], ["train.epochs=abc", "integer >= 1"], None),
        (["train.epochs=-1"], ["train.epochs=-1", "integer >= 1"], None),
        (["optim.base_lr=-1"], ["optim.base_lr=-1", "number > 0"], None),
        (["train.precision=fp16"], ["train.precision=fp16", "auto, bf16, fp32"], None),
        (["trainer.num_workers=0"], ["trainer.num_workers=0", "integer >= 1"], None),
        (["eval.knn.k=0"], ["eval.knn.k=0", "integer >= 1"], None),
        (["model.width=0"], ["model.width=0", "integer >= 1"], None),
        (["optim.name=adam"], ["optim.name=adam", "sgd, lars"], None),
        (["data.image_size=7"], ["data.image_size=7", ">= 8"], None),
        (["+data.generate.sedd=1"], ["data.generate.sedd: unknown key", "n_train, n_val, size, seed, maxcount"], None),
        ([], ["paths.root=", "afile", "is an existing file"], _root_is_a_file),
        ([], ["tracking.uri", "mlflow.db", "not a healthy SQLite database"], _corrupt_default_store),
        ([], ["tracking.uri=sqlite:///", "store.db", "not a healthy SQLite database"], _corrupt_store_uri),
        ([], ["data.train=", "shard-000001.tar", "data.on_bad_shard=skip"], _truncated_shard),
    ],
)
def test_bad_input_fails_with_one_line_before_ray(tmp_path, args, needles, setup):
    extra = setup(tmp_path) if setup else []
    before = {p: p.read_bytes() for p in tmp_path.rglob("*.db")}
    root = [] if any(a.startswith("paths.root=") for a in extra) else [f"paths.root={tmp_path}"]
    data = any(a.startswith("data=") for a in args + extra)
    record = tmp_path.parent / f"{tmp_path.name}.imports"
    r = _run([*root, *([] if data else SMALL), *args, *extra], tmp_path, record=record)
    assert r.returncode == 2, r.stderr[-2000:]
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), r.stderr
    assert all(n in lines[0] for n in needles), lines[0]
    assert "ray" not in r.stdout.lower()
    assert not (tmp_path / "runs" / "ray").exists()
    assert {p: p.read_bytes() for p in tmp_path.rglob("*.db")} == before  # no MLflow store made or touched
    assert not list(tmp_path.rglob("*.db-journal")) and not list(tmp_path.rglob("mlartifacts"))
    assert heavy_imports(record) == set()  # answered before torch, Ray or MLflow loaded (a time bound flakes)


@pytest.mark.parametrize(
    "override,needle",
    [
        ("train.epochs=1.5", "train.epochs=1.5: expected an integer >= 1"),
        ("train.epochs=true", "train.epochs=true: expected an integer >= 1"),
        ("run.name=a/b", "run.name=a/b: expected a name without '/'"),
        ("data.std=[0.5,0,0.5]", "data.std=[0.5, 0, 0.5]: expected a list of 3 numbers > 0"),
        ("eval.knn.k=5000", "eval.knn.k=5000: expected at most eval.knn.bank_size=2000"),
        # each section's own relations (its `check`), named in full
        ("eval.probe.sgd.milestones=[3,2]", "eval.probe.sgd.milestones=[3, 2]: increasing epochs between 1 and"),
        ("optim.name=lars", "optim.eta=null: expected a number > 0 with optim.name=lars"),
        ("data.task=regression data.targets=null", "data.targets=null: a regression task needs its target names"),
        ("+method.fix_predictor_lr=true", "method.fix_predictor_lr=true: method=mocov2 has no predictor"),
        ("method.bn_splits=3", "method.bn_splits=3: per-worker batch 128 does not split into"),
        ("method.key_bn=bogus", "method.key_bn=bogus: expected one of auto, shuffle, shuffle_node, sync, split"),
        (
            "method.kind=bogus",
            "method.kind=bogus: expected one of barlowtwins, byol, dino, moco, mocov3, simclr, simsiam, supcon, vicreg",
        ),
        ("method.key_bn=split method.bn_splits=1", "method.bn_splits=1: must be 2 or more with method.key_bn=split"),
        ("method.key_bn=sync method.bn_splits=2", "method.bn_splits=2: must be 1 with method.key_bn=sync"),
        ("trainer.num_workers=1 method.key_bn=sync", "method.key_bn=sync: needs 2 or more workers"),
        ("trainer.grad_compression=fp8", "trainer.grad_compression=fp8: expected one of bf16 or null"),
        ("optim.momentum=1", "optim.momentum=1: expected a number in [0, 1)"),
        ("+optim.milestones=[0,120]", "optim.milestones=[0, 120]: expected a non-empty list of integers >= 1"),
        ("+optim.lr_decay=0", "optim.lr_decay=0: expected a number > 0 and <= 1"),
        ("method=supcon +method.base_temperature=0", "method.base_temperature=0: expected a number > 0"),
        ("method=simclr +method.sum_directions=2", "method.sum_directions=2: expected true or false"),
        ("+method.head.last_bn_scale=yes", "method.head.last_bn_scale=yes: expected true or false"),
        ("trainer.cpus_per_worker=0", "trainer.cpus_per_worker=0: expected a number > 0"),
        ("data.on_bad_shard=ignore", "data.on_bad_shard=ignore: expected one of fail, skip"),
        ("data.generate.n_train=many", "data.generate.n_train=many: expected an integer >= 1"),
        ("method.head.out_dim=0", "method.head.out_dim=0: expected an integer >= 1"),
        ("method.queue_size=0", "method.queue_size=0: expected an integer >= 1"),  # MoCo's own Settings
        ("method=dino method.center_momentum=1", "method.center_momentum=1: expected a number in [0, 1)"),  # DINO's
        ("method=simclr method.temperature=null", "method.temperature=null: expected a number > 0"),
        ("augment.joint.crop.beta=0", "augment.joint.crop.beta=0: null with augment=spirograph"),
        ("trainer.storage=/proc/version/ray", "trainer.storage=/proc/version/ray: lies under the file /proc/version"),
        ("tracking.system_metrics=sometimes", "tracking.system_metrics=sometimes: expected true or false"),
    ],
)
def test_validate_names_key_value_and_what_is_allowed(tmp_path, override, needle):
    from pipeline.schema import validate

    cfg = compose_config([f"paths.root={tmp_path}", *SMALL, *override.split()])
    with pytest.raises(ConfigError) as e:
        validate(cfg)
    assert str(e.value).startswith(needle) and "\n" not in str(e.value)
    assert list(tmp_path.iterdir()) == []  # nothing made


def test_channels_last_on_the_cpu_is_refused_where_onednn_would_corrupt_the_shortcut_gradient(tmp_path):
    """oneDNN issue 6035: the 1x1 stride-2 convolution's channels_last backward with fewer than 16 input channels
    (seen here as a double free, a hang, or quietly wrong weight gradients, on torch 2.11 and 2.14 alike)."""
    from pipeline.schema import validate

    for key in ("channels_last", "compile"):
        narrow = compose_config([f"paths.root={tmp_path}", *SMALL, f"train.{key}=true", "model.width=8"])
        with pytest.raises(ConfigError, match=rf"^train.{key}=true: on the CPU with model.width=8: oneDNN"):
            validate(narrow)
    for fine in (
        ["train.channels_last=true", "train.compile=true", "model.width=16"],  # wide enough
        ["train.channels_last=true", "model.width=4", "model.backbone=resnet50"],  # bottleneck shortcuts: 4 x 4
        ["train.channels_last=auto", "model.width=8"],  # contiguous on the CPU
        ["train.compile=true", "model.width=8", "model.backbone=vit_tiny"],  # no convolution shortcut
        ["train.channels_last=true", "model.width=8", "trainer.use_gpu=true"],  # cuDNN, not oneDNN
    ):
        validate(compose_config([f"paths.root={tmp_path}", *SMALL, *fine]))


@pytest.mark.parametrize("group", ["experiment", "method", "augment", "data", "optim"])
def test_the_schema_takes_every_shipped_option(tmp_path, group):
    from pipeline.fields import Checked
    from pipeline.schema import _check_components, _check_relations, check_augment, check_method
    from pipeline.sections import Config

    for path in sorted((ROOT / "conf" / group).glob("*.yaml")):
        # the ViT and ResNet-50 recipes are ImageNet's: DINO's 14-px local crops of 32-px data are smaller than a
        # 16-px patch or a standard ResNet-50's stride of 32
        data = ["data=imagenet"] if path.stem.endswith(("_vit", "_resnet")) else []
        cfg = compose_config(
            [f"paths.root={tmp_path}", f"{'+' if group == 'experiment' else ''}{group}={path.stem}", *data]
        )
        c = Checked.of(Config, cfg)  # (the plug-ins' own checks run in tests/plugins/test_plugins.py)
        _check_components(c.typed)
        _check_relations(c.typed, cfg["augment"])
        check_augment(cfg["augment"], c.typed.model)
        check_method(c)  # the method's own Settings and checks
    assert list(tmp_path.iterdir()) == []


def test_schema_choices_match_the_registries():
    from pipeline.methods import METHODS
    from pipeline.methods.base import Method
    from pipeline.models.backbones import build_backbone
    from pipeline.models.catalogue import BACKBONES, is_vit, vit_patch
    from pipeline.sections import OPTIMIZERS
    from pipeline.train.optim import build_optimizer

    assert all(issubclass(METHODS[kind], Method) for kind in METHODS)  # every registered path loads
    import torch

    for name in BACKBONES:  # every name the schema allows builds, with the catalogue's patch size
        net = build_backbone({"backbone": name, "width": 4, "image_size": 32})
        assert not is_vit(name) or net.patch_size == vit_patch(name)

    for name in OPTIMIZERS:
        build_optimizer(torch.nn.Linear(2, 2), optim(name=name, eta=1e-3), 0.1)


def test_sqlite_store_check_reads_and_never_creates(tmp_path):
    from pipeline.locations import sqlite_problem

    good = tmp_path / "good.db"
    with sqlite3.connect(good) as con:
        con.execute("CREATE TABLE t (x)")
    con.close()
    assert sqlite_problem(good) is None
    assert sqlite_problem(tmp_path / "empty.db") is not None and not (tmp_path / "empty.db").exists()
    assert "not a database" in sqlite_problem(_garbage(tmp_path / "bad.db"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.db", "good.db"]


_KILLED_WRITER = """
import os, sqlite3, sys
con = sqlite3.connect(sys.argv[1], isolation_level=None)
con.execute("CREATE TABLE t (x)")
con.executemany("INSERT INTO t VALUES (?)", [("a" * 100,)] * 3000)
con.execute("PRAGMA cache_size=2")  # the update spills to the file: its journal is hot
con.execute("BEGIN IMMEDIATE")
con.execute("UPDATE t SET x = 'b' || x")
os.kill(os.getpid(), 9)
"""


def test_a_store_whose_writer_was_killed_mid_transaction_is_healthy(tmp_path, monkeypatch):
    """`ray job stop` of a job that was logging leaves a hot journal, which a read-only connection may not roll back
    ('attempt to write a readonly database'; CI once refused the next job's sweep for it): the check rolls it back to
    the last commit, as the job's own first connection would."""
    import subprocess
    import sys

    from pipeline import locations

    db = tmp_path / "mlflow.db"
    subprocess.run([sys.executable, "-c", _KILLED_WRITER, str(db)], check=False)
    assert (tmp_path / "mlflow.db-journal").stat().st_size > 0
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as ro:  # what the read-only check alone met
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            ro.execute("SELECT count(*) FROM t").fetchone()
    ro.close()
    monkeypatch.setattr(locations.os, "access", lambda *a: False)  # a store this user may not write
    assert "cannot roll back" in locations.sqlite_problem(db)
    monkeypatch.undo()
    assert locations.sqlite_problem(db) is None
    assert not (tmp_path / "mlflow.db-journal").exists()
    with sqlite3.connect(db) as con:  # the committed rows, not the killed update
        assert con.execute("SELECT count(*), min(x) FROM t").fetchone() == (3000, "a" * 100)
    con.close()


def test_empty_dataset_is_refused(tmp_path):
    from pipeline.data.shards import write_split

    for split in ("train", "val"):
        write_split(iter([]), tmp_path / split, maxcount=10, class_names=["a"], source="test", progress=False)
    cfg = compose_config(
        [f"paths.root={tmp_path}", "data=cifar10", f"data.train={tmp_path}/train", f"data.val={tmp_path}/val"]
    )
    with pytest.raises(ConfigError, match="zero samples|empty|no samples"):
        resolve(cfg)


def test_help_lists_groups(tmp_path):
    r = _run(["--help"], tmp_path)
    assert r.returncode == 0
    assert (
        "method: barlowtwins, byol, dino, mocov1, mocov2, mocov3, simclr, simsiam, supcon, vicreg" in r.stdout
        and "key=value" in r.stdout
    )
    recipes = sorted(f.stem for f in (ROOT / "conf" / "experiment").glob("*.yaml"))
    assert f"+experiment: {', '.join(recipes)}" in r.stdout  # presets, with how to add them
    assert "+detect" not in r.stdout  # jobs/detect.py's group, not a preset of the training config
    d = _run(["--help"], tmp_path, job="detect.py")
    assert d.returncode == 0 and "detect: coco, shapes" in d.stdout and "+experiment" not in d.stdout


def test_gallery_job_validates_the_whole_config(tmp_path):
    r = _run([f"paths.root={tmp_path}", *SMALL, "model.backbone=resnet999"], tmp_path, job="gallery.py")
    assert r.returncode == 2 and r.stderr.strip() == (
        "error: model.backbone=resnet999: expected one of resnet18, resnet34, resnet50, vit_tiny, vit_s16, vit_b16"
    )
    assert not (tmp_path / "data").exists()


def test_resolve_derives_runtime(tmp_path):
    cfg = compose_config(
        [f"paths.root={tmp_path}", "data.generate.n_train=600", "data.generate.n_val=100", "train.batch_size=128"]
    )
    plan = resolve(cfg)
    assert cfg["trainer"]["num_workers"] == plan.workers == 2  # the embedded default: two workers, one thread each
    assert plan.local_batch == 64 and plan.num_train_samples == 600
    assert plan.steps_per_epoch == (600 // 2) // 64 and plan.total_steps == plan.steps_per_epoch * plan.epochs
    assert plan.warmup_steps == plan.steps_per_epoch * cfg["optim"]["warmup_epochs"]
    assert cfg["method"]["bn_splits"] == 1  # shuffle-BN across the two workers
    one = compose_config(
        [
            f"paths.root={tmp_path}",
            "data.generate.n_train=600",
            "data.generate.n_val=100",
            "train.batch_size=128",
            "trainer.num_workers=1",
        ]
    )
    assert resolve(one).steps_per_epoch == 600 // 128
    assert one["method"]["bn_splits"] == 4  # one worker: split-BN groups
    assert plan.lr == pytest.approx(cfg["optim"]["base_lr"] * 128 / 256)
    with pytest.raises(FrozenInstanceError):  # one plan, computed once: nothing changes it later
        plan.lr = 1.0  # type: ignore[misc]
    # a checkpoint's record of it reads back as the same plan
    assert RunPlan.from_dict(plan.as_dict()) == plan
    # the managed folder of these data.generate settings: data/spirograph-<hash of data.generate>/
    train = Path(cfg["data"]["train"])
    assert (train / "manifest.json").exists() and train.parent.parent == tmp_path / "data"
    assert train.parent.name.startswith("spirograph-") and train.name == "train"


def test_changed_generate_settings_never_reuse_old_data(tmp_path):
    """Issue #12 (5): data.generate.n_train changed after the data exists trained on the old data, while the
    run's params recorded the new value. Now other settings get their own folder; a folder given by hand that
    holds other data is refused in one line naming the key."""

    def cfg(n_train, *extra):
        return compose_config(
            [
                f"paths.root={tmp_path}",
                f"data.generate.n_train={n_train}",
                "data.generate.n_val=40",
                "data.generate.maxcount=100",
                "train.batch_size=64",
                *extra,
            ]
        )

    first, second = cfg(300), cfg(400)
    assert resolve(first).num_train_samples == 300
    assert resolve(second).num_train_samples == 400
    assert second["data"]["train"] != first["data"]["train"]
    assert second["run"]["name"] != first["run"]["name"]
    from pipeline.data.manifest import read_manifest

    made, _ = read_manifest(second["data"]["train"])
    assert made["num_samples"] == 400
    assert made["generate"] == {"n_train": 400, "seed": 0, "size": 32, "maxcount": 100}  # how it was made
    assert read_manifest(first["data"]["train"])[0]["num_samples"] == 300  # the old data is left alone

    old = Path(first["data"]["train"]).parent
    with pytest.raises(ConfigError) as e:
        resolve(cfg(400, f"data.train={old}/train", f"data.val={old}/val"))
    message = str(e.value)
    assert message.startswith("data.generate.n_train=400: the Spirograph data in") and "n_train=300" in message
    assert read_manifest(old / "train")[0]["num_samples"] == 300  # not regenerated over


def test_a_crop_smaller_than_one_vit_patch_is_refused_naming_the_view(tmp_path):
    from pipeline.schema import validate

    cfg = compose_config([f"paths.root={tmp_path}", "+experiment=dino_vit"])  # 14-px local crops of 32-px data
    with pytest.raises(
        ConfigError,
        match=r"^augment.views.1.size=14: expected an integer >= 16: smaller than one "
        r"patch of vit_s16$",
    ):
        validate(cfg)
    validate(compose_config([f"paths.root={tmp_path}", "+experiment=dino_vit", "model.backbone=vit_tiny"]))
