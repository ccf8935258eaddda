"""Bad input fails with one clear line, before Ray starts (and without leaving anything behind)."""
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.config import ConfigError, compose_config
from pipeline.train.launch import resolve

ROOT = Path(__file__).resolve().parents[1]


def _run(args, cwd):
    return subprocess.run([sys.executable, str(ROOT / "jobs" / "pretrain.py"), *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("args,needle", [
    (["method=nosuch"], "method/nosuch"),
    (["train.epochs"], "malformed override"),
    (["train.epochs=[1"], "error:"),
    (["data=cifar10"], "cifar10/train"),            # shards not made: the missing path is named
    (["data.train=/nonexistent/shards"], "/nonexistent/shards"),
    (["trainer.num_workers=3"], "does not split evenly"),
    (["augment=mocov2", "augment.p_blur=1.5"], "p_blur must be in [0, 1]"),
])
def test_bad_input_fails_with_one_line_before_ray(tmp_path, args, needle):
    small = [] if any(a.startswith("data=") for a in args) else ["data.generate.n_train=300", "data.generate.n_val=100"]
    r = _run([f"paths.root={tmp_path}", *small, *args], tmp_path)
    assert r.returncode == 2, r.stderr[-2000:]
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], r.stderr
    assert "ray" not in r.stdout.lower()
    assert not (tmp_path / "runs" / "ray").exists()


def test_empty_dataset_is_refused(tmp_path):
    from pipeline.data.shards import write_split

    for split in ("train", "val"):
        write_split(iter([]), tmp_path / split, maxcount=10, class_names=["a"], source="test", progress=False)
    cfg = compose_config([f"paths.root={tmp_path}", "data=cifar10", f"data.train={tmp_path}/train",
                          f"data.val={tmp_path}/val"])
    with pytest.raises(ConfigError, match="zero samples|empty|no samples"):
        resolve(cfg)


def test_help_lists_groups(tmp_path):
    r = _run(["--help"], tmp_path)
    assert r.returncode == 0
    assert "method: byol, mocov1, mocov2, simclr, simsiam, supcon" in r.stdout and "key=value" in r.stdout


def test_resolve_derives_runtime(tmp_path):
    cfg = compose_config([f"paths.root={tmp_path}", "data.generate.n_train=600", "data.generate.n_val=100",
                          "train.batch_size=128"])
    out = resolve(cfg)
    assert out["trainer"]["num_workers"] == 2  # the embedded default: two workers, one thread each
    assert out["runtime"]["steps_per_epoch"] == (600 // 2) // 64
    assert out["method"]["bn_splits"] == 1     # shuffle-BN across the two workers
    one = resolve(compose_config([f"paths.root={tmp_path}", "data.generate.n_train=600", "data.generate.n_val=100",
                                  "train.batch_size=128", "trainer.num_workers=1"]))
    assert one["method"]["bn_splits"] == 4     # one worker: split-BN groups
    assert out["runtime"]["lr"] == pytest.approx(out["optim"]["base_lr"] * 128 / 256)
    assert (tmp_path / "data" / "spirograph" / "train" / "manifest.json").exists()
