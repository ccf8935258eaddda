"""Images/s per core of the MoCo v2 two-view recipe on ImageNet-sized JPEGs, through three paths
(and a fourth, reference row):

  dali         the project's DALI executor on the CPU     (build_view_maker, executor=dali, device=cpu)
  torch        the project's torch executor               (build_view_maker, executor=torch)
  batched      the project's batched executor on the CPU  (build_view_maker, executor=batched, device=cpu: what
               executor=auto picks on a CPU)
  torchvision  a plain torchvision + PIL pipeline through a torch DataLoader: PIL decode,
               RandomResizedCrop(224, scale=(0.2, 1)), RandomApply(ColorJitter(0.4, 0.4, 0.4, 0.1), 0.8),
               RandomGrayscale(0.2), RandomApply(GaussianBlur(23, (0.1, 2)), 0.5), RandomHorizontalFlip,
               ToTensor, Normalize -- twice per image (transforms v1 on PIL images)
  tv-pilblur   for reference only: the same, but the blur is PIL's ImageFilter.GaussianBlur(radius=sigma),
               as the original MoCo v2 code blurs. torchvision's GaussianBlur convolves with a dense
               23x23 kernel in float, which dominates the torchvision row; this row shows how much.

One image = both of its views. The two project paths include drawing the view parameters (they are
part of every call of the view maker). Inputs are 500x375 JPEGs (quality 90) made in memory from
scikit-image's sample photographs (benchmarks/sample_images.py).

"Per core" (--threads 1, the default): DALI num_threads=1; torch.set_num_threads(1) for every path;
the DataLoader runs with num_workers=0, i.e. in the main process. With one thread the paths are
timed batch by batch in turn (dali, torch, torchvision, tv-pilblur, dali, ...), so a background load
slows them alike and the ratios stay comparable. `cpu s` is this process's CPU time while a path ran;
`cpu/wall` ~1.0 means it had one core to itself, and `img/cpu-s` (images per CPU-second) is the
per-core rate with waiting for a busy machine taken out. Every batch of every path is checked: two
finite float32 views [B, 3, 224, 224]. A row with --threads T > 1 uses DALI num_threads=T,
torch.set_num_threads(T), and a DataLoader with T worker processes (one torch thread each); the
paths then run one after the other, and CPU time is not measured (the workers are other processes).

Usage:
    python benchmarks/augment.py [--images 512] [--batch 64] [--threads 1 [2 ...]] [--seed 0]
    python benchmarks/augment.py --images 64       # smoke run, well under a minute
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import shlex
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from sample_images import HEIGHT, QUALITY, WIDTH, sample_jpegs  # noqa: E402

from pipeline.augment.view_makers import build_view_maker  # noqa: E402
from pipeline.config import compose_config  # noqa: E402

PATHS = ("dali", "torch", "batched", "torchvision", "tv-pilblur")
EXECUTOR = {"dali": "dali", "torch": "torch", "batched": "batched"}  # path -> augment.executor
TARGET = 1.5  # the goal: DALI >= 1.5x the plain torchvision path, per core


# ----------------------------------------------------------------------------- the project's executors
def mocov2_augment(executor: str) -> dict:
    """conf/augment/mocov2.yaml composed with data=imagenet (size 224), on the CPU."""
    cfg = compose_config(["augment=mocov2", "data=imagenet"])
    aug = dict(cfg["augment"])
    if aug["size"] != 224:
        raise SystemExit(f"expected augment.size 224 with data=imagenet, got {aug['size']}")
    aug["executor"], aug["device"] = executor, "cpu"
    return aug


def project_path(executor: str, batch: int, threads: int, seed: int) -> Callable[[list[bytes]], list[torch.Tensor]]:
    maker = build_view_maker(
        mocov2_augment(EXECUTOR[executor]), batch_size=batch, num_threads=threads, seed=seed, device="cpu"
    )
    rng = np.random.default_rng(seed)

    def run(encoded: list[bytes]) -> list[torch.Tensor]:
        views = maker({"jpg": np.array(encoded, dtype=object)}, rng)
        if len(views.kept) != len(encoded):
            raise RuntimeError(f"{executor} executor dropped {len(encoded) - len(views.kept)} sample(s)")
        return views.images

    return run


# ----------------------------------------------------------------------------- plain torchvision + PIL
class PilGaussianBlur:
    """Gaussian blur with PIL's ImageFilter, sigma uniform in `sigma` (drawn from torch's generator)."""

    def __init__(self, sigma: tuple[float, float]):
        self.sigma = sigma

    def __call__(self, img):
        from PIL import ImageFilter

        s = float(torch.empty(1).uniform_(self.sigma[0], self.sigma[1]))
        return img.filter(ImageFilter.GaussianBlur(radius=s))


def mocov2_torchvision(pil_blur: bool = False):
    """The MoCo v2 recipe with torchvision transforms on PIL images: torchvision's GaussianBlur with a
    23-pixel kernel (the issue's recipe), or PIL's blur (pil_blur=True, the reference row)."""
    import torchvision.transforms as T

    a = mocov2_augment("torch")  # same numbers as the project's config
    sigma = tuple(a["blur_sigma"])
    blur = PilGaussianBlur(sigma) if pil_blur else T.GaussianBlur(kernel_size=23, sigma=sigma)
    return T.Compose(
        [
            T.RandomResizedCrop(a["size"], scale=tuple(a["scale"]), ratio=tuple(a["ratio"])),
            T.RandomApply([T.ColorJitter(*a["jitter"])], p=a["p_jitter"]),
            T.RandomGrayscale(p=a["p_gray"]),
            T.RandomApply([blur], p=a["p_blur"]),
            T.RandomHorizontalFlip(p=a["p_flip"]),
            T.ToTensor(),
            T.Normalize(a["mean"], a["std"]),
        ]
    )


class TwoViewJpegs(torch.utils.data.Dataset):
    """Encoded JPEGs -> (view 1, view 2): one PIL decode, the transform applied twice."""

    def __init__(self, encoded: Sequence[bytes], transform):
        self.encoded, self.transform = list(encoded), transform

    def __len__(self) -> int:
        return len(self.encoded)

    def __getitem__(self, i: int):
        import io

        from PIL import Image

        with Image.open(io.BytesIO(self.encoded[i])) as im:
            img = im.convert("RGB")
        return self.transform(img), self.transform(img)


class Batches(torch.utils.data.Sampler):
    """A batch sampler whose batches can be set between epochs (persistent workers keep running)."""

    def __init__(self, batches: list[list[int]]):
        self.batches = batches

    def __iter__(self):
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


def torchvision_path(encoded: list[bytes], workers: int, seed: int, pil_blur: bool = False):
    """run(batches) -> [[view 1, view 2] per batch], through one DataLoader (persistent workers)."""
    torch.manual_seed(seed)
    sampler = Batches([])
    loader = torch.utils.data.DataLoader(
        TwoViewJpegs(encoded, mocov2_torchvision(pil_blur)),
        batch_sampler=sampler,
        num_workers=workers,
        persistent_workers=workers > 0,
        pin_memory=False,
    )

    def run(batches: list[list[int]]):
        sampler.batches = batches
        for views in loader:
            yield list(views)

    return run


# ----------------------------------------------------------------------------- timing
class Clock:
    def __init__(self):
        self.wall = self.cpu = 0.0
        self.images = 0

    def add(self, wall: float, cpu: float, images: int) -> None:
        self.wall += wall
        self.cpu += cpu
        self.images += images


def _timed(clock: Clock, fn: Callable[[], list[torch.Tensor]], n: int) -> list[torch.Tensor]:
    c0, t0 = time.process_time(), time.perf_counter()
    out = fn()
    clock.add(time.perf_counter() - t0, time.process_time() - c0, n)
    return out


def _meta(views: Sequence[torch.Tensor], finite: bool = True) -> list[tuple]:
    """(shape, dtype, all finite or None) per view: what _check_views needs, without the pixels."""
    return [(tuple(v.shape), v.dtype, bool(torch.isfinite(v).all()) if finite else None) for v in views]


def _check_views(name: str, meta: list[tuple], n: int, shapes: dict) -> None:
    """Every batch of every path (checked outside the timed region): 2 finite float views [n, 3, 224, 224].
    shapes[name] collects the distinct view shapes seen."""
    if len(meta) != 2:
        raise RuntimeError(f"{name}: expected 2 views, got {len(meta)}")
    for shape, dtype, finite in meta:
        if shape != (n, 3, 224, 224) or dtype != torch.float32 or finite is False:
            raise RuntimeError(f"{name}: bad view {shape} {dtype}, finite: {finite}")
        shapes.setdefault(name, set()).add(shape)


def measure(encoded: list[bytes], batch: int, threads: int, seed: int) -> dict:
    """One row: {path: Clock} over all of `encoded`, after a one-batch warm-up per path."""
    torch.set_num_threads(threads)
    batches = [list(range(lo, min(lo + batch, len(encoded)))) for lo in range(0, len(encoded), batch)]
    workers = 0 if threads == 1 else threads
    project = {p: project_path(p, batch, threads, seed) for p in EXECUTOR}
    loaders = {
        "torchvision": torchvision_path(encoded, workers, seed),
        "tv-pilblur": torchvision_path(encoded, workers, seed, pil_blur=True),
    }

    def run(path: str, bs: list[list[int]]):
        """Yields [view 1, view 2] per batch of indices."""
        if path in project:
            return (project[path]([encoded[i] for i in b]) for b in bs)
        return loaders[path](bs)  # noqa: F821 (deleted after the runs, which are done by then)

    clocks, shapes = {p: Clock() for p in PATHS}, {}
    # Warm-up: DALI allocates on its first run, DataLoaders start their workers, caches fill.
    warm = batches[0]
    for p in PATHS:
        for views in run(p, [warm] * max(1, workers)):
            _check_views(p, _meta(views), len(warm), shapes)

    if threads == 1:  # interleaved, batch by batch
        for b in batches:
            for p in PATHS:
                (views,) = _timed(clocks[p], lambda: list(run(p, [b])), len(b))
                _check_views(p, _meta(views), len(b), shapes)
    else:  # whole runs one after the other (worker processes prefetch ahead)
        for p in PATHS:  # keep only shapes (all views of all batches would take too much memory)
            metas = _timed(clocks[p], lambda: [_meta(views, finite=False) for views in run(p, batches)], len(encoded))
            for b, meta in zip(batches, metas, strict=True):
                _check_views(p, meta, len(b), shapes)
        for c in clocks.values():
            c.cpu = math.nan
    del loaders  # stops persistent workers
    return {"threads": threads, "clocks": clocks, "shapes": shapes}


# ----------------------------------------------------------------------------- report
HEADER = (
    f"{'threads':>7s}  {'path':<11s} {'images':>6s} {'wall s':>7s} {'images/s':>8s} {'img/s/core':>10s}"
    f" {'cpu s':>6s} {'cpu/wall':>8s} {'img/cpu-s':>9s} {'vs tv (wall)':>12s} {'vs tv (cpu)':>11s}"
)


def _summarise(row: dict) -> list[str]:
    """Fills row["rates"], row["cpu_rates"], row["ratios"]; returns the table lines."""
    c, t = row["clocks"], row["threads"]
    rate = {p: c[p].images / c[p].wall for p in PATHS}
    cpu_rate = {p: c[p].images / c[p].cpu if c[p].cpu > 0 else math.nan for p in PATHS}
    lines = []
    for p in PATHS:
        measured = not math.isnan(c[p].cpu)
        cpu = (
            f"{c[p].cpu:6.2f} {c[p].cpu / c[p].wall:8.2f} {cpu_rate[p]:9.1f}"
            if measured
            else f"{'-':>6s} {'-':>8s} {'-':>9s}"
        )
        vs_cpu = f"{cpu_rate[p] / cpu_rate['torchvision']:10.2f}x" if measured else f"{'-':>11s}"
        lines.append(
            f"{t:>7d}  {p:<11s} {c[p].images:>6d} {c[p].wall:>7.2f} {rate[p]:>8.1f} {rate[p] / t:>10.1f}"
            f" {cpu} {rate[p] / rate['torchvision']:>11.2f}x {vs_cpu}"
        )
    row["rates"], row["cpu_rates"] = rate, cpu_rate
    row["ratios"] = {
        "dali/torchvision": rate["dali"] / rate["torchvision"],
        "torch/torchvision": rate["torch"] / rate["torchvision"],
        "batched/torchvision": rate["batched"] / rate["torchvision"],
        "dali/tv-pilblur": rate["dali"] / rate["tv-pilblur"],
    }
    return lines


def main(argv: Sequence[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=512, help="timed images per path (default 512)")
    ap.add_argument("--batch", type=int, default=64, help="batch size of every path (default 64)")
    ap.add_argument("--threads", type=int, nargs="+", default=[1], help="one row per value; 1 = per core (default 1)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.images < 1 or args.batch < 1 or min(args.threads) < 1:
        ap.error("--images, --batch and --threads must be positive")

    argv_used = list(sys.argv[1:] if argv is None else argv)
    print("command: python benchmarks/augment.py " + shlex.join(argv_used))
    print(
        f"resolved: --images {args.images} --batch {args.batch} --threads {' '.join(map(str, args.threads))}"
        f" --seed {args.seed}"
    )
    import nvidia.dali
    import torchvision

    print(
        f"torch {torch.__version__}, torchvision {torchvision.__version__}, nvidia-dali {nvidia.dali.__version__},"
        f" python {platform.python_version()}, {os.cpu_count()} CPUs,"
        f" load average {os.getloadavg()[0]:.2f} at start"
    )

    t0 = time.perf_counter()
    encoded = sample_jpegs(args.images, seed=args.seed)
    mean_kib = np.mean([len(e) for e in encoded]) / 1024
    print(
        f"inputs: {len(encoded)} JPEGs {WIDTH}x{HEIGHT} q{QUALITY}, mean {mean_kib:.0f}"
        f" KiB (made in {time.perf_counter() - t0:.1f} s); MoCo v2 two views at 224 px; one image = 2 views"
    )
    print("torchvision path: DataLoader num_workers=0 (main process) at 1 thread, else num_workers=threads\n")

    threads_before = torch.get_num_threads()
    try:
        rows = [measure(encoded, args.batch, t, args.seed) for t in args.threads]
    finally:
        torch.set_num_threads(threads_before)

    lines = [line for row in rows for line in _summarise(row)]
    print(HEADER)
    print("\n".join(lines))
    print(
        f"\nload average {os.getloadavg()[0]:.2f} at end. Wall rates suffer from any background load; img/cpu-s"
        " (images per CPU-second of this process) much less so. Ratios come from the same run."
    )
    for row in rows:
        r, t = row["ratios"], row["threads"]
        print(
            f"threads {t}: DALI/torchvision {r['dali/torchvision']:.2f}x, torch-executor/torchvision"
            f" {r['torch/torchvision']:.2f}x, batched/torchvision {r['batched/torchvision']:.2f}x (wall)"
            f"   reference: DALI/tv-pilblur {r['dali/tv-pilblur']:.2f}x"
        )
        if t == 1:
            cr = row["cpu_rates"]
            ok = r["dali/torchvision"] >= TARGET
            print(
                f"  target DALI >= {TARGET}x torchvision per core: {'MET' if ok else 'NOT met'}"
                f" ({r['dali/torchvision']:.2f}x wall, {cr['dali'] / cr['torchvision']:.2f}x per CPU-second)."
                f" Against tv-pilblur: {r['dali/tv-pilblur']:.2f}x wall,"
                f" {cr['dali'] / cr['tv-pilblur']:.2f}x per CPU-second."
            )
    return {"args": vars(args), "rows": rows}


if __name__ == "__main__":
    main()
