"""jobs/finetune.py: check the settings (one line, before MLflow or torch's work), draw or read the labelled
subset, fine-tune the run's backbone and a random-init twin on it, log both into a child run of the run. Here: what
its typed keys (pipeline.eval.job_settings) do not say alone; the run is pipeline.eval.finetune_run."""

from __future__ import annotations

from pathlib import Path

from pipeline.eval.evaluation import Evaluation, Job
from pipeline.eval.job_errors import FinetuneError
from pipeline.eval.job_settings import Finetune


class FineTuning(Evaluation[Finetune]):
    """End-to-end fine-tuning on a labelled fraction, beside a random-init twin: jobs/finetune.py, `job: finetune`."""

    name = "finetune"

    config = "finetune"
    Settings = Finetune
    Error = FinetuneError

    def check(self, job: Job[Finetune]) -> None:
        f = job.own
        ms = f.milestones
        if (
            not isinstance(ms, list)
            or ms != sorted(ms)
            or any(not isinstance(m, int) or not 0 < m < f.epochs for m in ms)
        ):
            raise FinetuneError(f"milestones={ms}: increasing epochs between 1 and epochs={f.epochs} - 1")
        lr = f.lr_head
        if lr != "auto" and (isinstance(lr, bool) or not isinstance(lr, (int, float)) or lr <= 0):
            raise FinetuneError(f"lr_head={lr}: auto or a number > 0")
        scale = f.crop_scale
        if scale != "auto" and not (
            isinstance(scale, list)
            and len(scale) == 2
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in scale)
            and 0 < scale[0] <= scale[1] <= 1
        ):
            raise FinetuneError(f"crop_scale={scale}: auto or [lo, hi] with 0 < lo <= hi <= 1")
        if f.flip not in ("auto", True, False):
            raise FinetuneError(f"flip={f.flip}: expected auto, true or false")
        if f.subset is not None and not Path(f.subset).is_file():
            raise FinetuneError(f"subset={f.subset}: no such file")

    def run(self, job: Job[Finetune]) -> dict:
        from pipeline.eval import finetune_run  # the heavy part (torch, MLflow): kept off the bad-input path

        return finetune_run.run(job)
