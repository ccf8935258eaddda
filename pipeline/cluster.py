"""The job's Ray: join a cluster or start a private local one, with Ray's, Train's and MLflow's own chatter
quiet unless verbose=true. Every job (pretraining, sweeps, downstream) starts Ray here."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any


def init_ray(cfg: dict, trials: int = 1) -> None:
    """Join the cluster (trainer.address, $RAY_ADDRESS) or start a private local one with room for `trials`
    concurrent Train runs (a sweep's)."""
    import ray

    if ray.is_initialized():
        return
    quiet = not cfg.get("verbose")
    if quiet:  # the token-auth notice ray.init logs before its own level applies (its logger has a level of its own)
        logging.getLogger("ray").setLevel(logging.ERROR)
        logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
    # Quiet unless verbose=true: Ray's start-up lines, its workers' INFO logs (Train's "Reporting training
    # result", Ray Data's execution plans) and Ray Data's progress bars; the job's own lines and bar stay.
    logs: dict[str, Any] = {
        "logging_level": logging.ERROR if quiet else logging.INFO,
        "logging_config": ray.LoggingConfig(log_level="WARNING" if quiet else "INFO"),
    }
    from pipeline.train.resources import cluster_address

    address = cluster_address(cfg["trainer"])
    if address:
        ray.init(address=address, **logs)
    else:
        # A local cluster of our own. Logical CPUs beyond the cores let Ray Data's read tasks schedule beside
        # the training workers (the workers' threads are capped separately), which otherwise starve on 2 cores.
        cores = os.cpu_count() or 1
        need = cfg["trainer"]["num_workers"] * cfg["trainer"]["cpus_per_worker"] * trials
        env = {"PYTHONPATH": str(Path(__file__).resolve().parents[1])}
        # Train's preemption watcher polls for nodes being drained (spot instances); a private cluster has none,
        # and its actor logs an error-level line at every start. Train propagates this variable from the driver.
        os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")
        if quiet:  # Ray's own deprecation notices and Ray Data's execution plans are not the user's to act on
            env.update(PYTHONWARNINGS="ignore::DeprecationWarning", RAY_DATA_LOG_LEVEL="ERROR")
        # address="local": a private cluster even when another one runs on this machine (tests, a demo).
        ray.init(address="local", num_cpus=max(cores, need) + 2, runtime_env={"env_vars": env}, **logs)
    import ray.data

    ray.data.DataContext.get_current().enable_progress_bars = not quiet


def quiet_logs(cfg: dict) -> None:
    """MLflow's store set-up lines and torch.export's notes while logging the model: for verbose=true only."""
    verbose = bool(cfg.get("verbose"))
    logging.getLogger("mlflow").setLevel(logging.INFO if verbose else logging.WARNING)
    logging.getLogger("torch._export").setLevel(logging.INFO if verbose else logging.ERROR)
