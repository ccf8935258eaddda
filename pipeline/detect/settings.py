"""The detection job's settings: the typed keys of conf/detection.yaml and its conf/detect/ presets, and `Transfer`,
what the job reads of its config once they are checked. Here, below the job's checks (pipeline.detect.job) and its
run (pipeline.detect.transfer), so that neither imports the other back. Imports no torch."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.fields import Bool, Checked, Choice, Int, Num, Section

ENGINES = ("torchvision", "detectron2")
STAGES = ("res2", "res3", "res4", "res5")


class Detect(Section):
    """The typed keys of a conf/detect/ preset; their relations are checked in check()."""

    arch: Choice("fpn", "c4")
    fpn_channels: Int(1)
    roi_batch_per_image: Int(1)
    min_size: Int(1)
    max_size: Int(1)
    norm: Choice("bn", "frozen")
    iterations: Int(1)
    batch_size: Int(1)
    lr: Num(gt=0)
    clip_grad_norm: Num(gt=0, null=True) = None
    warmup: Int(0)
    log_every: Int(1)
    workers: Int(1)


class Detection(Section):
    """The job's own keys (conf/detection.yaml), the preset under `detect`."""

    engine: Choice(*ENGINES)
    device: Choice("auto", "cpu", "cuda")
    baseline: Bool()
    seed: Int(0)
    detect: Detect


@dataclass(frozen=True)
class Transfer:
    """What the detection job reads of its config, typed once it is checked (pipeline.detect.job): the engine, the
    preset and the run's own settings."""

    engine: str  # torchvision or detectron2
    device: str  # auto, cpu or cuda
    detect: dict  # the preset (detect.*), as the engines take it
    baseline: bool  # a random-init twin too
    seed: int
    verbose: bool

    @classmethod
    def of(cls, c: Checked[Detection]) -> Transfer:
        """The preset stays as the config has it (`raw`): the engines take it so."""
        t = c.typed
        return cls(t.engine, t.device, c.raw["detect"], t.baseline, t.seed, bool(c.raw.get("verbose")))
