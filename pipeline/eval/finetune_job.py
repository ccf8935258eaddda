"""jobs/finetune.py: check the settings (one line, before MLflow or torch's work), draw or read the labelled
subset, fine-tune the run's backbone and a random-init twin on it, log both into a child run of the run. Here: its
checks (its typed keys: pipeline.eval.job_settings); the run is pipeline.eval.finetune_run."""

from __future__ import annotations

from pathlib import Path

from pipeline.config import ConfigError
from pipeline.eval.evaluation import Evaluation
from pipeline.eval.job_errors import FinetuneError
from pipeline.eval.job_settings import Finetune
from pipeline.fields import check_model


def check(cfg: dict) -> None:
    try:
        check_model(Finetune, cfg)
    except ConfigError as e:
        raise FinetuneError(str(e)) from None
    ms = cfg["milestones"]
    if (
        not isinstance(ms, list)
        or ms != sorted(ms)
        or any(not isinstance(m, int) or not 0 < m < cfg["epochs"] for m in ms)
    ):
        raise FinetuneError(f"milestones={ms}: increasing epochs between 1 and epochs={cfg['epochs']} - 1")
    lr = cfg["lr_head"]
    if lr != "auto" and (isinstance(lr, bool) or not isinstance(lr, (int, float)) or lr <= 0):
        raise FinetuneError(f"lr_head={lr}: auto or a number > 0")
    scale = cfg["crop_scale"]
    if scale != "auto" and not (
        isinstance(scale, list)
        and len(scale) == 2
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in scale)
        and 0 < scale[0] <= scale[1] <= 1
    ):
        raise FinetuneError(f"crop_scale={scale}: auto or [lo, hi] with 0 < lo <= hi <= 1")
    if cfg["flip"] not in ("auto", True, False):
        raise FinetuneError(f"flip={cfg['flip']}: expected auto, true or false")
    if cfg["subset"] is not None and not Path(cfg["subset"]).is_file():
        raise FinetuneError(f"subset={cfg['subset']}: no such file")
    if not isinstance(cfg["data"], dict):
        raise FinetuneError(f"data={cfg['data']}: expected keys on top of the run's data (data.train=...)")


class FineTuning(Evaluation):
    """End-to-end fine-tuning on a labelled fraction, beside a random-init twin: jobs/finetune.py, `job: finetune`."""

    name = "finetune"

    config = "finetune"

    def check(self, cfg: dict) -> None:
        check(cfg)

    def run(self, cfg: dict) -> dict:
        from pipeline.eval import finetune_run  # the heavy part (torch, MLflow): kept off the bad-input path

        return finetune_run.run(cfg)
