"""The evaluation jobs' one-line errors, raised by their checks (knn_job, probe_job, finetune_job) and by their runs
(knn_run, probe_run, finetune_run): here, below both, so that a run imports no job module back."""

from __future__ import annotations

from pipeline.config import JobError


class KnnError(JobError):
    """Bad input or a run that cannot be evaluated: one line for the user."""


class ProbeError(JobError):
    """Bad input or a run that cannot be probed: one line for the user."""


class FinetuneError(JobError):
    """Bad input or a run that cannot be fine-tuned: one line for the user."""
