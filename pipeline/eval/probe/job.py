"""jobs/linear_probe.py: the probe of a pretraining run's backbone beside a random-init twin, with the run's model,
data and image size and the command line's eval.* on top, logged into a child run of the run. A probe that
finished before with the same settings prints its results and probes nothing. Here: its settings and checks; the
run is pipeline.eval.probe.run."""

from __future__ import annotations

from pipeline.config import ConfigError
from pipeline.eval.evaluation import Evaluation, Job
from pipeline.eval.job_errors import ProbeError
from pipeline.eval.job_settings import ProbeRequest
from pipeline.fields import Checked
from pipeline.sections import Config


def split_run(argv: list[str]) -> tuple[str | None, list[str]]:
    """`run=<ref>` taken off the command line (the config's `run` is a section: run.name=...)."""
    refs = [a.split("=", 1)[1] for a in argv if a.startswith("run=")]
    return (refs[-1] if refs else None), [a for a in argv if not a.startswith("run=")]


class LinearProbe(Evaluation[ProbeRequest]):
    """A linear head on frozen features, beside a random-init twin: jobs/linear_probe.py, a suite's `job:
    linear_probe`. Its config is the training config (the run's own sections, the command line's eval.* and data.*
    on top, merged when it runs); `run=<ref>` names the pretraining run (the config's `run` is a section)."""

    name = "linear_probe"

    config = "config"
    Error = ProbeError

    def __init__(self) -> None:
        self.ref: str | None = None
        self.argv: list[str] = []

    def overrides(self, argv: list[str]) -> list[str]:
        self.ref, self.argv = split_run(argv)
        return self.argv

    def job(self, cfg: dict) -> Job[ProbeRequest]:
        try:
            c = Checked.of(Config, cfg)  # the typed keys; the run's own sections are merged in when it runs
        except ConfigError as e:
            raise ProbeError(str(e)) from None
        ref = self.ref or c.typed.eval.probe.checkpoint
        if not ref:
            raise ProbeError("run=<MLflow run id, checkpoint folder or state.pt> is required")
        return Job.of(c, ProbeRequest(cfg, tuple(self.argv)), source=str(ref))

    def run(self, job: Job[ProbeRequest]) -> dict:
        from pipeline.eval.probe import (
            run as probe_run,  # the heavy part (torch, Ray, MLflow): kept off the bad-input path
        )

        return probe_run.run(job)
