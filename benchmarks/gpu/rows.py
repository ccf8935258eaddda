"""The rows of the step benchmark and their targets, the settings of a run, each row's composed config, its
pre-made views, and the project's step it times (pipeline.train.step.Stepper)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
import torch

from .data import SRC_H, SRC_W

FRAMEWORK_ROWS = ("mocov2", "simclr", "byol", "simsiam", "mocov3_vit", "dino_vit")
PLUGIN_ROWS = ("co2", "clsa", "cocor", "invclr")  # InvCLR last: its double backward is the slowest row
ROWS = FRAMEWORK_ROWS + PLUGIN_ROWS
BASELINE = {"co2": "mocov2", "clsa": "mocov2", "invclr": "simclr", "cocor": "mocov2"}
# config overrides of each row (on top of the common ones); plug-ins use their experiment's config
ROW_OVERRIDES = {
    "mocov2": ["method=mocov2", "augment=mocov2"],
    "simclr": ["method=simclr", "augment=simclr"],
    "byol": ["method=byol", "augment=byol"],
    "simsiam": ["method=simsiam", "augment=mocov2"],
    "co2": ["+experiment=co2_mocov2"],
    "clsa": ["+experiment=clsa_mocov2"],
    "invclr": ["+experiment=invclr_simclr"],
    "cocor": ["+experiment=cocor_mocov2"],
    "mocov3_vit": ["+experiment=mocov3_vit"],
    "dino_vit": ["+experiment=dino_vit"],
}
VIT_ROWS = {"mocov3_vit", "dino_vit"}  # ViT-S/16 (vit_tiny with --quick), whatever --backbone says
PROJECT_TARGET = 0.97  # project step >= 0.97x the bare loop
COST_TARGET = {"co2": 1.02, "clsa": 1.32, "invclr": 2.0}  # plug-in step time / its baseline's
# row -> recipe (and the step row its views feed); "+fuse": augment.fuse=true, the photometric stage compiled
EXECUTOR_RECIPES = {
    "mocov2": "mocov2",
    "mocov2+fuse": "mocov2",
    "simclr": "simclr",
    "byol": "byol",
    "clsa": "clsa",
    "cocor": "cocor",
}
# executor images/s over what the step of the recipe's row consumes (#48: 2x for MoCo v2, 1.5x for the rest)
EXECUTOR_TARGET = {"mocov2": 2.0, "mocov2+fuse": 2.0, "simclr": 1.5, "byol": 1.5, "clsa": 1.5, "cocor": 1.5}
E2E_TARGET = 0.85  # jobs/pretrain.py from JPEG shards >= 0.85x the project step fed pre-made tensors


# ============================================================================= settings
def settings(args) -> dict:
    quick = args.quick
    s = {
        "backbone": "resnet18" if quick else "resnet50",
        "width": 8 if quick else 64,
        "size": 64 if quick else 224,
        "batch": 16 if quick else 256,
        "warmup": 1 if quick else 10,
        "iters": 2 if quick else 10,
        "rounds": 1 if quick else 3,
        "queue": 256 if quick else 65536,
        "exec_images": 32 if quick else 1024,
        "cocor_images": 32 if quick else 256,
        "cocor_labelled_batch": 16 if quick else 64,
        "e2e_images": 64 if quick else 5120,
        "e2e_epochs": 2 if quick else 3,
        "classes": 4 if quick else 8,
        "quick": quick,
    }
    for k in (
        "backbone",
        "width",
        "size",
        "batch",
        "warmup",
        "iters",
        "rounds",
        "queue",
        "exec_images",
        "e2e_images",
        "e2e_epochs",
    ):
        if getattr(args, k, None) is not None:
            s[k] = getattr(args, k)
    if s["queue"] % s["batch"]:
        raise SystemExit(f"--queue {s['queue']} must be a multiple of --batch {s['batch']}")
    return s


# ============================================================================= configs and views
def row_config(row: str, s: dict, data_root: Path | None = None) -> dict:
    from pipeline.config import compose_config

    backbone = ("vit_tiny" if s["quick"] else "vit_s16") if row in VIT_ROWS else s["backbone"]
    over = ROW_OVERRIDES[row] + [
        "data=imagenet",
        f"data.image_size={s['size']}",
        f"model.backbone={backbone}",
        "model.cifar_stem=false",
        f"model.width={s['width']}",
        f"train.batch_size={s['batch']}",
        "seed=0",
    ]
    if row == "dino_vit" and s["quick"]:
        over += ["method.head.out_dim=256", "method.head.hidden_dim=128", "method.head.bottleneck_dim=64"]
    if row == "mocov3_vit" and s["quick"]:
        over += ["method.head.hidden_dim=256"]
    if row in ("mocov2", "co2", "clsa", "cocor"):
        over += ["method.bn_splits=1", f"method.queue_size={s['queue']}"]
    if row == "cocor":
        over += [
            f"data.train={data_root / 'train'}",
            f"data.val={data_root / 'val'}",
            "plugin.cocor.labelled_fraction=1.0",
            f"plugin.cocor.labelled_batch={s['cocor_labelled_batch']}",
        ]
    return compose_config(over)


def premade_views(cfg: dict, batch: int, device: torch.device, fmt: torch.memory_format, seed: int = 0):
    """One batch of every view of the row's recipe, already on the device, and the parameters the project's sampler
    draws for 500x375 images (on the device too). Views whose colour stage runs in the model (InvCLR) are in [0, 1],
    the others normalised-looking noise."""
    from pipeline.augment.executors import params_to_tensors
    from pipeline.augment.params import sample_view_params
    from pipeline.augment.view_makers import image_recipe

    recipe = image_recipe(cfg["augment"])
    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(seed)
    images, params = [], []
    for spec in recipe.views:
        x = torch.rand(batch, 3, spec.size, spec.size, generator=gen)
        if spec.color_stage != "model":
            x = (x - 0.45) / 0.225
        images.append(x.to(device).contiguous(memory_format=fmt))
        params.append(params_to_tensors(sample_view_params([(SRC_H, SRC_W)] * batch, spec, rng), device))
    return images, params


# ============================================================================= the project's step
def project_runner(
    cfg: dict, device: torch.device, precision: str, fmt: torch.memory_format, total_steps: int
) -> Callable:
    """The loop's own step without Ray (pipeline.train.step.Stepper) on build_method + build_optimizer, as
    `_Trainer` makes them: the lr schedule, the views to the device, optimisation_step, every logged value read."""
    from pipeline.build import build_method
    from pipeline.schedules import scaled_lr
    from pipeline.sections import Optim
    from pipeline.train.optim import build_optimizer
    from pipeline.train.plugin_optim import PluginOptimizers
    from pipeline.train.step import Stepper

    torch.manual_seed(0)
    method = build_method(cfg)
    method.to(device, memory_format=fmt)
    method.train()
    peak = scaled_lr(cfg["optim"]["base_lr"], cfg["train"]["batch_size"])
    # SimSiam's fixed-lr predictor left in the common groups, as the bare loop has it: the same parameters per group
    # in both loops (checked per row), and a group's lr changes no work of the step
    optim = Optim.of(cfg["optim"])
    optimizer = build_optimizer(method.online, optim, peak)
    plugins = PluginOptimizers(method.plugins)
    return Stepper(method, optimizer, plugins, optim, peak, total_steps, 0, None, device, fmt, precision)
