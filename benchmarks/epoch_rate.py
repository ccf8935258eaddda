"""An epoch's rate on one machine: the project's loop against a bare PyTorch loop of the same recipe, side by side.

Rows (the same MoCo v2 method from `jobs/pretrain.py data=photos`'s config, the same initial weights, optimiser,
precision and `optimisation_step`; the same Photos images, 32 px PNGs, held in memory as encoded bytes):

  project          the training loop's data path: the view maker (executor=auto: the batched executor on a CPU,
                   DALI's GPU pipeline on CUDA where DALI sees it) run by a producer thread `train.views_ahead`
                   batches ahead (made_ahead), the step on the main thread
  project-serial   the same with views_ahead=0: views made in series with the step (the loop before #29, which
                   also took DALI on a CPU: augment.executor=dali)
  bare             a plain single-process loop: for each batch, PIL decode and torchvision's MoCo v2 transforms
                   twice per image in the loop (RandomResizedCrop, RandomApply(ColorJitter, 0.8), RandomGrayscale,
                   RandomApply(blur, 0.5) with PIL's GaussianBlur as MoCo v2's code blurs, flip, ToTensor,
                   Normalize), torch.stack, then the step

The rows take turns epoch by epoch (project, project-serial, bare, project, ...) so background load hits them
alike; the first epoch of each is a warm-up and is not counted. Each row's split: `step` (seconds in
optimisation_step), `views` (making views; the producer thread's for `project`, hidden behind the step as far as
the cores allow), `wait` (the step loop waiting for views: what overlap did not hide). Outside Ray: what this
measures is the loop's data path, not Ray Train's worker thread (docs/measured.md says what that costs).

    python benchmarks/epoch_rate.py [--images 2048] [--epochs 3] [--batch 256] [--threads 2] [--json out.json]
    python benchmarks/epoch_rate.py --images 256 --batch 64 --epochs 2    # smoke run, well under a minute
"""

from __future__ import annotations

import argparse
import io
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from augment import PilGaussianBlur  # noqa: E402

from pipeline.augment.view_makers import build_view_maker  # noqa: E402
from pipeline.build import build_method, complete_method  # noqa: E402
from pipeline.config import compose_config  # noqa: E402
from pipeline.data.photos import iter_photos  # noqa: E402
from pipeline.schedules import scaled_lr  # noqa: E402
from pipeline.schema import validate  # noqa: E402
from pipeline.train.optim import build_optimizer  # noqa: E402
from pipeline.train.precision import resolve_precision  # noqa: E402
from pipeline.train.prefetch import Timing, made_ahead, views_threads  # noqa: E402
from pipeline.train.step import optimisation_step, to_device  # noqa: E402

ROWS = ("project", "project-serial", "bare")
TARGET = 1.0  # the issue's: the project's epoch rate >= 1.0x the bare loop's on this CPU


def photos_config(overrides: list[str]) -> dict:
    """The pretraining config for one worker on Photos, with the values prepare.resolve derives (BN groups)."""
    cfg = compose_config(["data=photos", "trainer.num_workers=1", *overrides])
    cfg["method"].update(complete_method(validate(cfg)))
    return cfg


def bare_transform(aug: dict):
    """The recipe as torchvision transforms on PIL images, with the config's own numbers."""
    import torchvision.transforms as T

    return T.Compose(
        [
            T.RandomResizedCrop(aug["size"], scale=tuple(aug["scale"]), ratio=tuple(aug["ratio"])),
            T.RandomApply([T.ColorJitter(*aug["jitter"])], p=aug["p_jitter"]),
            T.RandomGrayscale(p=aug["p_gray"]),
            T.RandomApply([PilGaussianBlur(tuple(aug["blur_sigma"]))], p=aug["p_blur"]),
            T.RandomHorizontalFlip(p=aug["p_flip"]),
            T.ToTensor(),
            T.Normalize(aug["mean"], aug["std"]),
        ]
    )


def bare_views(encoded: list[bytes], transform, n_views: int) -> list[torch.Tensor]:
    from PIL import Image

    views: list[list[torch.Tensor]] = [[] for _ in range(n_views)]
    for b in encoded:
        with Image.open(io.BytesIO(b)) as im:
            img = im.convert("RGB")
        for v in range(n_views):
            views[v].append(transform(img))
    return [torch.stack(v) for v in views]


class Row:
    """One row's method, optimiser and data path; `epoch()` runs one pass over the images and returns its split."""

    def __init__(self, name: str, cfg: dict, batches: list[dict], device: torch.device, threads: int):
        torch.manual_seed(cfg["seed"])  # every row starts from the same weights
        self.name, self.cfg, self.batches, self.device = name, cfg, batches, device
        self.method = build_method(cfg).to(device)
        lr = scaled_lr(cfg["optim"]["base_lr"], cfg["train"]["batch_size"])
        self.optimizer = build_optimizer(self.method.online, cfg["optim"], lr)
        self.precision = resolve_precision(cfg["train"]["precision"], device)
        aug = cfg["augment"]
        batch = len(batches[0]["png"])
        self.depth = int(cfg["train"]["views_ahead"]) if name == "project" else 0
        self.threads = views_threads(threads, self.depth)  # what the training loop gives the views
        self.maker = (
            None
            if name == "bare"
            else build_view_maker(aug, batch, num_threads=self.threads, seed=cfg["seed"], device=device)
        )
        self.transform = bare_transform(aug) if name == "bare" else None
        self.n_views = int(aug.get("n_views", 2))
        self.rng = np.random.default_rng(cfg["seed"])
        self.losses: list[float] = []

    def make(self, batch: dict) -> list[torch.Tensor]:
        if self.name == "bare":
            return bare_views(list(batch["png"]), self.transform, self.n_views)
        return self.maker(batch, self.rng).images

    def epoch(self) -> dict[str, float]:
        """One pass; the views come through made_ahead for every row (bare and project-serial at depth 0, in the
        loop), so the three rows' splits are measured the same way."""
        step_s = 0.0
        timing = Timing()
        t0 = time.monotonic()
        for images in made_ahead(self.batches, self.make, self.depth, timing, self.device, self.threads):
            t_step = time.monotonic()
            images, _ = to_device(list(images), None, self.device)
            out = optimisation_step(self.method, self.optimizer, images, None, self.precision, self.device, 0.5)
            self.losses.append(float(out["loss"].detach()))  # a host sync: the step has finished when this returns
            step_s += time.monotonic() - t_step
        split = timing.as_dict()
        return {
            "wall_s": time.monotonic() - t0,
            "step_s": step_s,
            "views_s": split["views_s"],
            "wait_s": split["wait_s"],
        }


def measure(images: int, batch: int, epochs: int, threads: int, overrides: list[str], save: Path | None = None) -> dict:
    """The rows' totals over `epochs` timed passes; with `save`, the result so far is written after every timed pass
    (marked partial until the last), so a run stopped at a time cap keeps what it measured."""
    torch.set_num_threads(threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cfg = photos_config([f"train.batch_size={batch}", *overrides])
    gen = cfg["data"]["generate"]
    samples = list(iter_photos(images - images % batch, gen["seed"], "train", gen["size"]))
    batches = [
        {"png": np.array([s["png"] for s in samples[i : i + batch]], dtype=object)}
        for i in range(0, len(samples), batch)
    ]
    rows = {name: Row(name, cfg, batches, device, threads) for name in ROWS}
    totals = {name: {"wall_s": 0.0, "step_s": 0.0, "views_s": 0.0, "wait_s": 0.0, "images": 0} for name in ROWS}
    views = rows["project"].maker
    result = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "executor": type(getattr(views, "executor", views)).__name__,
        "threads": threads,
        "batch": batch,
        "images": len(samples),
        "views_ahead": int(cfg["train"]["views_ahead"]),
        "rows": totals,
    }
    for e in range(epochs + 1):  # epoch 0 warms up: DALI allocates, oneDNN picks kernels
        for name in ROWS:
            split = rows[name].epoch()
            print(f"  epoch {e}{' (warm-up)' if e == 0 else ''} {name:<15s} {_split_text(split, len(samples))}")
            if e:
                for k, v in split.items():
                    totals[name][k] += v
                totals[name]["images"] += len(samples)
        if e:
            for name in ROWS:
                t = totals[name]
                t["images_per_s"] = t["images"] / t["wall_s"]
                t["loss_finite"] = bool(np.isfinite(rows[name].losses).all())
            result.update(
                epochs=e,
                partial=e < epochs,
                ratio=totals["project"]["images_per_s"] / totals["bare"]["images_per_s"],
                overlap_gain=totals["project"]["images_per_s"] / totals["project-serial"]["images_per_s"],
            )
            if save:
                save.write_text(json.dumps(result, indent=1))
    return result


def _split_text(s: dict, images: int) -> str:
    return (
        f"{images / s['wall_s']:7.1f} img/s  step {s['step_s']:6.2f} s  views {s['views_s']:6.2f} s  "
        f"wait {s['wait_s']:6.2f} s"
    )


def report(result: dict) -> str:
    lines = [
        f"device {result['device']}, views by {result['executor']}, {result['threads']} threads, batch "
        f"{result['batch']}, {result['images']} images x {result['epochs']} epochs (after one warm-up epoch)",
        f"{'row':<15s} {'img/s':>7s} {'step s':>7s} {'views s':>8s} {'wait s':>7s} {'vs bare':>8s}",
    ]
    bare = result["rows"]["bare"]["images_per_s"]
    for name, r in result["rows"].items():
        lines.append(
            f"{name:<15s} {r['images_per_s']:7.1f} {r['step_s']:7.2f} {r['views_s']:8.2f} {r['wait_s']:7.2f} "
            f"{r['images_per_s'] / bare:7.2f}x"
        )
    verdict = "met" if result["ratio"] >= TARGET else "NOT met"
    lines.append(
        f"project / bare = {result['ratio']:.3f} (target >= {TARGET}: {verdict}); views ahead / in series = "
        f"{result['overlap_gain']:.3f}"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=2048, help="Photos train images per epoch")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--epochs", type=int, default=3, help="timed epochs per row, after one warm-up epoch")
    ap.add_argument("--threads", type=int, default=2, help="torch intra-op threads (and DALI's)")
    ap.add_argument("--json", type=Path, help="also write the result here")
    ap.add_argument("overrides", nargs="*", help="config overrides, e.g. model.width=32 train.views_ahead=2")
    args = ap.parse_args(argv)
    if args.images < args.batch:
        raise SystemExit(f"error: --images {args.images} is less than one batch of {args.batch}")
    result = measure(args.images, args.batch, args.epochs, args.threads, args.overrides, args.json)
    print(report(result))
    return result


if __name__ == "__main__":
    main()
