"""jobs/tune.py's entry: compose and check the sweep and make its data, light (no torch, Ray or MLflow until the
sweep is known good), then the sweep (pipeline.tune.sweep)."""

from __future__ import annotations

from pipeline.config import ConfigError, fail
from pipeline.plan import RunPlan
from pipeline.train.prepare import resolve
from pipeline.train.run_lock import RunBusy
from pipeline.tune.settings import check_sweep, compose_sweep, sweep_name
from pipeline.tune.space import Dim


def prepare(argv: list[str]) -> tuple[dict, list[str], list[Dim], RunPlan]:
    """Compose and check the sweep, make its data; (base config, the sweep's command line, dimensions, the base
    config's plan: each trial makes its own).
    ConfigError with one line on bad input, before Ray or MLflow is touched."""
    cfg, full = compose_sweep(argv)
    dims = check_sweep(cfg, full)
    cfg["run"]["name"] = sweep_name(cfg)
    plan = resolve(cfg)  # validates again, makes the Spirograph data once for every trial, checks the shards
    return cfg, full, dims, plan


def main(argv: list[str]) -> int:
    try:
        cfg, full, dims, plan = prepare(argv)
        # heavy (MLflow, then Ray Tune for a sweep that runs): loaded once the sweep has passed its checks
        from pipeline.tune.sweep import run_sweep

        run_sweep(cfg, full, dims, plan)
    except (ConfigError, RunBusy) as e:
        fail(str(e))
    return 0
