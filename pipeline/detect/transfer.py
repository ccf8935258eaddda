"""The run of jobs/detect.py (its settings and checks: pipeline.detect.job, which imports this module when it runs):
the run's backbone, and a random-init twin, transferred to a detector on either engine, evaluated (COCO AP, VOC07
AP50 on VOC sets) and logged into a child run of the pretraining run."""

from __future__ import annotations

import hashlib
import json
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import mlflow
import torch

from pipeline import mlflow_ui, tracking
from pipeline.detect import tv_engine
from pipeline.detect.coco_data import CocoSplit
from pipeline.detect.diverged import Diverged, advice
from pipeline.detect.draw import predictions_png
from pipeline.detect.export import backbone_meta, export
from pipeline.detect.job_errors import DetectError
from pipeline.detect.notices import quiet_torch_notices
from pipeline.detect.settings import Transfer
from pipeline.detect.shapes import make_shapes
from pipeline.detect.voc import VOC_CLASSES, to_coco, voc07_ap50
from pipeline.eval import downstream
from pipeline.eval.downstream import results_table
from pipeline.eval.evaluation import Job
from pipeline.eval.probe.compare import backbone_from, random_backbone
from pipeline.eval.source import load_source

METRICS = ("AP", "AP50", "AP75", "VOC07_AP50")  # the last for VOC sets, where detectron2 is installed


def prepare_data(data: dict, data_root: str | Path) -> dict:
    """The splits' annotation files and image folders of detect.data; the embedded set is made on first use under
    `data_root` (paths.data)."""
    if data["kind"] == "coco":
        return {k: str(data[k]) for k in ("train_json", "train_images", "val_json", "val_images")}
    if data["kind"] == "voc":  # read once into COCO-format JSON under the data folder (both engines take it)
        classes = list(data.get("classes") or VOC_CLASSES)
        out = Path(data_root) / "voc-coco" / hashlib.sha1(str(Path(data["root"]).resolve()).encode()).hexdigest()[:10]
        try:
            train = to_coco(data["root"], list(data["train_sets"]), classes, out / "train.json")
            val = to_coco(data["root"], list(data["val_sets"]), classes, out / "val.json", test=True)
        except (ValueError, OSError, ET.ParseError) as e:
            raise DetectError(f"detect.data.root={data['root']}: {e}") from None
        return {
            "train_json": str(train),
            "train_images": str(data["root"]),
            "val_json": str(val),
            "val_images": str(data["root"]),
            "voc_root": str(data["root"]),
        }
    try:
        root = make_shapes(Path(data_root), data.get("generate") or {})
    except ValueError as e:
        raise DetectError(f"detect.data.generate: {e}") from None
    return {
        "train_json": str(root / "train" / "annotations.json"),
        "train_images": str(root / "train" / "images"),
        "val_json": str(root / "val" / "annotations.json"),
        "val_images": str(root / "val" / "images"),
    }


def run(job: Job[Transfer]) -> dict:
    """Transfer, evaluate, log; returns {label: {AP, AP50, AP75}}."""
    t, store = job.own, job.store
    if not t.verbose:
        quiet_torch_notices()
    try:
        device = downstream.pick_device(t.device)
        tracking.setup(store)  # a run id is looked up in the store
        src = load_source(job.source)
        meta = backbone_meta(src)
    except (FileNotFoundError, ValueError) as e:
        raise DetectError(str(e)) from None
    d, engine = t.detect, t.engine
    if engine == "detectron2" and d["arch"] == "c4" and meta["resnets"]["DEPTH"] < 50:
        raise DetectError(
            f"detect.arch=c4 needs a ResNet-50 (detectron2's Res5ROIHeads builds res5 from bottleneck "
            f"blocks); this run's backbone is {meta['backbone']}: use detect.arch=fpn"
        )
    workers = d["workers"]
    if engine == "detectron2" and workers > 1:
        if device == "cuda" and workers > torch.cuda.device_count():
            raise DetectError(
                f"detect.workers={workers}: one process per GPU, and torch sees {torch.cuda.device_count()} here"
            )
        if device == "cpu" and torch.cuda.is_available():
            raise DetectError(
                f"detect.workers={workers} with device=cpu on a machine with CUDA: detectron2's launch "
                f"would pick NCCL; use device=cuda (or one worker)"
            )
    data = prepare_data(d["data"], job.data_root)
    settings = {"source": src.ref, "engine": engine, "detect": d, "baseline": t.baseline, "seed": t.seed}
    ev = downstream.find(store, src, "detect", settings, f"{engine}-{d['name']}")
    if ev.finished:
        return _finished(ev.found, ev.name)
    out_dir = job.runs / "detect" / ev.name
    with downstream.child_run(store, src, ev, "detect") as run_id:
        if ev.found is None:
            mlflow.log_params(
                {
                    "engine": engine,
                    "source": src.ref,
                    "device": device,
                    "baseline": t.baseline,
                    **tracking.flatten(d, "detect."),
                }
            )
            mlflow_ui.log_detection_datasets(data)  # the annotation files it trains and scores on
        out = _transfer_all(t, src, meta, data, device, out_dir, ev.run_key.split(":", 1)[1])
    where = f" (a child of {src.run_id})" if src.run_id else ""
    print(f"[detect] done: MLflow run {run_id}{where}; detections: {out_dir / 'predictions.png'}", flush=True)
    return out


def _transfer_all(t: Transfer, src, meta: dict, data: dict, device: str, out_dir: Path, key: str) -> dict:
    """Each backbone in turn (a backbone whose results an earlier, interrupted attempt logged is not redone)."""
    labels = ["pretrained", "random"] if t.baseline else ["pretrained"]
    logged = mlflow.get_run(tracking.active_run_id()).data.metrics
    scores, results = {}, {}
    out_dir.mkdir(parents=True, exist_ok=True)
    for label in labels:
        saved = out_dir / f"{label}_results.json"
        if key_of(label, "AP") in logged and saved.exists():
            scores[label] = {m: logged[key_of(label, m)] for m in METRICS if key_of(label, m) in logged}
            results[label] = json.loads(saved.read_text())
            print(f"[detect] {label}: done before (AP {scores[label]['AP']:.1f}); kept", flush=True)
            continue
        t0 = time.monotonic()
        try:
            res = _transfer(t, src, meta, data, device, out_dir / label, key, label)
        except Diverged as e:
            raise DetectError(advice(e, label, t.detect)) from None
        if "voc_root" in data:
            res = {**res, **_voc_metric(data, res["results"])}
        minutes = (time.monotonic() - t0) / 60
        scores[label] = {m: res[m] for m in METRICS if m in res}
        results[label] = res["results"]
        saved.write_text(json.dumps(res["results"]))
        mlflow.log_metrics(
            {**{key_of(label, m): v for m, v in scores[label].items()}, key_of(label, "minutes"): minutes}
        )
        print(
            f"[detect] {label}: "
            + "  ".join(f"{m} {v:.1f}" for m, v in scores[label].items())
            + f"  ({minutes:.1f} min)",
            flush=True,
        )
    table = _table(scores)
    print(table, flush=True)
    mlflow.log_text(table, "detect/table.md")
    png = predictions_png(CocoSplit(data["val_json"], data["val_images"]), results, out_dir / "predictions.png")
    mlflow.log_artifact(str(png), "detect")
    return scores


def _transfer(t: Transfer, src, meta: dict, data: dict, device: str, out_dir: Path, key: str, label: str) -> dict:
    d = {**t.detect, "seed": t.seed}

    def log(it: int, losses: dict) -> None:
        mlflow.log_metrics({key_of(label, k): v for k, v in losses.items()}, step=it)

    if t.engine == "torchvision":
        net = backbone_from(src.state) if label == "pretrained" else random_backbone(src.cfg["model"], t.seed)
        mean = [m / 255.0 for m in meta["pixel"]["PIXEL_MEAN"]]
        std = [s / 255.0 for s in meta["pixel"]["PIXEL_STD"]]
        return tv_engine.transfer(net, data, d, mean, std, torch.device(device), log, label)
    # detectron2 (d2_engine imports it at load): an optional install, loaded only for engine=detectron2, after
    # quiet_torch_notices() (its jit.script notices at import)
    from pipeline.detect import d2_engine

    weights = str(export(src, "detectron2", out_dir / "backbone.pkl")) if label == "pretrained" else ""
    torch.manual_seed(t.seed)
    active = tracking.active_run_id()
    return d2_engine.transfer(
        meta,
        weights,
        data,
        d,
        device,
        out_dir,
        f"augssl_{key}",
        (mlflow.get_tracking_uri(), active, key_of(label, "")),
        label,
        verbose=t.verbose,
    )


def _voc_metric(data: dict, results: list[dict]) -> dict:
    """VOC07 AP50 by detectron2's voc_eval, where detectron2 is installed (COCO AP is reported either way)."""
    try:  # detectron2: an optional install, only asked whether it is there
        import detectron2  # noqa: F401
    except ImportError:
        print("[detect] VOC07 AP50 needs detectron2's voc_eval (not installed): COCO AP only", flush=True)
        return {}
    try:
        return {"VOC07_AP50": voc07_ap50(data["val_json"], data["voc_root"], results)}
    except ValueError as e:
        print(f"[detect] no VOC07 AP50: {e}", flush=True)
        return {}


def key_of(label: str, name: str) -> str:
    """A detection metric's MLflow name: detect/<backbone>_<name> (detect/pretrained_AP), grouped in the UI as
    every job's are (train/, knn/, probe/, finetune/)."""
    return f"detect/{label}_{name}"


def _table(scores: dict[str, dict[str, float]]) -> str:
    return results_table(scores, [m for m in METRICS if any(m in v for v in scores.values())], ".1f")


def _finished(run, name: str) -> dict:
    m = run.data.metrics
    scores = {
        label: {k: m[key_of(label, k)] for k in METRICS if key_of(label, k) in m}
        for label in ("pretrained", "random")
        if key_of(label, "AP") in m
    }
    print(f"[detect] {name} finished before (MLflow run {run.info.run_id}); nothing to run. Its results:", flush=True)
    print(_table(scores), flush=True)
    return scores
