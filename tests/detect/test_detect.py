"""Detection transfer: the backbone's names in detectron2's layout, the export job, and detectron2's own
loading report on the exported file."""

from __future__ import annotations

import json
import logging
import pickle
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import HAVE_D2, fake_source, job_env, needs_d2
from pipeline.detect.convert import detectron2_name, pixel_config, resnet_config, to_detectron2
from pipeline.models.backbones import build_backbone

ROOT = Path(__file__).resolve().parents[2]

WHEELS = ROOT.parent / "shared" / "wheels"  # make venv installs detectron2 from here when a wheel is there


def test_detectron2_is_installed_where_its_wheel_is():
    """CI has the wheel folder: there the detectron2 tests must run, not skip (where a wheel fits this Python)."""
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    if not list(WHEELS.glob(f"detectron2-*-{tag}-*.whl")):
        pytest.skip(f"no detectron2 wheel for {tag} in {WHEELS}: the detectron2 tests may skip here")
    assert HAVE_D2, f"{WHEELS} holds a detectron2 wheel but detectron2 is not installed: run make venv"
    import detectron2  # noqa: F401  (and it imports)


LAYOUTS = {  # (backbone, cifar_stem, width): the standard ImageNet ResNet-50, and the demo's narrow ResNet-18
    "r50": ("resnet50", False, 64),
    "r18-cifar-w16": ("resnet18", True, 16),
    "r50-narrow": ("resnet50", False, 16),
}


def test_names_follow_detectron2():
    assert detectron2_name("conv1.weight") == "stem.conv1.weight"
    assert detectron2_name("bn1.running_var") == "stem.conv1.norm.running_var"
    assert detectron2_name("layer1.0.conv3.weight") == "res2.0.conv3.weight"
    assert detectron2_name("layer4.2.bn2.bias") == "res5.2.conv2.norm.bias"
    assert detectron2_name("layer2.0.downsample.0.weight") == "res3.0.shortcut.weight"
    assert detectron2_name("layer3.0.downsample.1.running_mean") == "res4.0.shortcut.norm.running_mean"
    assert detectron2_name("fc.weight") is None and detectron2_name("bn1.num_batches_tracked") is None
    for bad in ("head.0.weight", "layer5.0.conv1.weight", "layer1.0.relu.weight"):
        with pytest.raises(ValueError, match="not a torchvision ResNet key"):
            detectron2_name(bad)


def test_config_from_the_model():
    assert resnet_config({"backbone": "resnet50", "width": 64}) == {
        "DEPTH": 50,
        "STEM_OUT_CHANNELS": 64,
        "RES2_OUT_CHANNELS": 256,
        "WIDTH_PER_GROUP": 64,
        "NUM_GROUPS": 1,
        "STRIDE_IN_1X1": False,
        "CIFAR_STEM": False,
    }
    r = resnet_config({"backbone": "resnet18", "width": 16, "cifar_stem": True})
    assert (r["DEPTH"], r["STEM_OUT_CHANNELS"], r["RES2_OUT_CHANNELS"], r["CIFAR_STEM"]) == (18, 16, 16, True)
    with pytest.raises(ValueError, match="resnet101"):
        resnet_config({"backbone": "resnet101"})
    assert pixel_config({"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}) == {
        "PIXEL_MEAN": [123.675, 116.28, 103.53],
        "PIXEL_STD": [58.395, 57.12, 57.375],
        "FORMAT": "RGB",
    }


@needs_d2
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_names_are_exactly_the_detectron2_trunks(layout):
    """Every converted key is a parameter or buffer of detectron2's ResNet built for the same layout, and every
    one of those is covered (the registered builder, so narrow and CIFAR-stem trunks count too)."""
    from detectron2.layers import ShapeSpec
    from detectron2.modeling import BACKBONE_REGISTRY

    from pipeline.detect.d2_config import model_config

    src = fake_source(*LAYOUTS[layout])
    from pipeline.detect.export import backbone_meta

    cfg = model_config(backbone_meta(src), "fpn", num_classes=3)
    cfg.MODEL.RESNETS.OUT_FEATURES = ["res2", "res3", "res4", "res5"]
    trunk = BACKBONE_REGISTRY.get("build_augssl_resnet_backbone")(cfg, ShapeSpec(channels=3))
    ours = to_detectron2(src.backbone)
    theirs = {k: v.shape for k, v in trunk.state_dict().items() if not k.endswith("num_batches_tracked")}
    assert set(ours) == set(theirs)
    assert all(tuple(ours[k].shape) == tuple(theirs[k]) for k in ours)


def _exported(tmp_path: Path, layout: str, fmt: str = "detectron2") -> tuple:
    """The export job run as the README shows it, on a checkpoint file."""
    src = fake_source(*LAYOUTS[layout])
    ckpt = tmp_path / "ckpt" / "state.pt"
    ckpt.parent.mkdir(parents=True)
    torch.save(src.state, ckpt)
    out = tmp_path / f"backbone.{'pkl' if fmt == 'detectron2' else 'pt'}"
    r = subprocess.run(
        [
            sys.executable,
            str(ROOT / "jobs" / "export.py"),
            f"run={ckpt}",
            f"format={fmt}",
            f"out={out}",
            f"paths.root={tmp_path}",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert str(out) in r.stdout and not list(tmp_path.glob("*.partial"))
    return src, out


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(re.sub(r"\x1b\[[0-9;]*m", "", record.getMessage()))


def load_report(model, path: Path) -> str:
    """What detectron2's checkpointer says while loading `path` into `model` (its warnings name the model's
    parameters it did not find, the file's keys it did not use and the shapes it skipped)."""
    from detectron2.checkpoint import DetectionCheckpointer

    handler = _Records()
    loggers = [logging.getLogger(n) for n in ("fvcore", "detectron2")]
    for lg in loggers:
        lg.addHandler(handler)
        lg.setLevel(logging.DEBUG)
    try:
        DetectionCheckpointer(model).load(str(path))
    finally:
        for lg in loggers:
            lg.removeHandler(handler)
    return "\n".join(handler.lines)


@needs_d2
@pytest.mark.parametrize("layout,arch", [("r50", "c4"), ("r50", "fpn"), ("r18-cifar-w16", "fpn"), ("r50-narrow", "c4")])
def test_exported_pkl_loads_in_detectron2_with_every_backbone_weight(tmp_path, layout, arch):
    from detectron2.modeling import build_model

    from pipeline.detect.d2_config import model_config

    src, pkl = _exported(tmp_path, layout)
    meta = pickle.loads(pkl.read_bytes())["augssl"]
    assert meta["pixel"]["PIXEL_MEAN"] == [127.5, 102.0, 76.5] and meta["pixel"]["FORMAT"] == "RGB"
    cfg = model_config(meta, arch, num_classes=3)
    cfg.MODEL.DEVICE = "cpu"
    model = build_model(cfg)
    report = load_report(model, pkl)
    assert "Reading a file from 'augssl'" in report
    assert "not used by the model" not in report and "will not be loaded" not in report, report
    trunk = "backbone.bottom_up." if arch == "fpn" else "backbone."
    missing = report.split("not found in the checkpoint:")[-1] if "not found in the checkpoint" in report else ""
    for token in ("stem", "res2", "res3", "res4", "res5"):  # no trunk part among what was not found
        assert not re.search(rf"(bottom_up\.|backbone\.|roi_heads\.){token}\b", missing), (token, missing)
    # the weights detectron2 holds now are the pretrained ones, res5 included (in the C4 box head)
    state, want = model.state_dict(), to_detectron2(src.backbone)
    for name, value in want.items():
        where = f"roi_heads.{name}" if arch == "c4" and name.startswith("res5") else trunk + name
        assert torch.equal(state[where].cpu(), value.float()), where
    assert list(model.pixel_mean.flatten().tolist()) == pytest.approx(meta["pixel"]["PIXEL_MEAN"])


@needs_d2
def test_c4_refuses_a_basic_block_resnet():
    from pipeline.detect.d2_config import model_config
    from pipeline.detect.export import backbone_meta

    with pytest.raises(ValueError, match="arch=c4 needs a bottleneck ResNet"):
        model_config(backbone_meta(fake_source(*LAYOUTS["r18-cifar-w16"])), "c4", num_classes=3)


def test_torchvision_export_loads_into_torchvision(tmp_path):
    import torchvision

    src, pt = _exported(tmp_path, "r50", fmt="torchvision")
    saved = torch.load(pt, weights_only=False)
    net = torchvision.models.resnet50()
    result = net.load_state_dict(saved["state_dict"], strict=False)
    assert sorted(result.missing_keys) == ["fc.bias", "fc.weight"] and not result.unexpected_keys
    assert torch.equal(net.layer4[2].bn3.running_var, src.backbone["layer4.2.bn3.running_var"])
    assert saved["augssl"]["resnets"]["DEPTH"] == 50


def test_export_refuses_bad_input_in_one_line(tmp_path):
    for args, needle in (
        (["run=nope"], "error: checkpoint 'nope' is neither"),
        (["run=x", "format=onnx"], "error: format=onnx"),
        (["run=x", "out=a.pt"], "error: out=a.pt: format=detectron2 writes a .pkl"),
    ):
        r = subprocess.run(
            [sys.executable, str(ROOT / "jobs" / "export.py"), *args, f"paths.root={tmp_path}"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
            env=job_env(),
        )
        assert r.returncode == 2 and r.stderr.strip().startswith(needle), r.stderr[-2000:]
        assert len(r.stderr.strip().splitlines()) == 1


# --- the embedded detection set, COCO AP, the detection job ---------------------------------------------------


def test_shapes_set_boxes_follow_the_drawn_shapes(tmp_path):
    import json

    import numpy as np
    from PIL import Image

    from pipeline.detect.shapes import CLASSES, make_shapes

    s = {"n_train": 40, "n_val": 10, "size": 96, "min_objects": 1, "max_objects": 3, "min_side": 16, "max_side": 32}
    root = make_shapes(tmp_path, s)
    coco = json.loads((root / "train" / "annotations.json").read_text())
    assert [c["name"] for c in coco["categories"]] == list(CLASSES) and len(coco["images"]) == 40
    per_image: dict[int, list] = {}
    for a in coco["annotations"]:
        per_image.setdefault(a["image_id"], []).append(a["bbox"])
    assert all(1 <= len(b) <= 3 for b in per_image.values()) and len(per_image) == 40
    contrast = []
    for im in coco["images"]:
        px = np.asarray(Image.open(root / "train" / "images" / im["file_name"]).convert("L"), dtype=float)
        for x, y, w, h in per_image[im["id"]]:
            assert 0 <= x and 0 <= y and x + w <= 96 and y + h <= 96 and 16 <= w <= 32 and w == h
            inside = px[int(y) + 1 : int(y + h) - 1, int(x) + 1 : int(x + w) - 1]
            contrast.append(inside.max() - np.median(px))
        boxes = per_image[im["id"]]
        from pipeline.detect.shapes import _iou

        assert all(_iou(a, b) <= 0.2 + 1e-9 for i, a in enumerate(boxes) for b in boxes[i + 1 :])
    assert min(contrast) > 40  # every box holds its bright shape on the dark canvas
    manifest = root / "manifest.json"
    stamp = manifest.stat().st_mtime_ns
    assert make_shapes(tmp_path, s) == root and manifest.stat().st_mtime_ns == stamp  # made once
    assert make_shapes(tmp_path, {**s, "seed": 1}) != root  # other settings, another folder
    with pytest.raises(ValueError, match="out of range"):
        make_shapes(tmp_path, {**s, "min_side": 40})


def test_coco_ap_of_perfect_shifted_and_no_detections(tmp_path):
    import json

    from pipeline.detect.coco_data import coco_ap
    from pipeline.detect.shapes import make_shapes

    root = make_shapes(tmp_path, {"n_train": 4, "n_val": 12, "size": 96, "min_side": 16, "max_side": 32})
    ann = root / "val" / "annotations.json"
    gt = json.loads(ann.read_text())["annotations"]
    perfect = [
        {"image_id": a["image_id"], "category_id": a["category_id"], "bbox": a["bbox"], "score": 1.0} for a in gt
    ]
    assert coco_ap(ann, perfect) == pytest.approx({"AP": 100.0, "AP50": 100.0, "AP75": 100.0}, abs=1e-6)
    # shifted by 30 % of the side: IoU 0.54 -> found at IoU .50, missed at .75
    shifted = [{**r, "bbox": [r["bbox"][0] + 0.3 * r["bbox"][2], *r["bbox"][1:]]} for r in perfect]
    ap = coco_ap(ann, shifted)
    assert ap["AP50"] == pytest.approx(100.0, abs=1e-6) and ap["AP75"] == 0.0 and 0 < ap["AP"] < 50
    wrong_class = [{**r, "category_id": r["category_id"] % 3 + 1} for r in perfect]
    assert coco_ap(ann, wrong_class)["AP"] == 0.0 and coco_ap(ann, []) == {"AP": 0.0, "AP50": 0.0, "AP75": 0.0}


def _detect(tmp_path: Path, *args: str, timeout: int = 900):
    return subprocess.run(
        [sys.executable, str(ROOT / "jobs" / "detect.py"), f"paths.root={tmp_path}", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=job_env(),
    )


@pytest.mark.parametrize(
    "args,needle",
    [
        (["engine=mmdet"], "error: engine=mmdet: expected one of torchvision, detectron2"),
        (["detect.anchor_sizes=[16,32]"], "error: detect.anchor_sizes=[16, 32]: one size per FPN level, 4"),
        (["detect.steps=[500]"], "error: detect.steps=[500]: increasing iterations between 1 and"),
        (["detect.arch=c4"], "error: detect.arch=c4: torchvision's engine builds FPN detectors"),
        (["detect.in_features=[res3,res5]"], "error: detect.in_features=['res3', 'res5']: consecutive stages"),
        (["detect=coco", "detect.data.root=/nowhere"], "error: detect.data.train_json=/nowhere/annotations"),
        (["detect.iterations=abc"], "error: detect.iterations=abc: expected an integer >= 1"),
    ],
)
def test_detect_refuses_bad_input_in_one_line_before_mlflow(tmp_path, args, needle):
    r = _detect(tmp_path, "run=x", *args, timeout=120)
    assert r.returncode == 2 and r.stderr.strip().startswith(needle), r.stderr[-2000:]
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "runs").exists()


TINY = [
    "detect.data.generate.n_train=16",
    "detect.data.generate.n_val=6",
    "detect.data.generate.size=64",
    "detect.data.generate.min_side=12",
    "detect.data.generate.max_side=24",
    "detect.min_size=64",
    "detect.max_size=64",
    "detect.anchor_sizes=[8,16,32,64]",
    "detect.iterations=4",
    "detect.batch_size=4",
    "detect.warmup=2",
    "detect.steps=[3]",
    "detect.log_every=2",
    "detect.fpn_channels=16",
]


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["torchvision", pytest.param("detectron2", marks=needs_d2)])
def test_detect_job_end_to_end_on_a_checkpoint(tmp_path, engine):
    """Both backbones through the engine on a tiny set: metrics, the PNG and a finished run; the rerun trains
    nothing. detectron2 trains in two processes (detect.workers=2): its launch starts two gloo processes (DDP,
    naiveSyncBN, the batch split), the main one logs the losses and writes the scores the job reads back."""
    import mlflow

    src = fake_source(*LAYOUTS["r18-cifar-w16"])
    ckpt = tmp_path / "ckpt" / "state.pt"
    ckpt.parent.mkdir(parents=True)
    torch.save(src.state, ckpt)
    workers = ["detect.workers=2"] if engine == "detectron2" else []
    r = _detect(tmp_path, f"run={ckpt}", f"engine={engine}", *TINY, *workers)
    assert r.returncode == 0, r.stderr[-4000:]
    assert "| pretrained |" in r.stdout and "| random |" in r.stdout
    # quiet: no library notices, and detectron2's loading report read and summed up in one line
    assert "Warning" not in r.stderr and "not found in the checkpoint" not in r.stdout + r.stderr, r.stderr[-2000:]
    if engine == "detectron2":  # said once for the pretrained backbone, by the main process only
        assert r.stdout.count("detectron2 loaded every backbone weight") == 1, r.stdout[-3000:]
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("augssl").experiment_id])
    m = run.data.metrics
    assert run.info.status == "FINISHED" and run.data.tags["job"] == "detect"
    assert all(0.0 <= m[f"detect/{b}_{k}"] <= 100.0 for b in ("pretrained", "random") for k in ("AP", "AP50", "AP75"))
    inputs = {d.tags[0].value: d.dataset for d in client.get_run(run.info.run_id).inputs.dataset_inputs}
    assert sorted(inputs) == ["training", "validation"]  # the annotation files, each with its digest and count
    assert inputs["training"].digest != inputs["validation"].digest and '"num_samples": ' in inputs["training"].profile
    assert len(client.get_metric_history(run.info.run_id, "detect/pretrained_loss")) == 2  # every 2 of 4 iterations
    assert [a.path for a in client.list_artifacts(run.info.run_id, "detect")] == [
        "detect/predictions.png",
        "detect/table.md",
    ]
    assert run.data.params["engine"] == engine and run.data.params["detect.iterations"] == "4"
    again = _detect(tmp_path, f"run={ckpt}", f"engine={engine}", *TINY, *workers, timeout=120)
    assert again.returncode == 0 and "finished before" in again.stdout
    assert len(client.search_runs([run.info.experiment_id])) == 1
    if engine == "detectron2":
        bad = _detect(tmp_path, "run=x", "engine=detectron2", "detect.workers=3", timeout=120)
        assert bad.returncode == 2 and bad.stderr.startswith("error: detect.batch_size=8: does not split over")


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["torchvision", pytest.param("detectron2", marks=needs_d2)])
def test_a_diverging_transfer_is_one_error_line_and_a_failed_run(tmp_path, engine):
    """Settings that make the detector diverge: one error line naming the iteration and what to lower, no traceback,
    the MLflow run FAILED."""
    import mlflow

    src = fake_source(*LAYOUTS["r18-cifar-w16"])
    ckpt = tmp_path / "ckpt" / "state.pt"
    ckpt.parent.mkdir(parents=True)
    torch.save(src.state, ckpt)
    tiny = [a for a in TINY if not a.startswith("detect.iterations")] + ["detect.iterations=6"]
    args = ("detect.lr=1e6", "detect.clip_grad_norm=null", "baseline=false")
    r = _detect(tmp_path, f"run={ckpt}", f"engine={engine}", *tiny, *args)
    assert r.returncode == 2, r.stderr[-3000:]
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in r.stdout + r.stderr, r.stderr[-3000:]
    assert re.match(
        r"error: detection from the pretrained backbone diverged "
        r"\((?:non-finite [a-z ]+|loss (?:nan|inf)) at iteration [1-6] of 6\): "
        r"lower detect.lr \(now 1e\+06\), set detect.clip_grad_norm",
        err[0],
    ), err[0]
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("augssl").experiment_id])
    assert run.info.status == "FAILED" and "diverged" in run.data.tags.get("error", ""), run.data.tags


@needs_d2
def test_detectron2_load_report_fails_on_a_missing_trunk_weight(capsys):
    """The engine reads detectron2's loading report: heads not found are expected, a trunk weight is an error."""
    from pipeline.detect.d2_engine import _load

    class Reports:
        def __init__(self, *missing):
            self.missing = missing

        def resume_or_load(self, resume):
            logging.getLogger("fvcore.common.checkpoint").warning(
                "Some model parameters or buffers are not found in the checkpoint:\n" + "\n".join(self.missing)
            )

    _load(Reports("backbone.fpn_lateral3.{bias, weight}", "roi_heads.box_head.fc1.{bias, weight}"), "w.pkl", False)
    assert "loaded every backbone weight" in capsys.readouterr().out
    with pytest.raises(RuntimeError, match="did not load every backbone weight"):
        _load(Reports("backbone.fpn_lateral3.{bias, weight}", "backbone.bottom_up.res3.0.conv1.weight"), "w.pkl", False)
    with pytest.raises(RuntimeError, match="did not load every backbone weight"):
        _load(Reports("roi_heads.res5.2.conv3.norm.{bias, weight}"), "w.pkl", False)


def test_non_contiguous_category_ids_train_as_labels_and_come_back_as_ids(tmp_path):
    """COCO's 80 classes have ids up to 90: the torchvision detector sees labels 1..K, results carry the ids."""
    import json

    from pipeline.detect import tv_engine
    from pipeline.detect.coco_data import CocoSplit
    from pipeline.detect.shapes import make_shapes

    root = make_shapes(tmp_path, {"n_train": 2, "n_val": 3, "size": 64, "min_side": 12, "max_side": 24})
    ann = root / "val" / "annotations.json"
    coco = json.loads(ann.read_text())
    ids = {1: 90, 2: 7, 3: 3}
    for c in coco["categories"]:
        c["id"] = ids[c["id"]]
    for a in coco["annotations"]:
        a["category_id"] = ids[a["category_id"]]
    ann.write_text(json.dumps(coco))
    ds = CocoSplit(ann, root / "val" / "images")
    assert ds.label_of == {3: 1, 7: 2, 90: 3} and ds.category_of == {1: 3, 2: 7, 3: 90}
    _, target = ds[0]
    want = sorted(ds.label_of[a["category_id"]] for a in coco["annotations"] if a["image_id"] == 1)
    assert sorted(target["labels"].tolist()) == want
    d = {
        "in_features": ["res3", "res4", "res5"],
        "anchor_sizes": [8, 16, 32, 64],
        "fpn_channels": 16,
        "min_size": 64,
        "max_size": 64,
        "norm": "bn",
        "roi_batch_per_image": 32,
    }
    backbone = build_backbone({"backbone": "resnet18", "cifar_stem": True, "width": 8})
    model = tv_engine.build_detector(backbone, 3, d, [0.0] * 3, [1.0] * 3)
    model.roi_heads.score_thresh = 0.0  # an untrained detector: keep whatever it finds
    results = tv_engine.predict(model, ds, torch.device("cpu"))
    assert results and {r["category_id"] for r in results} <= {3, 7, 90}


@needs_d2
def test_detectron2_syncs_bn_over_its_processes_and_keeps_plain_bn_in_one():
    from pipeline.detect import d2_engine
    from pipeline.detect.export import backbone_meta

    meta = backbone_meta(fake_source(*LAYOUTS["r18-cifar-w16"]))
    d = {
        "arch": "fpn",
        "in_features": ["res3", "res4", "res5"],
        "anchor_sizes": [8, 16, 32, 64],
        "fpn_channels": 8,
        "roi_batch_per_image": 8,
        "min_size": 64,
        "max_size": 64,
        "batch_size": 4,
        "lr": 0.01,
        "iterations": 2,
        "steps": [1],
        "warmup": 1,
        "weight_decay": 1e-4,
        "seed": 0,
        "norm": "bn",
    }
    data = {"train_json": "unused.json", "train_images": ".", "val_json": "unused.json", "val_images": "."}

    def norm(workers, device, frozen=False):
        dd = {**d, "workers": workers, "norm": "frozen" if frozen else "bn"}
        cfg = d2_engine.config(meta, dd, data, 3, device, Path("."), "", f"t{workers}{device}{frozen}")
        return cfg.MODEL.RESNETS.NORM

    assert norm(1, "cpu") == "BN" and norm(2, "cpu") == "naiveSyncBN" and norm(8, "cuda") == "SyncBN"
    assert norm(2, "cpu", frozen=True) == "FrozenBN"
    clip = d2_engine.config(meta, {**d, "workers": 1, "clip_grad_norm": 1.0}, data, 3, "cpu", Path("."), "", "tc")
    assert clip.SOLVER.CLIP_GRADIENTS.ENABLED and clip.SOLVER.CLIP_GRADIENTS.CLIP_TYPE == "norm"
    assert clip.SOLVER.CLIP_GRADIENTS.CLIP_VALUE == 1.0 and clip.SOLVER.CLIP_GRADIENTS.NORM_TYPE == 2.0
    unclipped = d2_engine.config(meta, {**d, "workers": 1, "clip_grad_norm": None}, data, 3, "cpu", Path("."), "", "tn")
    assert not unclipped.SOLVER.CLIP_GRADIENTS.ENABLED


def _grads(seed: int = 0) -> list[torch.Tensor]:
    """Gradients of a small two-layer net: one parameter's norm far above 1, others below."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(8, 4, generator=g) * 3, torch.randn(8, generator=g) * 0.01, torch.randn(3, 8, generator=g)]


def test_each_parameter_gradient_is_clipped_to_its_own_norm():
    """tv_engine.clip_each_ against the formula: g * min(1, c / ||g||_2), parameter by parameter."""
    from pipeline.detect.tv_engine import clip_each_

    params = [torch.nn.Parameter(torch.zeros_like(g)) for g in _grads()]
    for p, g in zip(params, _grads()):
        p.grad = g.clone()
    clip_each_(params, 1.0)
    for p, g in zip(params, _grads()):
        expected = g * min(1.0, 1.0 / float(g.norm()))
        torch.testing.assert_close(p.grad, expected, rtol=1e-5, atol=1e-7)
    assert float(params[0].grad.norm()) == pytest.approx(1.0, rel=1e-5)  # was ~17
    assert torch.equal(params[1].grad, _grads()[1])  # below the cap: untouched
    clip_each_(params, None)  # no cap: nothing changes
    torch.testing.assert_close(params[0].grad.norm(), torch.tensor(1.0))


@needs_d2
def test_both_engines_clip_alike():
    """detectron2's own clipper (SOLVER.CLIP_GRADIENTS as d2_engine.config sets it) and tv_engine's give the same
    gradients."""
    from detectron2.config import get_cfg
    from detectron2.solver.build import maybe_add_gradient_clipping

    from pipeline.detect.tv_engine import clip_each_

    cfg = get_cfg()
    c = cfg.SOLVER.CLIP_GRADIENTS
    c.ENABLED, c.CLIP_TYPE, c.CLIP_VALUE, c.NORM_TYPE = True, "norm", 1.0, 2.0
    ours = [torch.nn.Parameter(torch.zeros_like(g)) for g in _grads(1)]
    theirs = [torch.nn.Parameter(torch.zeros_like(g)) for g in _grads(1)]
    for a, b, g in zip(ours, theirs, _grads(1)):
        a.grad, b.grad = g.clone(), g.clone()
    clip_each_(ours, 1.0)
    opt = maybe_add_gradient_clipping(cfg, torch.optim.SGD)(theirs, lr=0.0)
    opt.step()  # lr 0: only the clipping acts on the gradients
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a.grad, b.grad)


@pytest.mark.slow
def test_an_unstable_resnet50_diverges_unclipped_and_trains_with_the_presets_clipping(tmp_path):
    """A ResNet-50 whose BN affine is far from 1/0 (as fake_source makes it; a 1-epoch pretraining's diverged the
    same way) under the shapes preset at 64 px: unclipped, the loss becomes non-finite and tv_engine.train raises
    Diverged naming the iteration; with the preset's clip_grad_norm the same steps end at a finite loss."""
    from omegaconf import OmegaConf

    from pipeline.detect import tv_engine
    from pipeline.detect.coco_data import CocoSplit
    from pipeline.detect.diverged import Diverged
    from pipeline.detect.shapes import make_shapes
    from pipeline.eval.probe.compare import backbone_from

    preset = OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "detect" / "shapes.yaml"))
    gen = {**preset["data"]["generate"], "n_train": 48, "n_val": 2, "size": 64, "min_side": 12, "max_side": 24}
    root = make_shapes(tmp_path, gen)
    ds = CocoSplit(root / "train" / "annotations.json", root / "train" / "images", flip=True, seed=0)
    d = {**preset, "min_size": 64, "max_size": 64, "anchor_sizes": [8, 16, 32, 64], "iterations": 30, "seed": 0}
    src = fake_source(*LAYOUTS["r50"])

    def train(clip):
        torch.manual_seed(0)
        model = tv_engine.build_detector(backbone_from(src.state), 3, d, [0.5, 0.4, 0.3], [0.2, 0.25, 0.3])
        return tv_engine.train(model, ds, {**d, "clip_grad_norm": clip}, torch.device("cpu"))

    with pytest.raises(Diverged) as e:
        train(None)
    assert 1 < e.value.iteration <= 30 and ("loss nan" in str(e.value) or "loss inf" in str(e.value))
    assert preset["clip_grad_norm"] == 1.0
    last = train(preset["clip_grad_norm"])
    assert all(torch.isfinite(torch.tensor(v)) for v in last.values()) and last["loss"] < 2.0


def test_make_shards_writes_the_shapes_set_the_detect_job_reads_as_coco(tmp_path):
    cmd = [
        sys.executable,
        str(ROOT / "jobs" / "make_shards.py"),
        "source=shapes",
        f"output={tmp_path}",
        "+shapes.n_train=5",
        "+shapes.n_val=2",
        "+shapes.size=64",
        "+shapes.min_side=12",
        "+shapes.max_side=24",
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=job_env())
    assert r.returncode == 0, r.stderr[-2000:]
    (out,) = tmp_path.glob("shapes-*")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["counts"]["train"]["images"] == 5 and manifest["settings"]["size"] == 64
    assert f"train: 5 images, {manifest['counts']['train']['objects']} boxes -> {out / 'train'}" in r.stdout
    # the same set as the job makes on first use (one folder per settings), and readable as a COCO preset
    from pipeline.config import compose_config
    from pipeline.detect.job import DetectionTransfer
    from pipeline.detect.shapes import make_shapes

    DetectionTransfer().job(
        compose_config(
            [
                "run=x",
                "detect=coco",
                f"detect.data.root={out}",
                f"detect.data.train_json={out}/train/annotations.json",
                f"detect.data.train_images={out}/train/images",
                f"detect.data.val_json={out}/val/annotations.json",
                f"detect.data.val_images={out}/val/images",
            ],
            "detection",
        )
    )
    assert make_shapes(tmp_path, manifest["settings"]) == out
    bad = subprocess.run([*cmd[:4], "+shapes.size=10"], capture_output=True, text=True, timeout=120, env=job_env())
    assert bad.returncode == 2 and bad.stderr.startswith("error: shapes: shapes settings out of range")
