"""Does InvCLR's gradient penalty (or the re-render it needs) slow the contrastive loss down? Outside Ray, one
thread, the same seed and the same Spirograph batches for every variant; prints the running mean of each logged
term every 25 steps.

  python benchmarks/invclr_penalty.py base 100    # SimCLR on Spirograph views
  python benchmarks/invclr_penalty.py lam0 100    # + InvCLR at λ = 0: view 0 re-rendered with α requiring grad
  python benchmarks/invclr_penalty.py fp32 100    # + InvCLR at the paper's λ = 0.01, float32
  python benchmarks/invclr_penalty.py bf16 100    # the same under bfloat16 autocast
  python benchmarks/invclr_penalty.py lam 100 0.001
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from pipeline.augment.spirograph_views import SpirographRecipe, render_views  # noqa: E402
from pipeline.build import build_method  # noqa: E402
from pipeline.config import compose_config  # noqa: E402
from pipeline.data.spirograph import TARGETS, sample_params  # noqa: E402
from pipeline.train.precision import autocast  # noqa: E402


def main(variant: str, steps: int, lam: float | None = None) -> None:
    torch.set_num_threads(1)
    overrides = {
        "base": ["method=simclr", "data=spirograph"],
        "lam0": ["plugin.invclr.lam=0.0"],
        "fp32": [],
        "bf16": [],
        "lam": [f"plugin.invclr.lam={lam}"],
    }
    if variant not in overrides:
        raise SystemExit(f"variant must be one of {sorted(overrides)}")
    cfg = compose_config(
        overrides[variant] if variant == "base" else ["+experiment=invclr_spirograph", *overrides[variant]]
    )
    torch.manual_seed(0)
    method = build_method(cfg)
    opt = torch.optim.SGD(method.online.parameters(), lr=0.06, momentum=0.9, weight_decay=5e-4)
    g = torch.Generator().manual_seed(1)
    precision = "fp32" if variant == "fp32" else "bf16"
    t0, logged = time.time(), []
    for step in range(steps):
        x = {k: v for k, v in sample_params(128, g).items() if k in TARGETS}
        images, params = render_views(x, SpirographRecipe(32, 2), g)
        params = [{**x, **p} for p in params]
        with autocast(precision, torch.device("cpu")):
            out = method.total_loss(images, params)
        opt.zero_grad()
        out["loss"].backward()
        opt.step()
        logged.append({k: float(v.detach()) for k, v in out.items()})
        if (step + 1) % 25 == 0:
            last = logged[-25:]
            means = {k: round(sum(d[k] for d in last) / len(last), 4) for k in last[0]}
            print(variant, step + 1, means, f"{time.time() - t0:.0f}s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]) if len(sys.argv) > 3 else None)
