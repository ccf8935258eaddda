"""Tune's overhead: the wall time of a one-trial sweep against the same pretraining run from jobs/pretrain.py.

Both are the commands a user types, timed end to end as subprocesses in one fresh paths.root, one after the
other, after the sweep's data has been made once (so neither pays for it):

  pretrain   python jobs/pretrain.py +sweep=<name> <its size's overrides> <key>=<value>
  sweep      python jobs/tune.py +sweep=<name> 'sweep.space={<key>: {grid: [<value>]}}'

Each has a different run name, so neither finds the other's finished run. The pretrain job also logs what a
sweep logs once for all its trials (the views gallery, the exported model, the random-init probe), and the
sweep adds its own (Tune's start, the trial's actor, the random-init baseline probe, the table and plot), so
this is the cost of running one configuration through Tune instead of on its own: #13's target is <= 1.10.

Usage:
  python benchmarks/tune_overhead.py                                   # invclr_lambda's CPU size, λ = 1e-3
  python benchmarks/tune_overhead.py --sweep smoke --key method.temperature --value 0.2
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def timed(cmd: list[str], log: Path) -> float:
    t0 = time.monotonic()
    with open(log, "w") as f:
        r = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT)
    wall = time.monotonic() - t0
    if r.returncode != 0:
        sys.exit(f"error: {' '.join(cmd)} exited {r.returncode}; its output: {log}")
    return wall


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sweep", default="invclr_lambda")
    ap.add_argument("--key", default="plugin.invclr.lam")
    ap.add_argument("--value", default="0.001")
    ap.add_argument("--root", default=None, help="paths.root for both runs (default: a fresh temporary folder)")
    args = ap.parse_args()

    from pipeline.train.prepare import resolve
    from pipeline.tune.settings import check_sweep, compose_sweep, sweep_argv

    root = Path(args.root or tempfile.mkdtemp(prefix="tune-overhead-")).resolve()
    root.mkdir(parents=True, exist_ok=True)
    base = [*sweep_argv([f"+sweep={args.sweep}"]), f"paths.root={root}"]
    space = f"sweep.space={{{args.key}: {{grid: [{args.value}]}}}}"
    cfg, full = compose_sweep([*base, space])
    check_sweep(cfg, full)  # bad --key/--value: one line now, not after a pretraining run
    resolve(cfg)  # the sweep's data, made once for both
    py = sys.executable
    env_note = f"{platform.node()}, {os.cpu_count()} cores"
    print(f"[tune-overhead] {args.sweep}, {args.key}={args.value}, root {root} ({env_note})", flush=True)
    t_pre = timed([py, "jobs/pretrain.py", *base, f"{args.key}={args.value}"], root / "pretrain.log")
    print(f"[tune-overhead] pretrain: {t_pre:.1f} s", flush=True)
    t_tune = timed([py, "jobs/tune.py", *base, space], root / "tune.log")
    print(f"[tune-overhead] one-trial sweep: {t_tune:.1f} s", flush=True)
    print(f"[tune-overhead] sweep / pretrain = {t_tune / t_pre:.3f} (target <= 1.10)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
