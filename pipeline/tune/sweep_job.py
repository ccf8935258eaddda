"""jobs/tune.py's entry: compose and check the sweep and make its data, light (no torch, Ray or MLflow until the
sweep is known good), then the sweep (pipeline.tune.sweep)."""

from __future__ import annotations

from pipeline.config import ConfigError, fail
from pipeline.fields import Checked
from pipeline.plan import RunPlan
from pipeline.train.prepare import resolve
from pipeline.train.run_lock import RunBusy
from pipeline.tune.settings import SweepConfig, SweepSpec, check_sweep, compose_sweep, sweep_name
from pipeline.tune.space import Dim


def prepare(argv: list[str]) -> tuple[SweepSpec, list[str], list[Dim], RunPlan]:
    """Compose and check the sweep, make its data; (the sweep's spec, its command line, dimensions, the base
    config's plan: each trial makes its own).
    ConfigError with one line on bad input, before Ray or MLflow is touched."""
    cfg, full = compose_sweep(argv)
    dims = check_sweep(cfg, full)
    cfg["run"]["name"] = sweep_name(Checked.of(SweepConfig, cfg))
    plan = resolve(cfg)  # validates again, makes the Spirograph data once for every trial, checks the shards
    return SweepSpec.of(Checked.of(SweepConfig, cfg)), full, dims, plan


def main(argv: list[str]) -> int:
    try:
        spec, full, dims, plan = prepare(argv)
        # heavy (MLflow, then Ray Tune for a sweep that runs): loaded once the sweep has passed its checks
        from pipeline.tune.sweep import run_sweep

        run_sweep(spec, full, dims, plan)
    except (ConfigError, RunBusy) as e:
        fail(str(e))
    return 0
