"""A sweep's settings (`sweep.*`, conf/sweep/) and every check that can run before a trial starts.

`compose_sweep(argv)` composes the command line with the sweep's size (its `sweep.sizes[sweep.size]` overrides
first, the command line's after them), `check_sweep(cfg)` then answers bad input in one `error:` line: an
unknown key in the space, an empty range, a value the config schema refuses, a metric the loop never reports,
a scheduler that cannot see its metric every epoch. The cluster's room for the concurrent trials is checked
once Ray is up (pipeline.tune.sweep).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from pydantic import ConfigDict

from pipeline.cluster import cluster_address
from pipeline.config import ConfigError, compose_config, config_hash
from pipeline.eval.probe.spec import ProbeSpec
from pipeline.fields import Checked, Choice, Int, Section, Str, bad, check_model
from pipeline.schema import validate
from pipeline.sections import Config
from pipeline.store import Store
from pipeline.tune.space import Dim, override, parse_space, reported_metrics, with_seeds

# Sections a trial may not vary: where the data lives and how the cluster and store are reached are the
# sweep's, shared by every trial (the data is made once, before the trials start).
FIXED_SECTIONS = ("data", "trainer", "paths", "tracking", "run", "sweep", "debug", "verbose")


class Sweep(Section):
    model_config = ConfigDict(extra="forbid", strict=True)  # a misspelt sweep key would silently do nothing

    name: Str()
    size: Str()
    sizes: dict[str, list[str]] = {}
    space: dict
    metric: Str()
    mode: Choice("min", "max")
    scheduler: Choice("asha", "fifo")
    stop_metric: Str(null=True) = None
    stop_mode: Choice("min", "max", null=True) = None
    grace_period: Int(1) = 1
    reduction_factor: Int(2) = 2
    num_samples: Int(1) = 1
    max_concurrent_trials: Int(1) = 1
    seed: Int(0) = 0
    # every configuration at seed=0..seeds-1 (grid spaces): each one's mean with its 95 % interval, and its paired
    # difference to the best (pipeline.tune.report.seeded_table)
    seeds: Int(1) = 1


class SweepConfig(Config):
    """A sweep's config: the base config every trial shares, and the sweep's settings."""

    sweep: Sweep


@dataclass(frozen=True)
class SweepSpec:
    """What the sweep's driver reads of its config (pipeline.tune.sweep, .results), typed and taken once after the
    checks: the trials themselves compose their own configs from the command line."""

    sweep: Sweep  # sweep.*
    name: str  # run.name: the sweep's identity (sweep_name)
    root: str  # paths.root
    runs: Path  # paths.runs: the table, the plot, the trials' logs
    storage: str  # trainer.storage: Tune's experiment
    trainer: Mapping[str, Any]  # the trainer section, as the cluster's checks (pipeline.train.resources) take it
    epochs: int  # train.epochs: ASHA's max_t
    verbose: bool
    epoch_metrics: frozenset[str]  # what a trial reports every epoch (reported_metrics)
    model: Mapping[str, Any]  # the backbone of the random-init baseline
    probe: ProbeSpec  # the baseline's probe, the trials' own
    store: Store  # tracking.*: the sweep's MLflow run and its trials' children
    config: dict[str, Any]  # the whole config, as the sweep's run records it (params, config.yaml, datasets, gallery)

    @classmethod
    def of(cls, c: Checked[SweepConfig]) -> SweepSpec:
        """The spec of a checked sweep config (check_sweep has passed) that names its sweep (sweep_name)."""
        t, cfg = c.typed, c.raw
        epoch, _ = reported_metrics(cfg["data"], cfg["eval"])
        return cls(
            sweep=t.sweep,
            name=str(t.run.name),
            root=t.paths.root,
            runs=Path(t.paths.runs),
            storage=t.trainer.storage,
            trainer=cfg["trainer"],
            epochs=t.train.epochs,
            verbose=t.verbose,
            epoch_metrics=frozenset(epoch),
            model=cfg["model"],
            probe=ProbeSpec.of(c),
            store=Store.of(cfg),
            config=cfg,
        )


def sweep_argv(argv: list[str]) -> list[str]:
    """The command line with the chosen size's overrides in front (a key the command line sets is left to it)."""
    first = compose_config(argv)
    sweep = first.get("sweep")
    if not isinstance(sweep, dict):
        raise ConfigError(f"no sweep chosen: add +sweep=<name> (conf/sweep/: {', '.join(available())})")
    size, sizes = sweep.get("size"), sweep.get("sizes") or {}
    if size not in sizes:
        raise bad("sweep.size", size, f"expected one of {', '.join(sorted(sizes)) or '(none defined)'}")
    given = {a.split("=", 1)[0].lstrip("+~") for a in argv}
    chosen = [o for o in sizes[size] if o.split("=", 1)[0].lstrip("+~") not in given]
    # the sweep preset first: the size's keys apply on top of it, the command line's on top of both
    presets = [a for a in argv if a.startswith("+sweep=")]
    return presets + chosen + [a for a in argv if not a.startswith("+sweep=")]


def available() -> list[str]:
    from pipeline.config import CONF_DIR

    return sorted(p.stem for p in (CONF_DIR / "sweep").glob("*.yaml"))


def compose_sweep(argv: list[str]) -> tuple[dict, list[str]]:
    """(config, argv): the composed config of the sweep at its size, and the command line that makes it (each
    trial composes this line plus its own values)."""
    full = sweep_argv(argv)
    return compose_config(full), full


def check_sweep(cfg: dict, argv: list[str]) -> list[Dim]:
    """Everything about the sweep that can be checked without Ray: its settings, the space's keys and values
    (each value composed and validated as a trial would be), the metrics. Returns the dimensions."""
    check_model(Sweep, cfg["sweep"], root="sweep")
    s = cfg["sweep"]
    dims = parse_space(s["space"])
    for d in dims:
        _check_key(cfg, d)
    validate(cfg)  # the base config, as every trial shares it
    for d in dims:
        for value in d.values:  # every grid or choice value, a range's two ends
            try:
                validate(compose_config(argv + [override(d.key, value)]))
            except ConfigError as e:
                raise ConfigError(f"sweep.space.{d.key}: the trial with {d.key}={value} is refused: {e}") from None
    sweep = Sweep.model_validate(s)
    dims = with_seeds(dims, sweep.seeds, sweep.num_samples, sweep.scheduler)
    _check_metrics(
        sweep, reported_metrics(cfg["data"], cfg["eval"]), cfg["eval"]["knn"]["every"], cfg["train"]["epochs"]
    )
    _check_local_room(cfg["trainer"], sweep.max_concurrent_trials)
    return dims


def _check_local_room(tr: Mapping[str, Any], n: int) -> None:
    """On a private local cluster (no trainer.address or $RAY_ADDRESS) the `n` concurrent trials' workers (`tr`: the
    trainer section) share this machine's cores; a joined cluster is checked once Ray is up
    (pipeline.tune.sweep._check_room)."""
    if cluster_address(tr) or tr.get("autoscale"):
        return
    cores = os.cpu_count() or 1
    need = n * tr["num_workers"] * tr["cpus_per_worker"]
    if need > cores:
        raise bad(
            "sweep.max_concurrent_trials",
            n,
            f"{n} trials x trainer.num_workers={tr['num_workers']} x "
            f"trainer.cpus_per_worker={tr['cpus_per_worker']} = {need:g} CPUs, more than this machine's "
            f"{cores} cores; expected at most "
            f"{max(1, int(cores // (tr['num_workers'] * tr['cpus_per_worker'])))}",
        )


def _check_key(cfg: dict, d: Dim) -> None:
    node, parts = cfg, d.key.split(".")
    for i, part in enumerate(parts):
        if not isinstance(node, dict) or part not in node:
            known = ", ".join(sorted(node)) if isinstance(node, dict) else "(not a mapping)"
            where = ".".join(parts[:i]) or "the config"
            raise ConfigError(f"sweep.space.{d.key}: unknown config key ({where} has: {known})")
        node = node[part]
    if isinstance(node, dict):
        raise ConfigError(
            f"sweep.space.{d.key}: a section, not a value; search one of its keys ({', '.join(sorted(node))})"
        )
    if parts[0] in FIXED_SECTIONS:
        raise ConfigError(
            f"sweep.space.{d.key}: {parts[0]}.* is shared by every trial of a sweep; set it on the command line instead"
        )


def _check_metrics(s: Sweep, reported: tuple[set[str], set[str]], knn_every: int, epochs: int) -> None:
    """The sweep's metric among what its runs report (`reported`: per epoch, final); ASHA's stop metric among the
    per-epoch ones (the kNN monitor every epoch: `knn_every`), its grace period within train.epochs (`epochs`)."""
    epoch, final = reported
    if s.metric not in epoch | final:
        raise bad(
            "sweep.metric",
            s.metric,
            f"a metric this sweep's runs never report; they report {', '.join(sorted(epoch | final))}",
        )
    if s.scheduler == "asha":
        stop = s.stop_metric
        if stop is None:
            raise ConfigError(
                "sweep.stop_metric is missing: ASHA compares the trials every epoch; name a per-epoch "
                f"metric ({', '.join(sorted(epoch))})"
            )
        if stop not in epoch:
            raise bad(
                "sweep.stop_metric",
                stop,
                f"not reported every epoch, which ASHA needs; expected one of "
                f"{', '.join(sorted(epoch))}"
                + (" (eval.knn.every=0 turns the kNN monitor off)" if not knn_every else ""),
            )
        if stop.startswith("knn_") and knn_every != 1:
            raise bad(
                "eval.knn.every",
                knn_every,
                f"ASHA stops trials on {stop}: expected 1 (the kNN monitor every epoch)",
            )
        if s.grace_period >= epochs:
            raise bad(
                "sweep.grace_period",
                s.grace_period,
                f"ASHA judges a trial after at least this many epochs "
                f"and before its last (train.epochs={epochs}), so it could stop none; expected "
                f"less than {epochs}, or sweep.scheduler=fifo",
            )
        if s.stop_mode is None:
            raise ConfigError(f"sweep.stop_mode is missing: min or max for sweep.stop_metric={stop}")


def sweep_name(c: Checked[SweepConfig]) -> str:
    """The sweep's identity: its name and a hash of what decides its trials (the base config, the evaluation
    that scores them, the sweep's settings; how many run at once too, as a restored Tune experiment keeps its
    own). Rerunning the command finds it again."""
    cfg = c.raw
    s = {k: v for k, v in cfg["sweep"].items() if k not in ("sizes", "size")}
    if s.get("seeds") == 1:  # the default, as before sweeps had seeds: an unseeded sweep keeps its name
        del s["seeds"]
    base = {k: v for k, v in cfg.items() if k != "sweep"}
    what = {"base": config_hash(base), "eval": cfg["eval"], "sweep": s}
    digest = hashlib.sha1(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:8]
    return f"sweep-{c.typed.sweep.name}-{digest}"


def trials_argv(setup: dict, trial_id: str, params: dict) -> list[str]:
    """A trial's command line: the sweep's, its values, its run name (the sweep's and the Tune trial id, which
    stays the same when the sweep is resumed), the driver's absolute root and store (a trial runs in a folder of
    Tune's, where a relative paths.root would point elsewhere) and nothing the parent logs once (the gallery)."""
    return (
        setup["argv"]
        + [override(k, v) for k, v in params.items()]
        + [
            f"run.name={setup['sweep_run']}-{trial_id}",
            f"paths.root={setup['root']}",
            f"tracking.uri={setup['tracking_uri']}",
            "gallery.at_pretrain=false",
        ]
    )
