"""The sweeps of a reproduction: each `python jobs/tune.py +sweep=<name>` run (or read back) in this process, its
best trial against the paper's optimum."""

from __future__ import annotations

from pipeline.config import ConfigError, fail
from pipeline.reproduce.suites import PAPER_SWEEPS
from pipeline.train.run_lock import RunBusy
from pipeline.tune.sweep_job import prepare


def same_value(ours, paper, continuous: bool) -> bool:
    """A grid point equals the paper's; a value drawn from a range counts as the same within a factor of 1.5."""
    if isinstance(paper, list):
        return (
            isinstance(ours, list)
            and len(ours) == len(paper)
            and all(same_value(a, b, continuous) for a, b in zip(ours, paper))
        )
    if ours is None or paper is None:
        return ours is paper
    if continuous and ours > 0 and paper > 0:
        return 1 / 1.5 <= ours / paper <= 1.5
    return abs(float(ours) - float(paper)) <= 1e-9 * max(1.0, abs(float(paper)))


def run_sweep_for_report(name: str, args: list[str]) -> dict:
    """Run (or read back) `python jobs/tune.py +sweep=<name> *args`: its results and how they compare to the paper."""
    # mlflow and the sweep's run load here, not with the module: the job answers a bad command line before them
    from mlflow.tracking import MlflowClient

    from pipeline.tune.sweep import run_sweep

    argv = [f"+sweep={name}", *args]
    try:
        spec, full, dims, plan = prepare(argv)
        print(f"[reproductions] sweep {name}: {spec.name}", flush=True)
        out = run_sweep(spec, full, dims, plan)
    except (ConfigError, RunBusy) as e:
        fail(f"sweep {name}: {e}")
    run = MlflowClient(spec.store.uri).get_run(out["run_id"])
    if run.info.status != "FINISHED":
        fail(f"sweep {name} ended {run.info.status} (MLflow run {out['run_id']}); rerun to resume it")
    continuous = {d.key for d in dims if d.is_range}
    paper, where = PAPER_SWEEPS.get(name, ({}, "—"))
    best = out["best"] or {}
    agree = bool(best) and all(same_value(best["params"].get(k), v, k in continuous) for k, v in paper.items())
    return {
        **out,
        "name": name,
        "argv": argv,
        "metric": spec.sweep.metric,
        "mode": spec.sweep.mode,
        "minutes": run.data.metrics.get("sweep/minutes", float("nan")),
        "paper": paper,
        "where": where,
        "agree": agree,
    }
