"""Feature extraction for the probe and kNN (pipeline.eval.extract: Ray Data reads the shards, actors decode and
run the backbone, the driver streams features to disk) against a bare `torch.no_grad` forward loop over the same
images already decoded into the eval view, same backbone, batch size and threads. #14's target: >= 0.9x.

Both on one split, in one process: the bare loop --repeats times before Ray starts, then the extraction as often;
the medians are compared. The extraction's
own clock (meta images_per_s) starts at the first block and so leaves out Ray's start-up and the actors'
construction, which a long extraction amortises (the start-up is printed).

Usage:
  python benchmarks/extract.py                      # the demo's Spirograph split (made if missing), ResNet-18 w16
  python benchmarks/extract.py --split data/cifar10/train --backbone resnet50 --width 64 --size 224 --no-cifar-stem
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def bare_loop(net, x, batch_size: int) -> float:
    """images/s of forward passes over pre-made eval views (the whole tensor in memory)."""
    import torch

    with torch.no_grad():
        net(x[:batch_size])  # warm-up: first-call allocations
        t0 = time.monotonic()
        for i in range(0, len(x), batch_size):
            net(x[i : i + batch_size])
    return len(x) / (time.monotonic() - t0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--split", default=None, help="a shard folder (default: the demo's Spirograph train split)")
    ap.add_argument("--backbone", default="resnet18")
    ap.add_argument("--width", type=int, default=16)
    ap.add_argument("--size", type=int, default=32)
    ap.add_argument("--no-cifar-stem", action="store_true")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--actors", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=5, help="alternating runs of both; medians compared")
    args = ap.parse_args()

    import torch

    from pipeline.cluster import init_ray
    from pipeline.config import compose_config
    from pipeline.data.reader import load_split
    from pipeline.eval.extract import extract_split
    from pipeline.eval.features import eval_preprocess
    from pipeline.models.backbones import build_backbone
    from pipeline.train.prepare import resolve

    cfg = compose_config([])
    split = args.split
    if split is None:
        resolve(cfg)  # makes the demo's data when missing
        split = cfg["data"]["train"]
    mean, std = [0.5] * 3, [0.25] * 3
    model = {"backbone": args.backbone, "cifar_stem": not args.no_cifar_stem, "width": args.width}
    torch.manual_seed(0)
    net = build_backbone(model).eval()
    threads = os.cpu_count() or 1
    torch.set_num_threads(threads)
    data = load_split(
        split,
        "classification" if "cls" in _columns(split) else "regression",
        None if "cls" in _columns(split) else ["m"],
    )
    x, _ = eval_preprocess(args.size, mean, std)(data.encoded)
    task = "classification" if "cls" in _columns(split) else "regression"
    # the bare loop first, with no Ray on the machine (Ray's own processes take a share of 2 cores: measured
    # 3100 images/s before ray.init and 2300 after), then the extraction
    bares = [bare_loop(net, x, args.batch_size) for _ in range(args.repeats)]
    init_ray(cfg["trainer"], bool(cfg.get("verbose")))
    metas = []
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory() as d:
            metas.append(
                extract_split(
                    net.state_dict(),
                    model,
                    split,
                    Path(d) / "f",
                    args.size,
                    mean,
                    std,
                    task,
                    None if task == "classification" else ["m"],
                    args.batch_size,
                    args.actors,
                )
            )
    bare = statistics.median(bares)
    meta = {**metas[0], "images_per_s": statistics.median(m["images_per_s"] for m in metas)}
    print(
        f"[extract] {split}: {len(x)} images, {args.backbone} w{args.width} at {args.size} px, batch "
        f"{args.batch_size} ({platform.node()}, {os.cpu_count()} cores, torch threads {threads})"
    )
    print(
        f"[extract] bare no_grad loop over pre-made eval views: {bare:.0f} images/s (median of {args.repeats}: "
        f"{', '.join(f'{b:.0f}' for b in bares)})"
    )
    print(
        f"[extract] Ray Data extraction to disk ({meta['actors']} {meta['device']} actor(s), decode included): "
        f"{meta['images_per_s']:.0f} images/s (median of {args.repeats}: "
        f"{', '.join(str(round(m['images_per_s'])) for m in metas)}; "
        f"start-up {metas[0]['startup_s']:.1f} s, left out)"
    )
    print(f"[extract] extraction / bare = {meta['images_per_s'] / bare:.3f} (target >= 0.9)")
    return 0


def _columns(split: str) -> set[str]:
    from pipeline.data.manifest import read_manifest
    from pipeline.data.reader import iter_samples

    return set(next(iter(iter_samples(read_manifest(split)[1]))))


if __name__ == "__main__":
    sys.exit(main())
