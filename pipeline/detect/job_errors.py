"""The detection job's one-line error, raised by its checks (pipeline.detect.job) and by its run
(pipeline.detect.transfer): here, below both, so that the run imports no job module back."""

from __future__ import annotations

from pipeline.config import JobError


class DetectError(JobError):
    """Bad input or a run that cannot be transferred: one line for the user."""
