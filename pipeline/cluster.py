"""The job's Ray: join a cluster or start a private local one, with Ray's, Train's and MLflow's own chatter
quiet unless verbose=true. Every job (pretraining, sweeps, downstream) starts Ray here. Also what the cluster's
nodes hold, and how many workers or actors of a resource bundle they can place (Train's workers, the feature
extraction's actors)."""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence


def init_ray(trainer: Mapping, verbose: bool = False, trials: int = 1) -> None:
    """Join the cluster (trainer.address, $RAY_ADDRESS) or start a private local one with room for `trials`
    concurrent Train runs (a sweep's) of the `trainer` section's workers."""
    import ray

    if ray.is_initialized():
        return
    quiet = not verbose
    if quiet:  # the token-auth notice ray.init logs before its own level applies (its logger has a level of its own)
        logging.getLogger("ray").setLevel(logging.ERROR)
        logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
    # Quiet unless verbose=true: Ray's start-up lines, its workers' INFO logs (Train's "Reporting training
    # result", Ray Data's execution plans) and Ray Data's progress bars; the job's own lines and bar stay.
    logs: dict[str, Any] = {
        "logging_level": logging.ERROR if quiet else logging.INFO,
        "logging_config": ray.LoggingConfig(log_level="WARNING" if quiet else "INFO"),
    }
    address = cluster_address(trainer)
    if address:
        from pipeline.config import ConfigError

        key = "trainer.address" if trainer.get("address") else "RAY_ADDRESS"
        why = unreachable(address)
        if why:
            raise ConfigError(f"{key}={address}: nothing answers there ({why}); is the cluster up?")
        try:
            ray.init(address=address, **workers_know(address), **logs)
        except ConnectionError as e:  # no cluster there, or (for auto) more than one on this machine
            said = " ".join(str(e).split())
            raise ConfigError(f"{key}={address}: {said[:300]}") from None
    else:
        # A local cluster of our own. Logical CPUs beyond the cores let Ray Data's read tasks schedule beside
        # the training workers (the workers' threads are capped separately), which otherwise starve on 2 cores.
        cores = os.cpu_count() or 1
        need = trainer["num_workers"] * trainer["cpus_per_worker"] * trials
        # the project first, then what the driver has on PYTHONPATH (an outside package installed with --target):
        # the workers import what the driver imports (replacing it hid such packages from them)
        inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        env = {"PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]), *inherited])}
        # Train's preemption watcher polls for nodes being drained (spot instances); a private cluster has none,
        # and its actor logs an error-level line at every start. Train propagates this variable from the driver.
        os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")
        if quiet:  # Ray's own deprecation notices and Ray Data's execution plans are not the user's to act on
            env.update(PYTHONWARNINGS="ignore::DeprecationWarning", RAY_DATA_LOG_LEVEL="ERROR")
        # address="local": a private cluster even when another one runs on this machine (tests, a demo). Its GCS
        # gets a port chosen here, named to every worker as RAY_ADDRESS: Train's placement-group cleaner asks the
        # state API without an address, which otherwise searches the machine and fails when it finds two clusters.
        # The idle workers Ray prestarts for a first driver go unused (Train and Data start actors of their own) and
        # cost a small job ~2 CPU-s. (Its dashboard stays, though nobody browses a private cluster's: Train's
        # placement-group cleaner asks the state API, which the dashboard serves, and warns every second without.)
        os.environ.setdefault("RAY_prestart_worker_first_driver", "0")
        port = _free_port()
        env["RAY_ADDRESS"] = f"127.0.0.1:{port}"
        before = os.environ.get("RAY_GCS_SERVER_PORT")
        os.environ["RAY_GCS_SERVER_PORT"] = str(port)
        try:
            ray.init(
                address="local",
                num_cpus=max(cores, need) + 2,
                runtime_env={"env_vars": env},
                **logs,
            )
        finally:
            if before is None:
                os.environ.pop("RAY_GCS_SERVER_PORT", None)
            else:
                os.environ["RAY_GCS_SERVER_PORT"] = before
    import ray.data

    ray.data.DataContext.get_current().enable_progress_bars = not quiet


def workers_know(address: str) -> dict[str, Any]:
    """ray.init's runtime_env that names a joined cluster's GCS (`host:port`, what `ray job submit` hands its driver
    as RAY_ADDRESS) to the job's workers: Train's placement-group cleaner asks the state API without an address,
    which otherwise searches the machine and fails with a traceback when another Ray runs there too. A loopback host
    becomes this node's address (a worker on another node would read loopback as itself). Ray merges it with a
    submitted job's own runtime_env, env var by env var. Nothing for `auto` (with two clusters on the machine
    ray.init refuses it already) or a `ray://` client address."""
    host, sep, port = address.rpartition(":")
    if not sep or "/" in address or not host or not port.isdigit() or _job_sets("RAY_ADDRESS"):
        return {}
    if host.strip("[]") in ("localhost", "::1") or host.startswith("127."):
        import ray.util

        host = ray.util.get_node_ip_address()
    return {"runtime_env": {"env_vars": {"RAY_ADDRESS": f"{host}:{port}"}}}


REFUSED_WAIT_S = 15.0  # a head still starting (a pod before its head's, a GCS restarting) refuses for a few seconds


def unreachable(address: str, timeout: float = 5.0) -> str | None:
    """Why nothing takes a TCP connection at a `host:port` GCS address (refused for REFUSED_WAIT_S, timed out, an
    unknown host), else None; None too for the addresses Ray resolves or reaches otherwise (auto, `ray://` through
    a client proxy, a dashboard's http://). Ray retries a GCS that is not there for minutes, printing a warning a
    second: a cluster that has gone (a stale RAY_ADDRESS after `make cluster-stop`) is one line in seconds instead."""
    import socket
    import time

    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or "/" in address:
        return None
    deadline = time.monotonic() + REFUSED_WAIT_S
    while True:
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
                return None
        except ConnectionRefusedError as e:
            if time.monotonic() >= deadline:
                return e.strerror or "Connection refused"
            time.sleep(0.5)
        except OSError as e:  # TimeoutError, socket.gaierror
            return e.strerror or str(e) or type(e).__name__


def _job_sets(var: str) -> bool:
    """Whether the runtime_env the job was submitted with sets `var` already: Ray refuses to merge a second value."""
    import json

    job = json.loads(os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR") or "{}")  # what `ray job submit` hands its driver
    return var in ((job.get("runtime_env") or {}).get("env_vars") or {})


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def quiet_logs(verbose: bool) -> None:
    """MLflow's store set-up lines, its "View run ... at" links (the job prints its own), urllib3's retry warnings
    while a tracking server is away and torch.export's notes while logging the model: for verbose=true only."""
    logging.getLogger("mlflow").setLevel(logging.INFO if verbose else logging.WARNING)
    logging.getLogger("urllib3").setLevel(logging.WARNING if verbose else logging.ERROR)
    # MLflow's SQLite store logs each failed write with its whole traceback (a full disk, a locked file): the job
    # says what happened in one line of its own
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.ERROR if verbose else logging.CRITICAL)
    logging.getLogger("torch._export").setLevel(logging.INFO if verbose else logging.ERROR)
    if not verbose:
        os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")


def cluster_address(trainer: Mapping) -> str | None:
    """The cluster a job joins (trainer.address, else $RAY_ADDRESS, which `ray job submit` sets), or None for a
    private local cluster of its own."""
    return trainer.get("address") or os.environ.get("RAY_ADDRESS") or None


def workers_that_fit(
    nodes: Iterable[Mapping[str, float]], bundle: Mapping[str, float], one_per_node: bool = False
) -> int:
    """How many workers of `bundle` the nodes' total resources can place (a worker lives on one node; at most one
    a node under STRICT_SPREAD)."""
    total = 0
    for res in nodes:
        per_node = [math.floor(res.get(name, 0.0) / amount + 1e-9) for name, amount in bundle.items() if amount > 0]
        fit = min(per_node) if per_node else 0
        total += min(fit, 1) if one_per_node else fit
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
