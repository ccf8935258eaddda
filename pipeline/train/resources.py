"""Can the cluster hold the Ray Train workers asked for? Checked after Ray is up and before an MLflow run is made.

Ray Train waits silently forever for a worker group a fixed cluster can never place (2 workers x 1 GPU on a
one-GPU machine hangs with no message). A fixed cluster that cannot hold them fails in one line, within seconds;
an autoscaling cluster (`trainer.autoscale=true`) is given `trainer.resource_wait_s` to grow, with a line every
so often saying what it waits for.
"""

from __future__ import annotations

import math
import os
import time
from typing import Callable, Iterable, Mapping, Sequence

from pipeline.config import ConfigError


def cluster_address(trainer: Mapping) -> str | None:
    """The cluster a job joins (trainer.address, else $RAY_ADDRESS, which `ray job submit` sets), or None for a
    private local cluster of its own."""
    return trainer.get("address") or os.environ.get("RAY_ADDRESS") or None


def worker_bundle(trainer: Mapping) -> dict[str, float]:
    """What one Ray Train worker asks for (the same dict build_trainer hands to ScalingConfig)."""
    bundle = {"CPU": float(trainer["cpus_per_worker"])}
    if trainer["use_gpu"]:
        bundle["GPU"] = float(trainer["gpus_per_worker"])
    return bundle


def workers_that_fit(nodes: Iterable[Mapping[str, float]], bundle: Mapping[str, float]) -> int:
    """How many workers of `bundle` the nodes' total resources can place (a worker lives on one node)."""
    total = 0
    for res in nodes:
        per_node = [math.floor(res.get(name, 0.0) / amount + 1e-9) for name, amount in bundle.items() if amount > 0]
        total += min(per_node) if per_node else 0
    return total


def describe(bundle: Mapping[str, float]) -> str:
    return " + ".join(f"{_num(v)} {k}" for k, v in bundle.items())


def _num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else f"{v:g}"


def cluster_summary(nodes: Sequence[Mapping[str, float]]) -> str:
    cpus = sum(n.get("CPU", 0.0) for n in nodes)
    gpus = sum(n.get("GPU", 0.0) for n in nodes)
    return f"{len(nodes)} node{'s' if len(nodes) != 1 else ''} with {_num(cpus)} CPU, {_num(gpus)} GPU in all"


def alive_nodes() -> list[dict[str, float]]:
    import ray

    return [dict(n["Resources"]) for n in ray.nodes() if n.get("Alive")]


def check_resources(
    trainer: Mapping,
    nodes: Callable[[], list[dict[str, float]]] = alive_nodes,
    sleep: Callable[[float], None] = time.sleep,
    log: Callable[[str], None] = print,
    poll_s: float = 10.0,
    trials: int = 1,
) -> None:
    """ConfigError (one line: what was asked, what the cluster has) when the workers cannot be placed; on an
    autoscaling cluster, wait up to trainer.resource_wait_s for them first. `trials`: a sweep's concurrent
    Train runs, each with the same workers."""
    want, bundle = int(trainer["num_workers"]) * trials, worker_bundle(trainer)
    asked = f"trainer.num_workers={trainer['num_workers']} x ({describe(bundle)})" + (
        f" for each of sweep.max_concurrent_trials={trials} trials" if trials > 1 else ""
    )
    have = nodes()
    if workers_that_fit(have, bundle) >= want:
        return
    if trainer.get("autoscale"):
        deadline = time.monotonic() + float(trainer.get("resource_wait_s", 1800))
        last_said = -math.inf
        while time.monotonic() < deadline:
            if time.monotonic() - last_said >= 60:
                log(f"waiting for the autoscaler: {asked}; the cluster has {cluster_summary(have)}")
                last_said = time.monotonic()
            sleep(poll_s)
            have = nodes()
            if workers_that_fit(have, bundle) >= want:
                return
        raise ConfigError(
            f"{asked} still cannot be placed after trainer.resource_wait_s="
            f"{trainer.get('resource_wait_s')}: the cluster has {cluster_summary(have)}"
        )
    fit = workers_that_fit(have, bundle)
    hint = (
        "set trainer.use_gpu=false or fewer trainer.num_workers"
        if bundle.get("GPU")
        else "lower trainer.num_workers or trainer.cpus_per_worker"
    )
    if trials > 1:
        hint = "lower sweep.max_concurrent_trials, " + hint
    raise ConfigError(
        f"{asked} does not fit: the cluster has {cluster_summary(have)}, room for {fit} "
        f"such worker{'s' if fit != 1 else ''}; {hint} (or trainer.autoscale=true on an autoscaling "
        f"cluster)"
    )
