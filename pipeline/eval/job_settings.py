"""The typed keys of the evaluation jobs' own configs (conf/knn.yaml, conf/finetune.yaml; the probe's, which is the
training config): checked by their jobs (knn_job, finetune_job, probe_job) and read by their runs (knn_run,
finetune_run, probe_run), so here, below both (as job_errors is)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipeline.fields import Bool, Choice, Int, Num, Section, Str
from pipeline.sections import Resources


class Knn(Section):
    k: Int(1)
    temperature: Num(gt=0)
    baseline: Bool()
    batch_size: Int(1)
    actors: Int(1, null=True) = None
    actor_resources: Resources = None
    seed: Int(0)


class Finetune(Section):
    """The typed keys of conf/finetune.yaml; lr_head, crop_scale, flip, milestones and the subset file in check(),
    which words their errors itself. The job's run reads its settings from this model once check() has passed."""

    label_fraction: Num(gt=0, le=1)
    subset: Str(null=True) = None
    baseline: Bool()
    device: Choice("auto", "cpu", "cuda")
    seed: Int(0)
    epochs: Int(1)
    batch_size: Int(2)
    lr_backbone: Num(ge=0)
    gamma: Num(gt=0, le=1)
    momentum: Num(ge=0, lt=1)
    weight_decay: Num(ge=0)
    clip_grad_norm: Num(gt=0, null=True) = None
    precise_bn: Bool() = True
    val_size: Int(1, null=True) = None
    # checked by check(), each in a line of its own
    milestones: Any
    lr_head: Any  # "auto" or a number > 0
    crop_scale: Any  # "auto" or [lo, hi]
    flip: Any  # "auto", true or false


@dataclass(frozen=True)
class ProbeRequest:
    """The probe's own settings: the command line's training config (pipeline.sections' Config, checked), which the run
    merges with the probed run's own sections (run_probe.config_for_run), and the overrides that say which keys the
    command line set."""

    config: dict[str, Any]
    argv: tuple[str, ...]
