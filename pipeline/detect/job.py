"""jobs/detect.py: check the settings (one line, before MLflow or torch), then transfer the run's backbone, and a
random-init twin, to a detector on either engine, logging into a child run of the pretraining run. Here: its
settings and checks; the run is pipeline.detect.transfer."""

from __future__ import annotations

from pathlib import Path

from pipeline.config import ConfigError
from pipeline.detect.job_errors import DetectError
from pipeline.detect.settings import STAGES, Detection, Transfer
from pipeline.detect.voc import missing
from pipeline.eval.evaluation import Evaluation, Job
from pipeline.fields import Checked


def check(t: Transfer) -> None:
    """What the typed keys (Detection) do not say alone: engine, detector, schedule and data together, and what can be
    checked without the run."""
    d, engine = t.detect, t.engine
    if engine == "detectron2":
        try:  # detectron2: an optional install, only asked whether it is there (its engine loads in the run)
            import detectron2  # noqa: F401
        except ImportError:
            raise DetectError(
                "engine=detectron2: detectron2 is not installed (docs/detection.md says how; "
                "engine=torchvision needs nothing more)"
            ) from None
    if d["workers"] > 1 and engine == "torchvision":
        raise DetectError(
            f"detect.workers={d['workers']}: torchvision's engine trains in one process; "
            f"engine=detectron2 launches several"
        )
    if d["batch_size"] % d["workers"]:
        raise DetectError(
            f"detect.batch_size={d['batch_size']}: does not split over detect.workers={d['workers']} "
            f"processes; use a multiple of {d['workers']}"
        )
    if d["arch"] == "c4" and engine == "torchvision":
        raise DetectError("detect.arch=c4: torchvision's engine builds FPN detectors; use engine=detectron2")
    feats = list(d["in_features"])
    first = STAGES.index(feats[0]) if feats and feats[0] in STAGES else None
    if first is None or feats != list(STAGES[first : first + len(feats)]):  # consecutive, in order
        raise DetectError(
            f"detect.in_features={feats}: consecutive stages out of {', '.join(STAGES)}, e.g. [res3, res4, res5]"
        )
    levels = len(feats) + 1 if d["arch"] == "fpn" else None
    if levels is not None and len(d["anchor_sizes"]) != levels:
        raise DetectError(
            f"detect.anchor_sizes={d['anchor_sizes']}: one size per FPN level, {levels} for "
            f"in_features={feats} (theirs and the max-pooled level above them)"
        )
    if d["min_size"] > d["max_size"]:
        raise DetectError(f"detect.min_size={d['min_size']}: more than detect.max_size={d['max_size']}")
    steps = list(d["steps"])
    if steps != sorted(steps) or any(not isinstance(s, int) or not 0 < s < d["iterations"] for s in steps):
        raise DetectError(
            f"detect.steps={steps}: increasing iterations between 1 and detect.iterations={d['iterations']}"
        )
    data = d["data"]
    if data["kind"] == "coco":
        for key in ("train_json", "train_images", "val_json", "val_images"):
            if not Path(data[key]).exists():
                raise DetectError(f"detect.data.{key}={data[key]}: no such file or folder")
    elif data["kind"] == "voc":
        try:
            gone = missing(data["root"], [*data["train_sets"], *data["val_sets"]])
        except ValueError as e:
            raise DetectError(f"detect.data.train_sets / val_sets: {e}") from None
        if gone:
            raise DetectError(
                f"detect.data.root={data['root']}: no {gone} (a VOCdevkit folder holding VOC2007/, VOC2012/)"
            )
    elif data["kind"] != "shapes":
        raise DetectError(f"detect.data.kind={data['kind']}: expected shapes, coco or voc")


class DetectionTransfer(Evaluation[Transfer]):
    """Detection fine-tuning of the backbone on detectron2 or torchvision: jobs/detect.py, a suite's `job: detect`."""

    name = "detect"

    config = "detection"
    Error = DetectError

    def job(self, cfg: dict) -> Job[Transfer]:
        """The typed keys through the project's schema (Detection), then their relations (check)."""
        try:
            c = Checked.of(Detection, cfg)
        except ConfigError as e:
            raise DetectError(str(e)) from None
        t = Transfer.of(c)
        check(t)
        return Job.of(c, t)

    def run(self, job: Job[Transfer]) -> dict:
        from pipeline.detect import transfer  # the heavy part (torch, Ray, MLflow): kept off the bad-input path

        return transfer.run(job)
