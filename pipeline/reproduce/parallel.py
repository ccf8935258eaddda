"""The reproductions' pretraining runs side by side: every (arm, seed) not finished yet is one Ray Tune trial on the
cluster there is (a private local one, or trainer.address / $RAY_ADDRESS), `concurrent` at a time (2 on this
machine's two cores, 64 on a cluster of 64 GPUs). A trial trains the run of its own config under the name
jobs/pretrain.py gives that config (its hash), so a finished run is never trained again, and one interrupted with
the driver (killed, Ctrl-C) resumes from its last checkpoint when the same command runs again. With a ledger
(pipeline.reproduce.ledger), a trial then runs its run's downstream steps and records the run there. The job then
reads every run's results back from the ledger or MLflow (pipeline.reproduce.runs.run_one)."""

from __future__ import annotations

import contextlib
import hashlib
from pathlib import Path

import ray.data
import ray.tune
import torch

from pipeline.cluster import init_ray
from pipeline.config import ConfigError, compose_config, fail
from pipeline.cores import cores
from pipeline.reproduce import ledger
from pipeline.reproduce.downstream import run_downstream
from pipeline.reproduce.runs import applicable, finished_run, run_one
from pipeline.store import Store
from pipeline.tracking import tracking_uri
from pipeline.train.launch import pretrain
from pipeline.train.prepare import resolve, run_name


def _log(msg: str) -> None:
    print(f"[reproductions] {msg}", flush=True)


def train_all(
    jobs: list[tuple[str, list[str], list[str], list[str], bool]],
    concurrent: int,
    kept: Path | None = None,
    downstream: dict[str, list[str]] | None = None,
    time_budget_s: float | None = None,
) -> None:
    """Train the runs of `jobs` (label, overrides, scale, extra, whether it carries the suite's random-init
    baseline) that have not finished, and are not recorded complete in the ledger folder `kept`, `concurrent` at a
    time. With a ledger, each trial also runs its run's `downstream` steps and records it there, so that those
    steps run side by side too and a killed driver loses no finished run. Fails with one line naming every run whose
    trial failed (their logs beside them). `time_budget_s`: Tune stops every trial then (stop_after_minutes); a
    stopped run resumes from its last checkpoint when it is trained again."""
    todo: list[tuple[str, list[str], list[str], list[str], bool]] = []
    names: set[str] = set()
    first: dict = {}  # the first run to train's config: where the logs go, the workers per run
    for label, overrides, scale, extra, baseline in jobs:
        argv = [*overrides, *scale, *applicable(overrides, scale, extra)]
        cfg = compose_config(argv)
        try:
            if kept is not None and ledger.find(kept, run_name(cfg), downstream or {}, baseline) is not None:
                continue  # done on another machine: neither its data nor its store is needed here
            resolve(cfg)  # checked before anything trains; names the run (its config's hash, once completed)
        except ConfigError as e:
            fail(f"{label}: {e}")
        name = cfg["run"]["name"]
        if name in names:  # suites share runs (one MoCo v2 baseline), and keys outside the hash (eval.*) do not count
            continue
        names.add(name)
        if finished_run(Store.of(cfg), name) is None:
            # a trial runs in a folder of Tune's: the driver's absolute root and store, not a relative one
            where = [f"paths.root={cfg['paths']['root']}", f"tracking.uri={tracking_uri(Store.of(cfg))}"]
            todo.append((label, overrides, [*scale, *where], extra, baseline))
            first = first or cfg
    if not todo:
        return
    cfg = first
    init_ray(cfg["trainer"], bool(cfg.get("verbose")), trials=concurrent)
    workers = cfg["trainer"]["num_workers"]
    threads = max(1, cores() // (min(concurrent, len(todo)) * workers))
    logs = Path(cfg["paths"]["runs"]) / "reproductions"
    name = "reproductions-" + hashlib.sha1(repr(todo).encode()).hexdigest()[:10]
    _log(f"{len(todo)} run(s) to train, {concurrent} at a time as Ray Tune trials ({name}); their logs in {logs}")
    setup = {"jobs": todo, "threads": threads, "logs": str(logs), "kept": kept, "downstream": downstream or {}}
    # A trial only drives its Train run (the workers hold the CPUs): a token of CPU so Tune can place it, on the
    # head beside this driver (its store and data are there; a lost worker node takes only Train workers)
    trainable = ray.tune.with_resources(
        ray.tune.with_parameters(train_job, setup=setup), {"cpu": 0.01, "node:__internal_head__": 0.01}
    )
    tuner = ray.tune.Tuner(
        trainable,
        param_space={"job": ray.tune.grid_search(list(range(len(todo))))},
        tune_config=ray.tune.TuneConfig(max_concurrent_trials=concurrent, time_budget_s=time_budget_s),
        run_config=ray.tune.RunConfig(name=name, storage_path=cfg["trainer"]["storage"], verbose=0),
    )
    results = tuner.fit()
    failed = []
    for i in range(len(results)):
        r = results[i]
        if r.error is not None:
            lines = str(r.error).strip().splitlines() or [type(r.error).__name__]
            failed.append(f"{todo[int((r.config or {})['job'])][0]} ({lines[-1][:200]})")
    if failed:
        fail(f"{len(failed)} run(s) failed: {'; '.join(failed)}; their logs are in {logs}")


def train_job(params: dict, setup: dict) -> None:
    """One trial: compose the run's config, check it, train and probe it (resuming its checkpoint), and with a
    ledger run its downstream steps and record it; its output in <paths.runs>/reproductions/<run name>.log."""
    label, overrides, scale, extra, baseline = setup["jobs"][params["job"]]
    argv = [*overrides, *scale, *applicable(overrides, scale, extra)]
    torch.set_num_threads(setup["threads"])  # the probe runs here, beside the other trials' workers
    cfg = compose_config(argv)
    # Ray Data's bars would come from this trial's workers to the driver's console: its log says enough
    ray.data.DataContext.get_current().enable_progress_bars = bool(cfg.get("verbose"))
    if cfg["trainer"]["torch_threads"] is None:  # concurrent runs share the cores instead of oversubscribing them
        cfg["trainer"]["torch_threads"] = setup["threads"]
    plan = resolve(cfg)
    log = Path(setup["logs"]) / f"{cfg['run']['name']}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as f, contextlib.redirect_stdout(f), contextlib.redirect_stderr(f):
        print(f"[reproductions] {label}: python jobs/pretrain.py {' '.join(argv)}", flush=True)
        pretrain(cfg, plan)
        kept, downstream = setup["kept"], setup["downstream"]
        if kept is not None:
            run = run_one(label, overrides, scale, extra)  # read back from MLflow, as the report reads it
            run_downstream(
                [run], downstream, random_baseline=baseline, done=lambda r: ledger.record(kept, r, downstream)
            )
    ray.tune.report({"done": 1})
