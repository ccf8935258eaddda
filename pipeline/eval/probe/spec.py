"""What a linear probe reads of a job's config, typed, and taken once where a job hands it over: jobs/linear_probe.py
(pipeline.eval.probe.run), a pretraining run's own probe (pipeline.train.launch, .artifacts) and a sweep's
random-init baseline (pipeline.tune.results). The probe's functions (pipeline.eval.probe.compare) read nothing else."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Callable, Mapping

from pipeline.cluster import init_ray
from pipeline.fields import Checked
from pipeline.sections import Config, Data, Invariance, Probe


def _no_ray() -> None:
    """A spec made by hand (tests): the SGD probe's Ray Data then starts a default local Ray itself."""


@dataclass(frozen=True)
class ProbeSpec:
    probe: Probe  # eval.probe: the solver, the split sizes, the SGD schedule, the extraction actors
    data: Data  # the data probed: the run's own, or the probe's data=<option>
    # The backbone's and the recipe's settings, kept as the config has them: their keys belong to the backbone
    # registry and the recipe (each checks its own), and the features' cache folder is named by their hash.
    model: Mapping[str, Any]
    augment: Mapping[str, Any]  # image size and normalisation; the transformations FA and V redraw
    seed: int
    runs: Path  # paths.runs: the features' cache and the charts
    fa_m: int = 0  # eval.feature_averaging.m; 0: off
    invariance: Invariance | None = None  # eval.invariance when it is enabled
    autoscale: bool = False  # trainer.autoscale: extraction actors that do not fit yet ask the autoscaler
    start_ray: Callable[[], None] = _no_ray  # the job's Ray (a joined cluster or a private one), for the SGD probe

    @classmethod
    def of(cls, c: Checked[Config]) -> ProbeSpec:
        """The spec of a checked config (pipeline.schema.validate has passed: every section is there)."""
        t, inv = c.typed, c.typed.eval.invariance
        return cls(
            probe=t.eval.probe,
            data=t.data,
            model=c.raw["model"],
            augment=c.raw["augment"],
            seed=t.seed,
            runs=Path(t.paths.runs),
            fa_m=t.eval.feature_averaging.m,
            invariance=inv if inv.enabled else None,
            autoscale=t.trainer.autoscale,
            start_ray=partial(init_ray, c.raw["trainer"], t.verbose),
        )

    @property
    def targets(self) -> list[str] | None:
        return list(self.data.targets) if self.data.targets else None
