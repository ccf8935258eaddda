"""What a downstream evaluation is, to its own job (jobs/<name>.py) and to a suite (jobs/evaluate.py): a config of
its own, typed once into a `Job` whose making answers bad input in one line before anything runs, and a run that
evaluates a pretraining run into a child MLflow run and returns each backbone's results. The project's own are
registered in pipeline/eval/__init__.py; an installed package adds its own under the `augssl.evaluations` entry-point
group (docs/extending.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Generic, Mapping, TypeVar

from pipeline.config import ConfigError, JobError, cli, compose_config, fail
from pipeline.cores import limit_torch_threads
from pipeline.fields import Checked, Section
from pipeline.store import Store

T = TypeVar("T")


@dataclass(frozen=True)
class Job(Generic[T]):
    """One evaluation's settings, typed: its own keys (`own`) and what every evaluation's config has, which a suite
    sets for every step."""

    own: T  # the evaluation's own keys: its `Settings`, validated
    source: str  # `run`: the pretraining run, an MLflow run id, a checkpoint folder or a state.pt
    store: Store  # tracking.* and paths.runs: where the child run goes, and where a run id is looked up
    data_root: Path  # paths.data: data an evaluation makes (the detection shapes)
    verbose: bool = False
    # data.*: keys on top of the run's own data (data.train=<shards elsewhere>); nulls dropped
    data: Mapping[str, Any] = field(default_factory=dict)
    trainer: Mapping[str, Any] = field(default_factory=dict)  # the Ray cluster it joins or starts (trainer.*)

    @property
    def runs(self) -> Path:
        """paths.runs, the store's folder: the evaluation's own outputs (charts, caches)."""
        return Path(self.store.runs)

    @classmethod
    def of(cls, c: Checked[Section], own: T, source: str | None = None) -> Job[T]:
        """The job of a checked config (its evaluation's model, or the training config's for the probe); `source`
        where the config's `run` is not the pretraining run (the probe's `run` is the training config's section).
        JobError with one line for a `data` that is no mapping."""
        cfg = c.raw
        data = cfg.get("data")
        if data is not None and not isinstance(data, dict):
            raise JobError(f"data={data}: expected keys on top of the run's data (data.train=...)")
        return cls(
            own=own,
            source=str(cfg["run"]) if source is None else source,
            store=Store.of(cfg),
            data_root=Path(cfg["paths"]["data"]),
            verbose=bool(cfg.get("verbose")),
            data={k: v for k, v in (data or {}).items() if v is not None},
            trainer=cfg.get("trainer") or {},
        )


class Evaluation(Generic[T]):
    """One evaluation of one pretraining run. An instance serves one command line (compose, type, run).

    The usual evaluation declares `Settings` (its own keys, a pipeline.fields.Section), may add `check` (what the
    fields alone do not say), and writes `run`; one whose config is another's (the probe takes the training config)
    overrides `job`."""

    config: ClassVar[str]  # its Hydra config: conf/<config>.yaml, or a package's conf/ on Hydra's search path
    Settings: ClassVar[type[Section]] = Section
    Error: ClassVar[type[JobError]] = JobError  # its one-line errors

    def overrides(self, argv: list[str]) -> list[str]:
        """The config overrides among the command line's arguments (all of them, unless the evaluation takes one
        of its own, as the probe's `run=`)."""
        return argv

    def compose(self, argv: list[str]) -> dict:
        """The config of this command line (ConfigError with one line for a bad override)."""
        return compose_config(self.overrides(argv), self.config)

    def job(self, cfg: dict) -> Job[T]:
        """The composed config as this evaluation's typed Job: every key it reads, checked (its `Settings`, then
        `check`), bad input a JobError with one line. The one place an evaluation reads its config; it runs before
        anything is logged or started (a suite makes every step's Job before its first step runs)."""
        try:
            c = Checked.of(self.Settings, cfg)
            job: Job[Any] = Job.of(c, c.typed)
        except (ConfigError, JobError) as e:
            raise self.Error(str(e)) from None
        self.check(job)
        return job

    def check(self, job: Job[T]) -> None:
        """What the typed keys alone do not say (relations, files that must exist): `Error` with one line."""

    def run(self, job: Job[T]) -> dict:
        """Evaluate and log; returns {backbone label ("pretrained", "random", ...): {metric: value}}."""
        raise NotImplementedError

    def main(self, argv: list[str], description: str) -> int:
        """The job's command line: --help, then compose, type and run, bad input as one `error:` line."""
        cfg = self.cli(argv, description)
        try:
            job = self.job(cfg)
            limit_torch_threads()  # on a shared machine (AUGSSL_CORES), once the config is known good
            self.run(job)
        except JobError as e:
            fail(str(e))
        return 0

    def cli(self, argv: list[str], description: str) -> dict:
        return cli(self.overrides(argv), description, config_name=self.config)
