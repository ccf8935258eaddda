"""`jobs/pretrain.py trainer.use_gpu=true trainer.num_workers=1` end to end on one GPU (pytest -m gpu): Spirograph at
the default model, and JPEG shards of 500x375 photos-like images with ResNet-50 at 224 px, each logging to MLflow.
Skipped with the reason where CUDA is absent; the same commands run on the CPU in test_e2e.py."""

from pathlib import Path

import pytest
import torch
from test_e2e import mlflow_runs, pretrain

from helpers import natural

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (none on this machine)"),
]
ROOT = Path(__file__).resolve().parents[1]


def _finished_on_gpu(root: Path, stdout: str):
    client, runs = mlflow_runs(root)
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    run = runs[0]
    loss = client.get_metric_history(run.info.run_id, "train/loss")
    assert loss and all(m.value == m.value for m in loss)
    assert "on cuda" in stdout  # the worker's own line: device, executor, precision
    return client, run


def test_spirograph_on_one_gpu(tmp_path):
    r = pretrain(tmp_path, "trainer.use_gpu=true", "trainer.num_workers=1", "train.epochs=2")
    _finished_on_gpu(tmp_path, r.stdout + r.stderr)


def _jpeg_folder(root: Path, n_per_class: int, seed: int) -> None:
    from PIL import Image

    for c, name in enumerate(["a", "b", "c"]):
        (root / name).mkdir(parents=True)
        for i in range(n_per_class):
            Image.fromarray(natural(375, 500, seed=seed * 1000 + c * 100 + i)).save(
                root / name / f"{i}.jpg", quality=90
            )


def _has_dali() -> bool:
    import importlib.util

    return importlib.util.find_spec("nvidia.dali") is not None if importlib.util.find_spec("nvidia") else False


@pytest.mark.parametrize(
    "executor",
    [
        "auto",  # the batched executor on the worker's GPU
        pytest.param(
            "dali",
            marks=pytest.mark.skipif(not _has_dali(), reason="DALI is not installed: its GPU pipeline cannot run"),
        ),
    ],
)
def test_resnet50_on_jpeg_shards_on_one_gpu(tmp_path, executor):
    import subprocess
    import sys

    from test_e2e import job_env

    for split, n in (("train", 96), ("val", 24)):
        _jpeg_folder(tmp_path / "src" / split, n, seed=len(split))
        mk = subprocess.run(
            [
                sys.executable,
                str(ROOT / "jobs" / "make_shards.py"),
                "source=imagefolder",
                f"input={tmp_path / 'src'}",
                f"output={tmp_path / 'shards'}",
                f"split={split}",
                "maxcount=64",
            ],
            capture_output=True,
            text=True,
            timeout=600,
            env=job_env(),
        )
        assert mk.returncode == 0, mk.stderr[-3000:]
    r = pretrain(
        tmp_path,
        "data=imagenet",
        f"data.train={tmp_path / 'shards' / 'train'}",
        f"data.val={tmp_path / 'shards' / 'val'}",
        "model.backbone=resnet50",
        "model.cifar_stem=false",
        "model.width=64",
        "train.batch_size=64",
        "train.epochs=1",
        f"augment.executor={executor}",
        "trainer.use_gpu=true",
        "trainer.num_workers=1",
        "eval.knn.k=5",
    )
    client, run = _finished_on_gpu(tmp_path, r.stdout + r.stderr)
    assert run.data.metrics["train/epoch_images_per_s"] > 0
    assert "probe/pretrained_top1" in run.data.metrics
    cfg = run.data.params
    assert cfg["model.backbone"] == "resnet50" and cfg["data.image_size"] == "224"
