"""The pretraining runs of a suite: each run's config composed and checked, trained (or, finished before at the same
config, its probe results read back from MLflow), with what the report and the downstream steps need of it."""

from __future__ import annotations

import time
from pathlib import Path

from pipeline.config import ConfigError, compose_config, fail
from pipeline.eval.results import probe_results
from pipeline.reproduce import ledger
from pipeline.store import Store
from pipeline.train.prepare import resolve, run_name
from pipeline.train.run_lock import RunBusy


def applicable(overrides: list[str], scale: list[str], extra: list[str]) -> list[str]:
    """The suite's extra keys that apply to a run of these overrides: plugin.<name>.* settings only to the runs
    that use that plug-in (+plugin.<name>.x=..., which adds a key, too)."""
    if not extra:  # nothing to sort: no config to compose
        return []
    plugins = compose_config([*overrides, *scale]).get("plugin") or {}
    keys = [e.lstrip("+~") for e in extra]
    return [e for e, k in zip(extra, keys) if not k.startswith("plugin.") or k.split(".")[1] in plugins]


def recorded(
    label: str,
    overrides: list[str],
    scale: list[str],
    extra: list[str],
    kept: Path | None,
    downstream: dict[str, list[str]] | None = None,
    baseline: bool = False,
    say: bool = True,
) -> dict | None:
    """The run as the ledger folder `kept` holds it, complete for `downstream` (with the random-init `baseline`),
    in run_one's form; None where it is not recorded so (or there is no ledger). Composes the config only: no data,
    store or torch's training. `say`: print that the run is reused."""
    if kept is None:
        return None
    try:
        extra = applicable(overrides, scale, extra)
        entry = ledger.find(kept, run_name(compose_config([*overrides, *scale, *extra])), downstream or {}, baseline)
    except ConfigError as e:
        fail(f"{label}: {e}")
    if entry is None:
        return None
    name = entry["run_name"]
    if say:
        print(f"[reproductions] {label}: run {name} recorded in {kept / name}.json; reusing its results", flush=True)
    out = ledger.as_result(kept, entry)
    out.update(run_name=name, label=label, overrides=overrides, scale=list(scale), extra=extra, store=[])
    return out


def run_one(
    label: str,
    overrides: list[str],
    scale: list[str],
    extra: list[str],
    kept: Path | None = None,
    downstream: dict[str, list[str]] | None = None,
    baseline: bool = False,
) -> dict:
    """One run of a suite: read from the ledger folder `kept` where it is recorded there complete for `downstream`
    (with the random-init `baseline`), else read back from MLflow where it finished, else trained."""
    # a run recorded in the ledger needs neither its data nor a store: looked up before resolve makes them
    found = recorded(label, overrides, scale, extra, kept, downstream, baseline)
    if found is not None:
        return found
    try:
        extra = applicable(overrides, scale, extra)
        cfg = compose_config([*overrides, *scale, *extra])
        plan = resolve(cfg)
    except ConfigError as e:
        fail(f"{label}: {e}")
    t0 = time.monotonic()
    name = cfg["run"]["name"]
    print(f"[reproductions] {label}: run {name}", flush=True)
    out = finished_run(Store.of(cfg), name)
    if out is None:
        # the run's heavy side (torch, MLflow, then Ray): loaded for a run that trains, not for bad input
        from pipeline.train.launch import pretrain

        try:
            out = pretrain(cfg, plan)
        except (ConfigError, RunBusy) as e:  # the cluster cannot hold it, or the same run is going elsewhere
            fail(f"{label}: {e}")
        out["minutes"] = (time.monotonic() - t0) / 60
    else:
        print(
            f"[reproductions] {label}: finished before as MLflow run {out['run_id']}; reusing its results", flush=True
        )
    out["run_name"] = cfg["run"]["name"]
    out["curves"] = Path(cfg["paths"]["runs"]) / "curves" / f"{cfg['run']['name']}.png"
    # what the ledger keeps of it: `python jobs/pretrain.py <overrides> <scale> <extra>` trains it again
    out["label"], out["overrides"], out["scale"], out["extra"] = label, overrides, list(scale), extra
    # the downstream jobs use the run's own store and folders
    out["store"] = [
        *(f"paths.{k}={v}" for k, v in cfg["paths"].items()),
        *(
            f"tracking.{k}={'null' if v is None else v}"
            for k, v in cfg["tracking"].items()
            if k in ("uri", "experiment")
        ),
    ]
    return out


def finished_run(store: Store, name: str) -> dict | None:
    """The results of the FINISHED, probed run `name` (a configuration's hash) in `store`, read back from its MLflow
    metrics, or None (not run, not finished, or never probed: run it again)."""
    # pipeline.tracking loads mlflow: here, not with the module, so the job answers a bad command line before it
    from pipeline import tracking

    found = tracking.find_run(tracking.setup(store), name)
    if found is None or found.info.status != "FINISHED":
        return None
    probe = probe_results(found.data.metrics)
    if not probe:
        return None
    return {
        "run_id": found.info.run_id,
        "probe": probe,
        "minutes": found.data.metrics.get("train/minutes", float("nan")),
    }
