"""Views on the CPU: the batched executor (what `augment.executor=auto` runs) beside the per-sample torch executor,
batch by batch in turn, so a background load slows both alike.

Rows (MoCo v2's recipe, two views an image):
  photos-32     32 px PNG crops of the Photos set -> two 32 px views: what `data=photos` trains on
  tiny-8        the same PNGs -> two 8 px views: the per-batch cost that is not pixels (Python, op dispatch)
  photos-64/96  Photos crops made at 64 / 96 px -> views of that size (STL-10's scale)
  imagenet-224  500 x 375 JPEGs (benchmarks/sample_images.py) -> two 224 px views
Per row and executor: ms per batch (on the CPU the whole call is host time), images/s, views/s, and the batched
executor's rate over the torch executor's; `fused` is the batched executor with augment.fuse=true (its photometric
stage compiled at the warm-up batch, which is not timed), with its rate over the batched one's. The views'
parameters are drawn before the timed calls (the executors apply the same ones). On the CPU the batched resize is
a dense matmul over the padded image, so its cost grows with the source image and the view size: it wins where
CPU runs train (small images) and loses at 224 px from 500 x 375.

Usage:
    python benchmarks/views_cpu.py [--batch 64] [--batches 6] [--threads 2] [--rows photos-32 tiny-8 imagenet-224]
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from pipeline.augment.batched import BatchedExecutor  # noqa: E402
from pipeline.augment.params import header_sizes, sample_views  # noqa: E402
from pipeline.augment.torch_exec import TorchExecutor  # noqa: E402
from pipeline.augment.view_makers import image_recipe  # noqa: E402
from pipeline.config import compose_config  # noqa: E402

ROWS = {
    "photos-32": ("photos", 32),
    "tiny-8": ("photos", 8),
    "photos-64": ("photos", 64),
    "photos-96": ("photos", 96),
    "imagenet-224": ("jpeg", 224),
}


def images(kind: str, n: int, size: int) -> list[bytes]:
    if kind == "photos":
        from pipeline.data.photos import iter_photos

        return [s["png"] for s in iter_photos(n, 0, "train", max(size, 32))]
    from sample_images import sample_jpegs

    return sample_jpegs(n)


def measure(row: str, batch: int, batches: int) -> dict:
    kind, size = ROWS[row]
    recipe = image_recipe(compose_config(["augment=mocov2", "data=imagenet", f"data.image_size={size}"])["augment"])
    encoded = images(kind, batch * batches, size)
    chunks = [encoded[i : i + batch] for i in range(0, len(encoded), batch)]
    rng = np.random.default_rng(0)
    work = []
    for c in chunks:
        sizes = header_sizes(c)
        work.append((c, sample_views(c, recipe, rng, sizes), sizes))
    executors = {
        "batched": BatchedExecutor(recipe, "cpu"),
        "torch": TorchExecutor(recipe),
        "fused": BatchedExecutor(recipe, "cpu", fuse=True),
    }
    seconds = dict.fromkeys(executors, 0.0)
    for ex in executors.values():  # warm-up: allocator, kernels
        ex(*work[0])
    for c, params, sizes in work:
        for name, ex in executors.items():
            t0 = time.perf_counter()
            views, kept = ex(c, params, sizes)
            seconds[name] += time.perf_counter() - t0
            assert len(kept) == len(c) and all(torch.isfinite(v).all() for v in views)
    n = batch * batches
    return {
        name: {"ms_batch": 1000 * s / batches, "images_s": n / s, "views_s": 2 * n / s} for name, s in seconds.items()
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--batches", type=int, default=6)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--rows", nargs="+", default=list(ROWS), choices=list(ROWS))
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(
        f"# views on the CPU ({platform.processor() or platform.machine()}, {args.threads} threads, torch "
        f"{torch.__version__}), MoCo v2's two views, batch {args.batch} x {args.batches}"
    )
    print(f"{'row':14s} {'executor':8s} {'ms/batch':>9s} {'images/s':>9s} {'views/s':>9s}   ratio")
    out = {}
    for row in args.rows:
        r = out[row] = measure(row, args.batch, args.batches)
        ratios = {
            "batched": f"   {r['batched']['images_s'] / r['torch']['images_s']:.2f}x batched/torch",
            "fused": f"   {r['fused']['images_s'] / r['batched']['images_s']:.2f}x fused/batched",
        }
        for name in ("batched", "torch", "fused"):
            m = r[name]
            tail = ratios.get(name, "")
            print(f"{row:14s} {name:8s} {m['ms_batch']:9.1f} {m['images_s']:9.1f} {m['views_s']:9.1f}{tail}")
    return out


if __name__ == "__main__":
    main()
