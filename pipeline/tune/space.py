"""A sweep's search space: `sweep.space` maps config keys to a search spec, parsed here into dimensions.

    plugin.invclr.lam: {grid: [0, 1.0e-4, 1.0e-3, 1.0e-2], log: true}
    plugin.co2.alpha: {choice: [1, 10, 20]}
    method.temperature: {uniform: [0.05, 0.5]}
    optim.base_lr: {loguniform: [0.01, 1.0]}

`log` (optional; true for loguniform) puts the key on a log axis in the sweep's plot. Everything here is pure:
no Ray, no torch; `to_tune` builds Ray Tune's search objects when the sweep starts.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Mapping

from pipeline.config import ConfigError
from pipeline.fields import show

KINDS = ("grid", "choice", "uniform", "loguniform")


@dataclass(frozen=True)
class Dim:
    """One searched key: a grid or choice over `values`, or a range `values = (lo, hi)`."""

    key: str
    kind: str
    values: tuple
    log: bool

    @property
    def is_range(self) -> bool:
        return self.kind in ("uniform", "loguniform")

    def describe(self) -> str:
        return f"{self.kind} {json.dumps(list(self.values))}" + (
            " (log)" if self.log and self.kind != "loguniform" else ""
        )


def parse_space(space: Any) -> list[Dim]:
    """`sweep.space` as dimensions, in the order given; ConfigError (one line naming the key) on a bad spec."""
    if not isinstance(space, dict) or not space:
        raise ConfigError(
            f"sweep.space={show(space)}: expected a mapping of config keys to a search spec "
            f"({{grid: [...]}}, {{choice: [...]}}, {{uniform: [lo, hi]}}, {{loguniform: [lo, hi]}})"
        )
    return [_dim(str(key), spec) for key, spec in space.items()]


def _dim(key: str, spec: Any) -> Dim:
    where = f"sweep.space.{key}"
    if isinstance(spec, dict):  # a kind set to null is left out: `{grid: null, uniform: [lo, hi]}` on the command
        spec = {k: v for k, v in spec.items() if v is not None}  # line switches a key's kind (Hydra merges dicts)
    kinds = [k for k in KINDS if isinstance(spec, dict) and k in spec]
    extra = sorted(set(spec) - set(KINDS) - {"log"}) if isinstance(spec, dict) else []
    if len(kinds) != 1 or extra:
        raise ConfigError(
            f"{where}={show(spec)}: expected exactly one of {', '.join(KINDS)} (and optionally "
            f"log: true), e.g. {{grid: [0.1, 1.0]}}"
        )
    kind = kinds[0]
    values, log = spec[kind], spec.get("log", kind == "loguniform")
    if not isinstance(log, bool):
        raise ConfigError(f"{where}.log={show(log)}: expected true or false")
    if not isinstance(values, list) or not values:
        raise ConfigError(f"{where}.{kind}={show(values)}: an empty search range; expected a non-empty list")
    if kind in ("uniform", "loguniform"):
        if len(values) != 2 or not all(_is_number(v) for v in values):
            raise ConfigError(f"{where}.{kind}={show(values)}: expected [lo, hi], two numbers")
        lo, hi = (float(v) for v in values)
        if not lo < hi:
            raise ConfigError(f"{where}.{kind}={show(values)}: an empty search range; expected lo < hi")
        if kind == "loguniform" and lo <= 0:
            raise ConfigError(f"{where}.loguniform={show(values)}: expected 0 < lo < hi (a log scale)")
        return Dim(key, kind, (lo, hi), log)
    if len({json.dumps(v, sort_keys=True) for v in values}) != len(values):
        raise ConfigError(f"{where}.{kind}={show(values)}: a value appears twice")
    if log and not all(_is_number(v) and v >= 0 for v in values):
        raise ConfigError(f"{where}.log=true: expected numbers >= 0 in {kind}={show(values)}")
    return Dim(key, kind, tuple(values), log)


SEED = "seed"  # the config key sweep.seeds crosses the space with


def with_seeds(dims: list[Dim], seeds: int, num_samples: int, scheduler: str = "fifo") -> list[Dim]:
    """The space crossed with seed=0..seeds-1 (sweep.seeds), so that every configuration trains under the same
    seeds and the report can give each its mean and interval. ConfigError where that cannot hold: a random key (a
    draw would differ from seed to seed), repeated samples, the seed searched by hand as well, or ASHA (it stops
    the weak seeds, so a configuration's mean would be over its lucky ones)."""
    if seeds == 1:
        return dims
    if scheduler != "fifo":
        raise ConfigError(
            f"sweep.scheduler={scheduler} with sweep.seeds={seeds}: expected fifo (ASHA stops a configuration's weak "
            f"seeds, and its mean would be over the lucky ones)"
        )
    if any(d.key == SEED for d in dims):
        raise ConfigError(f"sweep.space.{SEED} and sweep.seeds={seeds} both set: keep sweep.seeds (it groups seeds)")
    drawn = [d for d in dims if d.kind != "grid"]
    if drawn:
        raise ConfigError(
            f"sweep.seeds={seeds}: sweep.space.{drawn[0].key} is a {drawn[0].kind}, drawn anew for every trial; "
            f"with seeds every searched key must be a grid, so that each seed trains the same values"
        )
    if num_samples != 1:
        raise ConfigError(f"sweep.num_samples={num_samples} with sweep.seeds={seeds}: expected 1 (the seeds repeat)")
    return [*dims, Dim(SEED, "grid", tuple(range(seeds)), False)]


def searched(dims: list[Dim]) -> list[Dim]:
    """The dimensions a person chose to search: all but sweep.seeds' seed."""
    return [d for d in dims if d.key != SEED]


def num_trials(dims: list[Dim], num_samples: int) -> int:
    """How many trials Tune makes: the grid's product, times num_samples (each sample draws the other keys)."""
    grid = math.prod(len(d.values) for d in dims if d.kind == "grid")
    return grid * num_samples


def to_tune(dims: list[Dim]) -> dict:
    """Ray Tune's param_space: the config keys, flat, to Tune's search objects."""
    from ray import tune

    make = {
        "grid": lambda v: tune.grid_search(list(v)),
        "choice": lambda v: tune.choice(list(v)),
        "uniform": lambda v: tune.uniform(*v),
        "loguniform": lambda v: tune.loguniform(*v),
    }
    return {d.key: make[d.kind](d.values) for d in dims}


def override(key: str, value: Any) -> str:
    """A sampled value as a Hydra command-line override (`key=value`), the way a user would type it."""
    return f"{key}={_literal(value)}"


def _literal(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_literal(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{_literal(v)}" for k, v in value.items()) + "}"
    return str(value)


def short(params: dict) -> str:
    """A trial's values in a few characters: `lam=0.001, alpha=10` (the last part of each key)."""
    return ", ".join(f"{k.split('.')[-1]}={_fmt(v)}" for k, v in params.items())


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_fmt(x) for x in v) + "]"
    return str(v)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


# ----------------------------------------------------------------------------- what the loop reports


def reported_metrics(data: Mapping[str, Any], ev: Mapping[str, Any]) -> tuple[set[str], set[str]]:
    """(per-epoch, final) metric names a pretraining run reports, given its data and eval sections: per epoch the
    loss, speed and (when eval.knn.every > 0) the kNN monitor; at the end the linear probe of the pretrained backbone
    (when eval.probe.after_pretrain), with feature averaging and invariance when those are on."""
    regression = data.get("task") == "regression"
    targets = list(data.get("targets") or [])
    epoch = {"epoch_loss", "epoch_images_per_s"}
    if ev["knn"]["every"]:
        epoch |= {"knn_r2", *(f"knn_r2_{t}" for t in targets)} if regression else {"knn_top1"}
    final: set[str] = set()
    if ev["probe"]["after_pretrain"]:
        scores = {"mse", "r2", *(f"{s}_{t}" for s in ("mse", "r2") for t in targets)} if regression else {"top1"}
        kinds = ["pretrained"] + (["pretrained_fa"] if (ev.get("feature_averaging") or {}).get("m") else [])
        final |= {f"probe_{k}_{s}" for k in kinds for s in scores}
        if (ev.get("invariance") or {}).get("enabled"):
            final |= {"invariance_pretrained_conditional_variance", "invariance_pretrained_alpha_mse"}
    return epoch, final
