"""What a downstream evaluation is, to its own job (jobs/<name>.py) and to a suite (jobs/evaluate.py): a config of
its own, checks that answer bad input in one line before anything runs, and a run that evaluates a pretraining run
into a child MLflow run and returns each backbone's results. The project's own are registered in
pipeline/eval/__init__.py; an installed package adds its own under the `augssl.evaluations` entry-point group
(docs/extending.md)."""

from __future__ import annotations

from typing import ClassVar

from pipeline.config import JobError, cli, compose_config, fail


class Evaluation:
    """One evaluation of one pretraining run. An instance serves one command line (compose, check, run)."""

    config: ClassVar[str]  # its Hydra config: conf/<config>.yaml, or a package's conf/ on Hydra's search path

    def overrides(self, argv: list[str]) -> list[str]:
        """The config overrides among the command line's arguments (all of them, unless the evaluation takes one
        of its own, as the probe's `run=`)."""
        return argv

    def compose(self, argv: list[str]) -> dict:
        """The config of this command line (ConfigError with one line for a bad override)."""
        return compose_config(self.overrides(argv), self.config)

    def check(self, cfg: dict) -> None:
        """Bad settings: JobError with one line. Runs before anything is logged or started."""

    def run(self, cfg: dict) -> dict:
        """Evaluate and log; returns {backbone label ("pretrained", "random", ...): {metric: value}}."""
        raise NotImplementedError

    def main(self, argv: list[str], description: str) -> int:
        """The job's command line: --help, then compose, check and run, bad input as one `error:` line."""
        cfg = self.cli(argv, description)
        try:
            self.check(cfg)
            self.run(cfg)
        except JobError as e:
            fail(str(e))
        return 0

    def cli(self, argv: list[str], description: str) -> dict:
        return cli(self.overrides(argv), description, config_name=self.config)
