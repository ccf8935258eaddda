"""Training-step throughput of MoCo v2 (ResNet-18 layout, CIFAR stem, 32 px, batch 256) on this machine,
fp32 against bfloat16 autocast, for a few widths. Prints samples/s (each sample = two views) and the ratio.

    python benchmarks/train_step.py [--widths 16 32] [--steps 3] [--symmetric]
"""

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.build import build_method  # noqa: E402
from pipeline.train.precision import autocast, resolve_precision  # noqa: E402


def samples_per_s(width: int, precision: str, steps: int, symmetric: bool, batch: int = 256) -> float:
    cfg = {
        "seed": 0,
        "model": {"backbone": "resnet18", "cifar_stem": True, "width": width},
        "method": {
            "kind": "moco",
            "name": "mocov2",
            "temperature": 0.2,
            "momentum": 0.99,
            "queue_size": 4096,
            "bn_splits": 4,
            "symmetric": symmetric,
            "head": {"num_layers": 2, "hidden_dim": None, "out_dim": 128, "bn": symmetric},
        },
    }
    method = build_method(cfg)
    opt = torch.optim.SGD(method.online.parameters(), lr=0.03, momentum=0.9)
    views = [torch.randn(batch, 3, 32, 32), torch.randn(batch, 3, 32, 32)]
    cpu = torch.device("cpu")
    for i in range(steps + 1):  # the first step warms up the kernels
        if i == 1:
            t0 = time.perf_counter()
        with autocast(precision, cpu):
            loss = method.framework_loss(views)["loss"]
        opt.zero_grad()
        loss.backward()
        opt.step()
        method.update_momentum(0.5)
    return batch * steps / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--widths", type=int, nargs="+", default=[16, 32])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--symmetric", action="store_true")
    args = ap.parse_args()
    bf16 = resolve_precision("auto", torch.device("cpu")) == "bf16"
    print(f"torch threads {torch.get_num_threads()}, bfloat16 on this CPU: {bf16}")
    for w in args.widths:
        fp32 = samples_per_s(w, "fp32", args.steps, args.symmetric)
        line = f"width {w:3d}: fp32 {fp32:7.1f} samples/s"
        if bf16:
            b = samples_per_s(w, "bf16", args.steps, args.symmetric)
            line += f"   bf16 {b:7.1f} samples/s   ratio {b / fp32:.2f}x"
        print(line, flush=True)


if __name__ == "__main__":
    main()
