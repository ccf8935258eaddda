"""Can the cluster hold the Ray Train workers asked for? Checked after Ray is up and before an MLflow run is made.

Ray Train waits silently forever for a worker group a fixed cluster can never place (2 workers x 1 GPU on a
one-GPU machine hangs with no message). A fixed cluster that cannot hold them fails in one line, within seconds;
an autoscaling cluster (`trainer.autoscale=true`) is given `trainer.resource_wait_s` to grow, with a line every
so often saying what it waits for.
"""

from __future__ import annotations

import math
import time
from typing import Callable, Mapping

from pipeline.cluster import alive_nodes, cluster_summary, describe, workers_that_fit
from pipeline.config import ConfigError


def worker_bundle(trainer: Mapping) -> dict[str, float]:
    """What one Ray Train worker asks for (the dict build_trainer hands to ScalingConfig): CPUs, GPUs when
    use_gpu, and the custom resources of trainer.worker_resources."""
    bundle = {"CPU": float(trainer["cpus_per_worker"])}
    if trainer["use_gpu"]:
        bundle["GPU"] = float(trainer["gpus_per_worker"])
    bundle.update({k: float(v) for k, v in (trainer.get("worker_resources") or {}).items()})
    return bundle


def request_workers(bundles: list[dict[str, float]]) -> None:
    """Ask the autoscaler for room for these bundles at once (ray.autoscaler.sdk.request_resources): a floor it
    scales the cluster up to and keeps until asked again; `[]` withdraws it, so idle nodes can go."""
    from ray.autoscaler.sdk import request_resources

    request_resources(bundles=bundles)


def withdraw_request(log: Callable[[str], None] = print) -> None:
    """The end of a job that asked the autoscaler for its workers: withdraw the request. Never raises (it runs as
    the job ends, perhaps on its way out with an error of its own); a request left in place keeps nodes up."""
    try:
        request_workers([])
    except Exception as e:
        log(
            f"could not withdraw the request for workers from the autoscaler ({type(e).__name__}: {e}); its nodes "
            f"stay up until it is asked again"
        )


def free_resources() -> dict[str, float]:
    """What the cluster has free now, all nodes together (Ray's available resources)."""
    import ray

    return {k: float(v) for k, v in ray.available_resources().items()}


def _wait_until_free(
    trainer: Mapping,
    bundle: dict[str, float],
    free: Callable[[], dict[str, float]],
    sleep: Callable[[float], None],
    log: Callable[[str], None],
    poll_s: float,
) -> None:
    """The workers fit the cluster, but other jobs may hold what they need (two jobs on one head, a sweep beside a
    job): wait up to trainer.resource_wait_s for one trial's workers to be free, saying so once a minute, rather
    than leave Ray Train's placement group pending in silence; past it, one ConfigError line."""
    want = int(trainer["num_workers"])
    now = free()

    def shown(have: dict[str, float]) -> str:
        return describe({k: have.get(k, 0.0) for k in bundle})

    if workers_that_fit([now], bundle) >= want:
        return
    wait_s = float(trainer.get("resource_wait_s", 1800))
    deadline, last_said = time.monotonic() + wait_s, -math.inf
    asked = f"trainer.num_workers={want} x ({describe(bundle)})"
    while time.monotonic() < deadline:
        if time.monotonic() - last_said >= 60:
            log(
                f"waiting for {asked}: the cluster has room for them but other jobs hold it now (free: "
                f"{shown(now)}); up to trainer.resource_wait_s={wait_s:g} s"
            )
            last_said = time.monotonic()
        sleep(poll_s)
        now = free()
        if workers_that_fit([now], bundle) >= want:
            log(f"{asked} free now: starting")
            return
    raise ConfigError(
        f"{asked} still held by other jobs after trainer.resource_wait_s={wait_s:g} s (free: {shown(now)}); wait "
        "for them (ray job list) or stop one, and rerun the same command"
    )


def check_resources(
    trainer: Mapping,
    nodes: Callable[[], list[dict[str, float]]] = alive_nodes,
    sleep: Callable[[float], None] = time.sleep,
    log: Callable[[str], None] = print,
    poll_s: float = 10.0,
    trials: int = 1,
    request: Callable[[list[dict[str, float]]], None] = request_workers,
    free: Callable[[], dict[str, float]] | None = None,
) -> bool:
    """ConfigError (one line: what was asked, what the cluster has) when the workers cannot be placed. On an
    autoscaling cluster, ask the autoscaler for them (nothing is pending yet that would tell it) and wait up to
    trainer.resource_wait_s; returns True when it asked, and the caller withdraws the request (withdraw_request) when
    its job ends. `trials`: a sweep's concurrent Train runs, each with the same workers."""
    want, bundle = int(trainer["num_workers"]) * trials, worker_bundle(trainer)
    spread = trainer.get("placement_strategy") == "STRICT_SPREAD" and trials == 1

    def fits(have: list) -> bool:
        return workers_that_fit(have, bundle, spread) >= want

    asked = f"trainer.num_workers={trainer['num_workers']} x ({describe(bundle)})" + (
        f" for each of sweep.max_concurrent_trials={trials} trials" if trials > 1 else ""
    )
    have = nodes()
    if fits(have):
        if free is not None:  # the job's own check (launch): the tests of the totals pass none
            _wait_until_free(trainer, bundle, free, sleep, log, poll_s)
        return False
    if trainer.get("autoscale"):
        request([dict(bundle) for _ in range(want)])
        log(f"asked the autoscaler for {asked}")
        deadline = time.monotonic() + float(trainer.get("resource_wait_s", 1800))
        last_said = -math.inf
        while time.monotonic() < deadline:
            if time.monotonic() - last_said >= 60:
                log(f"waiting for the autoscaler: {asked}; the cluster has {cluster_summary(have)}")
                last_said = time.monotonic()
            sleep(poll_s)
            have = nodes()
            if fits(have):
                return True
        request([])
        raise ConfigError(
            f"{asked} still cannot be placed after trainer.resource_wait_s="
            f"{trainer.get('resource_wait_s')}: the cluster has {cluster_summary(have)}"
        )
    fit = workers_that_fit(have, bundle, spread)
    hint = (
        "set trainer.use_gpu=false or fewer trainer.num_workers"
        if bundle.get("GPU")
        else "lower trainer.num_workers or trainer.cpus_per_worker"
    )
    missing = [k for k in bundle if k not in ("CPU", "GPU") and not any(n.get(k) for n in have)]
    if missing:
        hint = f"no node offers {', '.join(missing)}: check trainer.worker_resources against the nodes' resources"
    elif spread:
        hint = "STRICT_SPREAD places one worker a node: " + hint
    if trials > 1:
        hint = "lower sweep.max_concurrent_trials, " + hint
    raise ConfigError(
        f"{asked} does not fit: the cluster has {cluster_summary(have)}, room for {fit} "
        f"such worker{'s' if fit != 1 else ''}; {hint} (or trainer.autoscale=true on an autoscaling "
        f"cluster)"
    )
