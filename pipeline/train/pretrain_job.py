"""jobs/pretrain.py's entry: the command line and the config's checks, light (no torch, Ray or MLflow until the
config is known good), then the run (pipeline.train.launch)."""

from __future__ import annotations

import sys

from pipeline.config import ConfigError, cli, fail
from pipeline.cores import limit_torch_threads
from pipeline.disk_space import DiskFull
from pipeline.train.prepare import resolve
from pipeline.train.run_lock import RunBusy


def main(argv: list[str], description: str = "") -> int:
    cfg = cli(argv, description or __doc__ or "")
    try:
        plan = resolve(cfg)
        # heavy (Ray Train, MLflow, torch): loaded once the config has passed its checks
        from pipeline.train.launch import pretrain

        limit_torch_threads()  # the driver's own torch (the probe, the logged model) on a shared machine
        pretrain(cfg, plan)
    except (ConfigError, RunBusy) as e:
        fail(str(e))
    except DiskFull as e:  # the run is marked FAILED where the store could take it; its status file says it
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0
