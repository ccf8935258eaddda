"""The run users start against a plain loop, side by side in one run, at the default precision, with their probes.

  job    `python jobs/pretrain.py data=photos train.epochs=E paths.root=<dir>/job` as a user runs it: Ray Train's
         worker, Ray Data streaming the shards, the views made ahead by executor=auto, MLflow; its rate per epoch is
         the job's own `train/epoch_images_per_s`, its probe the job's `probe/pretrained_top1`
  plain  a single-process loop over the same shards' images held in memory: PIL decode and torchvision's MoCo v2
         transforms in the loop (benchmarks/epoch_rate.py's bare row), the same method, optimiser, lr schedule,
         precision (train.precision=auto: bf16 where the CPU has it) and optimisation_step, no Ray, no MLflow;
         then the same probe (pipeline.eval.probe.compare.probe_backbone, the job's probe settings)

The job runs first (it writes the shards both read), then the plain loop; each row's rate is the mean of epochs
2..E (the first is warm-up), images / wall seconds. The ratio is job / plain (target >= 1.0, with a probe better
than or equal to the plain loop's).

    python benchmarks/run_vs_plain.py [--epochs 12] [--dir /tmp/run_vs_plain] [overrides ...]
    python benchmarks/run_vs_plain.py --epochs 2 data.generate.n_train=512 data.generate.n_val=256   # smoke
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from epoch_rate import bare_transform, bare_views  # noqa: E402

from pipeline.build import build_method, complete_method  # noqa: E402
from pipeline.config import compose_config  # noqa: E402
from pipeline.data.reader import load_split  # noqa: E402
from pipeline.eval.probe.compare import probe_backbone  # noqa: E402
from pipeline.eval.probe.spec import ProbeSpec  # noqa: E402
from pipeline.plan import make_plan  # noqa: E402
from pipeline.schema import validate  # noqa: E402
from pipeline.sections import Optim  # noqa: E402
from pipeline.train.optim import build_optimizer  # noqa: E402
from pipeline.train.precision import resolve_precision  # noqa: E402
from pipeline.train.step import optimisation_step, schedule_step  # noqa: E402

TARGET = 1.0


def run_job(root: Path, overrides: list[str]) -> dict:
    """The job as a user starts it; its per-epoch rates and probe from its MLflow store."""
    import mlflow

    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS",)}
    cmd = [sys.executable, str(ROOT / "jobs" / "pretrain.py"), "data=photos", f"paths.root={root}", *overrides]
    print("$ " + " ".join(cmd[1:]), flush=True)
    t0 = time.monotonic()
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"error: the job failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    client = mlflow.MlflowClient(f"sqlite:///{root / 'runs' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("augssl")
    run = max(client.search_runs([exp.experiment_id]), key=lambda r: r.info.start_time)
    history = sorted(client.get_metric_history(run.info.run_id, "train/epoch_images_per_s"), key=lambda m: m.step)
    return {
        "rates": [m.value for m in history],
        "probe_top1": run.data.metrics.get("probe/pretrained_top1"),
        "random_top1": run.data.metrics.get("probe/random_top1"),
        "wall_s": time.monotonic() - t0,
    }


def run_plain(root: Path, overrides: list[str]) -> dict:
    """The plain loop on the job's shards, then the job's probe on its backbone."""
    cfg = compose_config(["data=photos", f"paths.root={root}", "trainer.num_workers=1", *overrides])
    checked = validate(cfg)
    cfg["method"].update(complete_method(checked))
    device = torch.device("cpu")
    train = load_split(cfg["data"]["train"], "classification", None)
    encoded = list(train.encoded)
    batch = int(cfg["train"]["batch_size"])
    plan = make_plan(cfg["train"], cfg["optim"], 1, len(encoded))
    torch.manual_seed(cfg["seed"])
    method = build_method(cfg).to(device)
    optim = Optim.of(cfg["optim"])  # typed once, not per step
    optimizer = build_optimizer(method.online, optim, plan.lr)
    precision = resolve_precision(cfg["train"]["precision"], device)
    transform = bare_transform(cfg["augment"])
    rng = np.random.default_rng(cfg["seed"])
    rates, step = [], 0
    for epoch in range(int(cfg["train"]["epochs"])):
        order = rng.permutation(len(encoded))
        t0 = time.monotonic()
        n = 0
        for i in range(0, len(order) - batch + 1, batch):
            images = bare_views([encoded[j] for j in order[i : i + batch]], transform, 2)
            schedule_step(optimizer, optim, step, plan.total_steps, plan.warmup_steps, plan.lr, plan.steps_per_epoch)
            step += 1
            out = optimisation_step(
                method, optimizer, images, None, precision, device, min(1.0, step / plan.total_steps)
            )
            if not torch.isfinite(out["loss"]):
                raise SystemExit(f"error: the plain loop's loss is not finite at epoch {epoch + 1}")
            n += batch
        rates.append(n / (time.monotonic() - t0))
        print(f"  plain epoch {epoch + 1}: {rates[-1]:.1f} img/s ({precision})", flush=True)
    backbone = method.online.backbone.eval()
    probe = probe_backbone(backbone, ProbeSpec.of(checked))
    return {"rates": rates, "probe_top1": probe.get("top1"), "precision": precision}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=12)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/run_vs_plain"))
    ap.add_argument("--json", type=Path)
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args(argv)
    overrides = [f"train.epochs={args.epochs}", *args.overrides]
    root = args.dir.resolve()
    job = run_job(root, overrides)
    plain = run_plain(root, overrides)
    mean = {k: float(np.mean(r["rates"][1:] or r["rates"])) for k, r in (("job", job), ("plain", plain))}
    result = {"job": job, "plain": plain, "mean_rate": mean, "ratio": mean["job"] / mean["plain"]}
    probe_ok = (job["probe_top1"] or 0) >= (plain["probe_top1"] or 0)
    print(
        f"job   {mean['job']:7.1f} img/s (epochs 2-{args.epochs}), probe top-1 {job['probe_top1']:.3f}\n"
        f"plain {mean['plain']:7.1f} img/s (epochs 2-{args.epochs}), probe top-1 {plain['probe_top1']:.3f}, "
        f"{plain['precision']}\n"
        f"job / plain = {result['ratio']:.3f} (target >= {TARGET}: {'met' if result['ratio'] >= TARGET else 'NOT met'})"
        f"; probe {'>=' if probe_ok else '<'} the plain loop's"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
