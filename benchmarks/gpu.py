"""GPU throughput of the project against bare, hand-tuned torch: one command, ratios measured in one run, written
to docs/performance.md with the command, the device, the torch version and the date.

    python benchmarks/gpu.py                      # cuda if present, else cpu; ResNet-50, 224 px, batch 256
    python benchmarks/gpu.py --e2e                # also (c): jobs/pretrain.py end to end from JPEG shards
    python benchmarks/gpu.py --quick --device cpu --out /tmp/perf.md   # smoke run (ResNet-18 width 8, 64 px)
    python benchmarks/gpu.py --rows mocov2 co2    # a subset of the step rows
    python benchmarks/gpu.py --help               # every flag (--batch, --iters, --rounds, --workdir, ...)

(a) View executor: views/s of the batched view executor (`make_executor("batched", recipe, batch, torch_device=...)`)
    per recipe (mocov2, simclr, byol, clsa, cocor) on generated 500x375 JPEGs, parameters drawn by
    `sample_views` inside the timed region (the loop pays for both), against the images/s the project's step of
    that recipe's framework consumes (target: >= 2x).
(b) Training step: images/s of a bare, tuned loop written here with torch and torchvision only (two-view forward
    of torchvision's ResNet + projection MLP + the framework's loss + backward + fused SGD, EMA with
    `_foreach_lerp_`, no host syncs) against the project's step (`build_method(cfg)`, `build_optimizer`, and the
    loop's own step, `pipeline.train.step.Stepper`: lr schedule, views to the device, `optimisation_step` = autocast,
    total_loss(), zero_grad, backward, before_optimizer_step, optimizer.step, update_momentum, the plug-ins' own
    optimisers, then the per-step float() of the logged values). Rows: MoCo v2, SimCLR, BYOL, SimSiam, MoCo v3
    and DINO on ViT-S/16 (AdamW), and the seed plug-ins on their experiment's framework (co2,
    clsa, cocor on MoCo v2; invclr on SimCLR). bf16 autocast where the device has it, channels_last and
    cudnn.benchmark on CUDA, pre-made views already on the device. After warm-up steps, the two loops of a row
    are timed in turn (rounds of back-to-back steps, synchronised at both ends; best round kept). Targets:
    project >= 0.97x bare; CO2 <= 1.02x its baseline's step time, CLSA (single strong crop) <= 1.32x, InvCLR <= 2x
    its SimCLR baseline.
(c) End to end (--e2e): `jobs/pretrain.py` in a subprocess on a generated ImageFolder of 500x375 JPEGs sharded with
    `jobs/make_shards.py`, MoCo v2 with (b)'s settings; train/epoch_images_per_s of its last epoch (from its MLflow
    store) against (b)'s project MoCo v2 step fed pre-made tensors.

Both loops of a row compute the same thing: same networks (widths from the composed config), same views (random
tensors of each view's size, with parameters drawn by the project's sampler for 500x375 images), same optimiser
settings. MoCo runs with method.bn_splits=1 (the multi-GPU layout: shuffle by permutation, plain BN) and the
ImageNet queue of 65536 keys (256 with --quick). CoCor uses its learned target on a generated labelled split
(plugin.cocor.labelled_fraction=1.0 of a small split, so its labelled batch is the configured 64): the project
decodes that labelled batch from JPEG in every step, the bare loop reads pre-made tensors.
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import gc
import io
import json
import math
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
import traceback
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

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
EXECUTOR_RECIPES = {"mocov2": "mocov2", "simclr": "simclr", "byol": "byol", "clsa": "clsa", "cocor": "cocor"}
# executor images/s over what the step of the recipe's row consumes (#48: 2x for MoCo v2, 1.5x for the rest)
EXECUTOR_TARGET = {"mocov2": 2.0, "simclr": 1.5, "byol": 1.5, "clsa": 1.5, "cocor": 1.5}
E2E_TARGET = 0.85  # jobs/pretrain.py from JPEG shards >= 0.85x the project step fed pre-made tensors
SRC_W, SRC_H = 500, 375


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


class Deadline:
    """--deadline: a section starts no new row (or recipe) once the next would likely end past it, so that the
    benchmark finishes inside a caller's time cap (make gpu-check) with what it measured so far."""

    def __init__(self, seconds: float | None):
        self.end = None if seconds is None else time.perf_counter() + seconds
        self.longest = 0.0

    def allows_another(self) -> bool:
        return self.end is None or time.perf_counter() + self.longest < self.end

    def took(self, seconds: float) -> None:
        self.longest = max(self.longest, seconds)

    def left(self) -> float | None:
        return None if self.end is None else max(0.0, self.end - time.perf_counter())


NOT_RUN = "not run: past --deadline"


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU ({os.cpu_count()} cores)"


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def free_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


# ============================================================================= generated JPEGs
def _photo_like(seed: int, w: int = SRC_W, h: int = SRC_H) -> np.ndarray:
    """Smooth colour waves, hard-edged rectangles and a little grain: decodes like a photo, not like a flat image."""
    r = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w] / max(h, w)
    img = np.zeros((h, w, 3))
    for c in range(3):
        for _ in range(3):
            fy, fx, ph = r.uniform(0.5, 8), r.uniform(0.5, 8), r.uniform(0, 6)
            img[..., c] += np.sin(2 * np.pi * (fy * yy + fx * xx) + ph)
    img = (img - img.min()) / (img.max() - img.min()) * 255
    for _ in range(6):
        y0, x0 = r.integers(0, h - 20), r.integers(0, w - 20)
        img[y0 : y0 + r.integers(10, 120), x0 : x0 + r.integers(10, 160)] = r.integers(0, 256, 3)
    img += r.normal(0, 6, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


def _jpeg(seed: int) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(_photo_like(seed)).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def _photo_chunk(job: tuple[int, int]) -> list[bytes]:
    """`n` JPEGs of scikit-image's photographs drawn with `seed` (benchmarks/sample_images.py)."""
    from sample_images import sample_jpegs

    n, seed = job
    return sample_jpegs(n, seed=seed)


def make_jpegs(n: int, seed: int = 0) -> tuple[list[bytes], str]:
    """n distinct 500x375 JPEGs (quality 90): scikit-image's sample photographs when installed (the bench extra,
    benchmarks/sample_images.py), else generated photo-like images. Many are made in worker processes."""
    try:
        import sample_images  # noqa: F401
        import skimage.data  # noqa: F401

        make, jobs, source = (
            _photo_chunk,
            [(min(64, n - i), seed * 1_000_003 + i) for i in range(0, n, 64)],
            "scikit-image sample photographs (benchmarks/sample_images.py)",
        )
    except ImportError:
        make, jobs, source = _jpeg, [seed * 1_000_003 + i for i in range(n)], "generated photo-like images"
    if n >= 256 and (os.cpu_count() or 1) > 2:
        with ProcessPoolExecutor(min(16, os.cpu_count() or 1)) as pool:
            made = list(pool.map(make, jobs))
    else:
        made = [make(j) for j in jobs]
    flat = [x for m in made for x in m] if make is _photo_chunk else made
    return flat, source


def make_imagefolder_shards(root: Path, n_train: int, n_val: int, classes: int) -> Path:
    """An ImageFolder tree of 500x375 JPEGs (train/ and val/, `classes` class folders) sharded with
    jobs/make_shards.py into root/shards/{train,val}; reused when already there. Returns the shards folder."""
    shards = root / "shards"
    if (shards / "train" / "manifest.json").exists() and (shards / "val" / "manifest.json").exists():
        return shards
    jpegs, _ = make_jpegs(n_train + n_val, seed=7)
    for split, part in (("train", jpegs[:n_train]), ("val", jpegs[n_train:])):
        for i, data in enumerate(part):
            d = root / "imagefolder" / split / f"class_{i % classes:02d}"
            d.mkdir(parents=True, exist_ok=True)
            (d / f"{i:06d}.jpg").write_bytes(data)
        cmd = [
            sys.executable,
            str(ROOT / "jobs" / "make_shards.py"),
            "source=imagefolder",
            f"input={root / 'imagefolder'}",
            f"output={shards}",
            f"split={split}",
        ]
        done = subprocess.run(cmd, cwd=root, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"make_shards failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    return shards


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
    from pipeline.augment.params import sample_view_params
    from pipeline.augment.view_maker import image_recipe
    from pipeline.augment.views import params_to_tensors

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
    optimizer = build_optimizer(method.online, cfg["optim"], peak)
    plugins = PluginOptimizers(method.plugins)
    return Stepper(method, optimizer, plugins, cfg["optim"], peak, total_steps, 0, None, device, fmt, precision)


# ============================================================================= bare tuned loops: torch + torchvision
# Nothing from `pipeline` below this line: each class writes its method's step by hand.
def bare_backbone(arch: str, width: int) -> tuple[nn.Module, int]:
    """torchvision's ResNet with `fc = Identity`; base width other than 64 by rebuilding its stages."""
    import torchvision
    from torchvision.models import resnet

    block, layers = {
        "resnet18": (resnet.BasicBlock, [2, 2, 2, 2]),
        "resnet34": (resnet.BasicBlock, [3, 4, 6, 3]),
        "resnet50": (resnet.Bottleneck, [3, 4, 6, 3]),
    }[arch]
    net = getattr(torchvision.models, arch)()
    if width != 64:
        net.inplanes = width
        net.conv1 = nn.Conv2d(3, width, kernel_size=7, stride=2, padding=3, bias=False)
        net.bn1 = nn.BatchNorm2d(width)
        for i, n in enumerate(layers):
            setattr(net, f"layer{i + 1}", net._make_layer(block, width * 2**i, n, stride=1 if i == 0 else 2))
    dim = width * 8 * block.expansion
    net.fc = nn.Identity()
    return net, dim


def bare_mlp(in_dim: int, hidden: int, out: int, layers: int, bn: bool, last_bn: bool = False) -> nn.Sequential:
    """(Linear(-BN)-ReLU) x (layers - 1), Linear; `last_bn`: no bias on the output Linear and a no-affine BN after it
    (SimSiam's and MoCo v3's projectors)."""
    mods: list[nn.Module] = []
    d = in_dim
    for _ in range(layers - 1):
        mods += [nn.Linear(d, hidden, bias=not bn)] + ([nn.BatchNorm1d(hidden)] if bn else []) + [nn.ReLU(True)]
        d = hidden
    mods.append(nn.Linear(d, out, bias=not last_bn))
    return nn.Sequential(*mods, *([nn.BatchNorm1d(out, affine=False)] if last_bn else []))


def bare_sgd(
    modules: list[nn.Module], lr: float, momentum: float, wd: float, device: torch.device, decay_all: bool = False
) -> torch.optim.SGD:
    params = [p for m in modules for p in m.parameters() if p.requires_grad]
    kernel = {"fused": True} if device.type == "cuda" else {"foreach": True}
    groups = [
        {"params": [p for p in params if p.ndim > 1 or decay_all], "weight_decay": wd},
        {"params": [p for p in params if p.ndim <= 1 and not decay_all], "weight_decay": 0.0},
    ]
    return torch.optim.SGD([g for g in groups if g["params"]], lr=lr, momentum=momentum, **kernel)


VIT_SPECS = {"vit_tiny": (4, 4, 3, 192, 768), "vit_s16": (16, 12, 6, 384, 1536), "vit_b16": (16, 12, 12, 768, 3072)}


class BareViT(nn.Module):
    """torchvision's VisionTransformer returning the class token, for any crop size (position embedding resized
    bicubically to the crop's patch grid)."""

    def __init__(self, arch: str, size: int, num_heads: int | None = None, drop_path: float = 0.0):
        from torchvision.models.vision_transformer import VisionTransformer

        super().__init__()
        p, layers, heads, dim, mlp = VIT_SPECS[arch]
        heads = num_heads or heads
        self.vit = VisionTransformer(max(p, -(-size // p) * p), p, layers, heads, dim, mlp)
        self.vit.heads = nn.Identity()
        self.grid = self.vit.image_size // p
        self.drop = [drop_path * i / max(1, layers - 1) for i in range(layers)]  # DINO's stochastic depth

    def blocks(self, x):
        if not any(self.drop):
            return self.vit.encoder.layers(x)
        from torchvision.ops import stochastic_depth

        for blk, p in zip(self.vit.encoder.layers, self.drop):
            h = blk.ln_1(x)
            x = x + stochastic_depth(
                blk.dropout(blk.self_attention(h, h, h, need_weights=False)[0]), p, "row", self.training
            )
            x = x + stochastic_depth(blk.mlp(blk.ln_2(x)), p, "row", self.training)
        return x

    def forward(self, x):
        v = self.vit
        t = v.conv_proj(x)
        gh, gw = t.shape[-2:]
        t = torch.cat([v.class_token.expand(x.shape[0], -1, -1), t.flatten(2).transpose(1, 2)], 1)
        pos = v.encoder.pos_embedding
        if (gh, gw) != (self.grid, self.grid):
            g = pos[:, 1:].reshape(1, self.grid, self.grid, -1).permute(0, 3, 1, 2).float()
            g = F.interpolate(g, size=(gh, gw), mode="bicubic", align_corners=False).to(pos.dtype)
            pos = torch.cat([pos[:, :1], g.flatten(2).transpose(1, 2)], 1)
        return v.encoder.ln(self.blocks(t + pos))[:, 0]


def bare_vit(arch: str, size: int, num_heads: int | None = None, drop_path: float = 0.0) -> tuple[nn.Module, int]:
    return BareViT(arch, size, num_heads, drop_path), VIT_SPECS[arch][3]


def bare_adamw(
    modules: list[nn.Module], lr: float, betas, wd: float, device: torch.device, decay_all: bool = False
) -> torch.optim.AdamW:
    params = [p for m in modules for p in m.parameters() if p.requires_grad]
    kernel = {"fused": True} if device.type == "cuda" else {"foreach": True}
    return torch.optim.AdamW(
        [
            {"params": [p for p in params if p.ndim > 1], "weight_decay": wd},
            {"params": [p for p in params if p.ndim <= 1], "weight_decay": wd if decay_all else 0.0},
        ],
        lr=lr,
        betas=tuple(betas),
        **kernel,
    )


def half_cosine(progress: float, start: float, end: float) -> float:
    return end + (start - end) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def frozen_copy(module: nn.Module) -> nn.Module:
    twin = copy.deepcopy(module)
    for p in twin.parameters():
        p.requires_grad_(False)
    return twin


class Bare:
    """autocast(loss) -> zero_grad -> backward -> fused SGD step -> after (EMA, queue, plug-in updates)."""

    def __init__(self, cfg: dict, device: torch.device, precision: str, fmt: torch.memory_format):
        torch.manual_seed(0)
        self.cfg, self.device, self.fmt = cfg, device, fmt
        self.bf16 = precision == "bf16"
        m, model = cfg["method"], cfg["model"]
        self.backbone, self.dim = (
            bare_vit(
                model["backbone"], int(model["image_size"]), model.get("num_heads"), float(model.get("drop_path") or 0)
            )
            if model["backbone"].startswith("vit")
            else bare_backbone(model["backbone"], int(model["width"]))
        )
        head = m["head"]
        self.hidden, self.out_dim = int(head.get("hidden_dim") or self.dim), int(head["out_dim"])
        o, b = cfg["optim"], int(cfg["train"]["batch_size"])
        self.lr, self.momentum, self.wd = float(o["base_lr"]) * b / 256, float(o["momentum"]), float(o["weight_decay"])
        self.steps = 0

    def autocast(self, enabled: bool = True):
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16 and enabled)

    def place(self, *modules: nn.Module) -> None:
        for mod in modules:
            mod.to(self.device, memory_format=self.fmt)

    def __call__(self, images, params) -> None:
        with self.autocast():
            loss = self.loss(images, params)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.before_step()
        self.opt.step()
        self.steps += 1
        with self.autocast():
            self.after(images, params, loss)

    def loss(self, images, params) -> torch.Tensor:
        raise NotImplementedError

    def before_step(self) -> None:
        pass

    def after(self, images, params, loss) -> None:
        pass


class BareMoCo(Bare):
    """MoCo v2: query encoder, momentum key encoder on a permuted batch, InfoNCE against the queue; CO2's and CLSA's
    terms when the row has them."""

    def __init__(self, cfg, device, precision, fmt):
        super().__init__(cfg, device, precision, fmt)
        m, head = cfg["method"], cfg["method"]["head"]
        self.t, self.m = float(m["temperature"]), float(m["momentum"])
        self.online = nn.Sequential(
            self.backbone, bare_mlp(self.dim, self.hidden, self.out_dim, int(head["num_layers"]), bool(head["bn"]))
        )
        self.key = frozen_copy(self.online)
        self.place(self.online, self.key)
        self.online_p, self.key_p = list(self.online.parameters()), list(self.key.parameters())
        self.queue = F.normalize(torch.randn(int(m["queue_size"]), self.out_dim, device=device), dim=1)
        self.ptr = 0
        plugins = cfg.get("plugin") or {}
        self.co2 = (0.3, 0.05) if "co2" in plugins else None  # docs/methods/co2.md §1.6 MoCo v2 constants
        self.clsa = float(plugins["clsa"]["beta"]) if "clsa" in plugins else None
        self.opt = bare_sgd([self.online], self.lr, self.momentum, self.wd, device)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.online(x).float(), dim=1)

    @torch.no_grad()
    def keys(self, x: torch.Tensor) -> torch.Tensor:
        perm = torch.randperm(x.shape[0], device=x.device)
        k = F.normalize(self.key(x[perm]).float(), dim=1)
        out = torch.empty_like(k)
        out[perm] = k
        return out

    def info_nce(self, q, k, queue, t):
        logits = torch.cat([(q * k).sum(1, keepdim=True), q @ queue.t()], 1) / t
        return F.cross_entropy(logits, torch.zeros(q.shape[0], dtype=torch.long, device=q.device))

    def loss(self, images, params):
        q, k = self.embed(images[0]), self.keys(images[1])
        loss = self.info_nce(q, k, self.queue, self.t)
        if self.co2:
            alpha, tc = self.co2
            log_q = F.log_softmax(q @ self.queue.t() / tc, 1)
            log_p = F.log_softmax(k @ self.queue.t() / tc, 1)
            kl = 0.5 * (log_p.exp() * (log_p - log_q)).sum(1) + 0.5 * (log_q.exp() * (log_q - log_p)).sum(1)
            loss = loss + alpha * kl.mean()
        if self.clsa is not None:

            def logits(z):
                return torch.cat([(z * k).sum(1, keepdim=True), z @ self.queue.t()], 1) / self.t

            target = F.softmax(logits(q.detach()), 1)
            ddm = sum(-(target * F.log_softmax(logits(self.embed(x)), 1)).sum(1).mean() for x in images[2:])
            loss = loss + self.clsa * ddm
        self._k = k
        return loss

    @torch.no_grad()
    def after(self, images, params, loss):
        torch._foreach_lerp_(self.key_p, self.online_p, 1 - self.m)
        n = self._k.shape[0]
        self.queue[self.ptr : self.ptr + n] = self._k
        self.ptr = (self.ptr + n) % self.queue.shape[0]


class BareCoCor(BareMoCo):
    """MoCo v2 + CoCor with its learned target: consistency of three composite views with a monotone target network's
    output, a linear head's labelled loss before and after the encoder step, a side-effect-free second forward at
    the new weights (buffers saved and restored with _foreach_copy_), and the target network's step along the
    finite-difference hypergradient; no host syncs."""

    def __init__(self, cfg, device, precision, fmt, n_classes: int, labelled_batch: int):
        super().__init__(cfg, device, precision, fmt)
        pc = cfg["plugin"]["cocor"]
        self.weight, self.hid = float(pc["weight"]), int(pc["hidden"])
        dims = [14, self.hid, self.hid, 1]
        self.raw = nn.ParameterList(nn.Parameter(0.5 * torch.randn(i, o) - 4.0) for i, o in zip(dims, dims[1:]))
        self.bias = nn.ParameterList(nn.Parameter(torch.zeros(o)) for o in dims[1:])
        self.head = nn.Linear(self.dim, n_classes)
        self.mmnn = nn.ModuleList([self.raw, self.bias])
        self.place(self.mmnn, self.head)
        kernel = {"fused": True} if device.type == "cuda" else {"foreach": True}
        self.target_opt = torch.optim.SGD(self.mmnn.parameters(), lr=float(pc["target_lr"]), momentum=0.9, **kernel)
        self.head_opt = torch.optim.SGD(
            self.head.parameters(), lr=float(pc["classifier_lr"]), momentum=0.9, weight_decay=1e-4, **kernel
        )
        self.freeze = int(pc["target_freeze_epochs"])  # steps per epoch = 1 in this benchmark's configs
        g = torch.Generator().manual_seed(1)
        size = int(cfg["data"]["image_size"])
        self.x_lab = torch.randn(labelled_batch, 3, size, size, generator=g).to(device).contiguous(memory_format=fmt)
        self.y_lab = torch.randint(0, n_classes, (labelled_batch,), generator=g).to(device)
        self.buffers = [b for mod in (self.online, self.key) for b in mod.buffers()] + [self.queue]
        self.saved = [torch.empty_like(b) for b in self.buffers]

    def target(self, counts: torch.Tensor) -> torch.Tensor:
        h = counts.float()
        for i, (w, b) in enumerate(zip(self.raw, self.bias)):
            h = h @ F.softplus(w) + b
            h = F.relu(h) if i < len(self.raw) - 1 else h
        return 1.0 - F.softplus(h.squeeze(-1))

    def similarities(self, images):
        with torch.no_grad():
            anchor = F.normalize(self.embed(images[0]) + self.embed(images[1]), dim=1)
        return [(self.embed(x) * anchor).sum(1) for x in images[2:]]

    def outer(self, grad_head: bool) -> torch.Tensor:
        self.backbone.eval()
        with torch.no_grad():
            h = self.backbone(self.x_lab).float()
        self.backbone.train()
        with torch.set_grad_enabled(grad_head):
            return F.cross_entropy(self.head(F.normalize(h, dim=1)), self.y_lab)

    @staticmethod
    def consistency(sims, targets):
        return sum(F.softplus(g.mean() - s.mean()) for s, g in zip(sims, targets))

    def loss(self, images, params):
        loss = super().loss(images, params)
        sims = self.similarities(images)
        with torch.no_grad():
            self._g = [self.target(p["counts"]) for p in params[2:]]
        self._s = torch.stack([s.detach().mean() for s in sims]).float()
        self._ce = self.outer(grad_head=False)
        return loss + self.weight * self.consistency(sims, self._g)

    def after(self, images, params, loss):
        super().after(images, params, loss)
        torch._foreach_copy_(self.saved, self.buffers)
        with torch.no_grad():  # L_u and s at the new weights; every buffer put back after
            lu = self.info_nce(self.embed(images[0]), self.keys(images[1]), self.queue, self.t)
            sims = self.similarities(images)
            lu_after = lu + self.weight * self.consistency(sims, self._g)
        torch._foreach_copy_(self.buffers, self.saved)
        s_after = torch.stack([s.mean() for s in sims]).float()
        ce_after = self.outer(grad_head=True)
        g_bar = torch.stack([self.target(p["counts"]).mean() for p in params[2:]]).float()
        denom = lu_after.detach() - loss.detach()
        denom = torch.where(denom.abs() < 1e-4, torch.where(denom >= 0, 1e-4, -1e-4), denom)
        ratio = (ce_after.detach() - self._ce) / denom
        k = (s_after - g_bar).detach()
        coef = (-torch.sigmoid(k) * (1 - torch.sigmoid(k)) * ratio * (s_after - self._s)).detach()
        self.target_opt.zero_grad(set_to_none=True)
        self.head_opt.zero_grad(set_to_none=True)
        ((coef * g_bar).sum() + ce_after).backward()
        grads = [p.grad for p in [*self.mmnn.parameters(), *self.head.parameters()]]
        finite = torch.isfinite(torch.stack(torch._foreach_norm(grads))).all()
        for g in grads:  # a non-finite outer loss moves nothing (no host sync to skip the step)
            g.copy_(torch.where(finite, g, 0.0))
        if self.steps >= self.freeze:  # the project's target lr is 0 for its first updates
            self.target_opt.step()
        self.head_opt.step()


class BareSimCLR(Bare):
    """SimCLR: one forward over both views, NT-Xent in float32; with InvCLR, the colour distortion of both views in
    the step (view 0 differentiable in its alpha) and the gradient penalty on view 0's features (double backward)."""

    def __init__(self, cfg, device, precision, fmt):
        super().__init__(cfg, device, precision, fmt)
        head = cfg["method"]["head"]
        self.t = float(cfg["method"]["temperature"])
        self.head = bare_mlp(self.dim, self.hidden, self.out_dim, int(head["num_layers"]), bool(head["bn"]))
        self.place(self.backbone, self.head)
        self.opt = bare_sgd([self.backbone, self.head], self.lr, self.momentum, self.wd, device)
        inv = (cfg.get("plugin") or {}).get("invclr")
        self.invclr = inv
        if inv:
            aug = cfg["augment"]
            self.mean = torch.tensor(aug["mean"], device=device).view(1, 3, 1, 1)
            self.std = torch.tensor(aug["std"], device=device).view(1, 3, 1, 1)
            b, c, s, h = aug["jitter"]
            self.lo = torch.tensor([1 - b, 1 - c, 1 - s, -h], device=device)
            self.hi = torch.tensor([1 + b, 1 + c, 1 + s, h], device=device)
            self.gen = torch.Generator(device=device).manual_seed(0)
            self.luma = torch.tensor([0.299, 0.587, 0.114], device=device).view(1, 3, 1, 1)
            self.yiq = torch.tensor(
                [[0.299, 0.587, 0.114], [0.5959, -0.2746, -0.3213], [0.2115, -0.5227, 0.3112]], device=device
            )
            self.rgb = torch.tensor([[1.0, 0.956, 0.619], [1.0, -0.272, -0.647], [1.0, -1.106, 1.703]], device=device)

    def gray(self, x):
        return (x * self.luma).sum(1, keepdim=True)

    def colour(self, x, p, alpha):
        """Brightness, contrast, saturation, YIQ hue (clipped after each), gated by jitter_on; grayscale; normalise."""
        b, c, s, h = (a.view(-1, 1, 1, 1) for a in alpha.unbind(1))
        y = (x * b).clamp(0, 1)
        y = (c * y + (1 - c) * self.gray(y).mean((2, 3), keepdim=True)).clamp(0, 1)
        y = (s * y + (1 - s) * self.gray(y)).clamp(0, 1)
        theta = 2 * math.pi * h.view(-1)
        cos, sin, one, zero = theta.cos(), theta.sin(), torch.ones_like(theta), torch.zeros_like(theta)
        rot = torch.stack([one, zero, zero, zero, cos, -sin, zero, sin, cos], 1).view(-1, 3, 3)
        y = torch.einsum("bij,bjhw->bihw", self.rgb @ rot @ self.yiq, y).clamp(0, 1)
        y = torch.where(p["jitter_on"].bool().view(-1, 1, 1, 1), y, x)
        y = torch.where(p["gray"].bool().view(-1, 1, 1, 1), self.gray(y).expand_as(y), y)
        return (y - self.mean) / self.std

    def loss(self, images, params):
        x1, x2 = images[0], images[1]
        alpha = None
        if self.invclr:
            with torch.autocast(self.device.type, enabled=False):
                alphas = [
                    torch.stack([p[k].float() for k in ("brightness", "contrast", "saturation", "hue")], 1)
                    for p in params[:2]
                ]
                alpha = alphas[0].clone().requires_grad_(True)
                x1 = self.colour(x1, params[0], alpha).contiguous(memory_format=self.fmt)
                x2 = self.colour(x2, params[1], alphas[1]).contiguous(memory_format=self.fmt)
        b = x1.shape[0]
        h = self.backbone(torch.cat([x1, x2]))
        z = F.normalize(self.head(h).float(), dim=1)
        logits = (z @ z.t() / self.t).masked_fill(torch.eye(2 * b, dtype=torch.bool, device=z.device), float("-inf"))
        target = torch.cat([torch.arange(b, 2 * b), torch.arange(b)]).to(z.device)
        loss = F.cross_entropy(logits, target)
        if self.invclr:
            inv = self.invclr
            feats = h[:b].float()
            e = torch.randint(0, 2, feats.shape, device=feats.device, generator=self.gen).float() * 2 - 1
            (grad,) = torch.autograd.grad((e * F.normalize(feats, dim=1)).sum(), alpha, create_graph=True)
            u = torch.rand(b, int(inv["n_samples"]), 4, device=feats.device, generator=self.gen)
            prime = self.lo + u * (self.hi - self.lo)
            penalty = ((prime - alpha.unsqueeze(1)) * grad.unsqueeze(1)).sum(-1).pow(2).mean()
            loss = loss + float(inv["lam"]) * penalty.clamp(max=float(inv["clip"]))
        return loss


class BarePredictorTarget(Bare):
    """What BYOL's and MoCo v3's loops share: online backbone + projector + predictor, one forward per view, an EMA
    target of backbone + projector (cosine momentum to 1); `pair_loss(prediction, target)` is each method's own."""

    def networks(self, projector: nn.Module, predictor: nn.Module, total_steps: int) -> None:
        self.base_m, self.total = float(self.cfg["method"]["momentum"]), total_steps
        self.online = nn.Sequential(self.backbone, projector)
        self.predictor = predictor
        self.target = frozen_copy(self.online)
        self.place(self.online, self.predictor, self.target)
        self.online_p, self.target_p = list(self.online.parameters()), list(self.target.parameters())

    def pair_loss(self, p: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def loss(self, images, params):
        p1 = self.predictor(self.online(images[0])).float()
        p2 = self.predictor(self.online(images[1])).float()
        with torch.no_grad():
            t1, t2 = self.target(images[0]).float(), self.target(images[1]).float()
        return self.pair_loss(p1, t2) + self.pair_loss(p2, t1)

    @torch.no_grad()
    def after(self, images, params, loss):
        m = half_cosine(self.steps / self.total, self.base_m, 1.0)
        torch._foreach_lerp_(self.target_p, self.online_p, 1 - m)


class BareBYOL(BarePredictorTarget):
    """BYOL: 2 - 2 cos(prediction, target) both ways, SGD."""

    def __init__(self, cfg, device, precision, fmt, total_steps: int):
        super().__init__(cfg, device, precision, fmt)
        head, pred = cfg["method"]["head"], cfg["method"].get("predictor") or {}
        self.networks(
            bare_mlp(self.dim, self.hidden, self.out_dim, int(head["num_layers"]), bool(head["bn"])),
            bare_mlp(
                self.out_dim,
                int(pred.get("hidden_dim") or self.hidden),
                self.out_dim,
                int(pred.get("num_layers", 2)),
                bool(pred.get("bn", True)),
            ),
            total_steps,
        )
        self.opt = bare_sgd([self.online, self.predictor], self.lr, self.momentum, self.wd, device)

    @staticmethod
    def pair_loss(p, z):
        return (2 - 2 * (F.normalize(p, dim=1) * F.normalize(z.detach(), dim=1)).sum(1)).mean()


class BareSimSiam(Bare):
    """SimSiam: projector with BN on every layer (no-affine BN on the output), bottleneck predictor, stop-gradient."""

    def __init__(self, cfg, device, precision, fmt):
        super().__init__(cfg, device, precision, fmt)
        head, pred = cfg["method"]["head"], cfg["method"].get("predictor") or {}
        self.projector = bare_mlp(self.dim, self.hidden, self.out_dim, int(head["num_layers"]), True, last_bn=True)
        self.predictor = bare_mlp(
            self.out_dim,
            int(pred.get("hidden_dim") or max(1, self.out_dim // 4)),
            self.out_dim,
            int(pred.get("num_layers", 2)),
            bool(pred.get("bn", True)),
        )
        self.place(self.backbone, self.projector, self.predictor)
        self.opt = bare_sgd([self.backbone, self.projector, self.predictor], self.lr, self.momentum, self.wd, device)

    @staticmethod
    def d(p, z):
        return -(F.normalize(p, dim=1) * F.normalize(z.detach(), dim=1)).sum(1).mean()

    def loss(self, images, params):
        z1, z2 = self.projector(self.backbone(images[0])), self.projector(self.backbone(images[1]))
        p1, p2 = self.predictor(z1).float(), self.predictor(z2).float()
        return 0.5 * self.d(p1, z2.float()) + 0.5 * self.d(p2, z1.float())


class BareMoCoV3(BarePredictorTarget):
    """MoCo v3 on a ViT: frozen random patch projection, fixed sine-cosine position embedding, BN MLP heads (3-layer
    projector with a no-affine output BN, 2-layer predictor), 2τ-scaled InfoNCE against the batch's keys both ways,
    cosine momentum 0.99 -> 1, AdamW."""

    def __init__(self, cfg, device, precision, fmt, total_steps: int):
        super().__init__(cfg, device, precision, fmt)
        self.t = float(cfg["method"]["temperature"] or 0.2)
        conv = self.backbone.vit.conv_proj
        conv.weight.requires_grad_(False)
        conv.bias.requires_grad_(False)
        if cfg["model"].get("pos_embedding") == "sincos":  # the paper's fixed 2-D sine-cosine position embedding
            from pipeline.models.backbones import sincos_position_embedding

            pos = self.backbone.vit.encoder.pos_embedding
            with torch.no_grad():
                pos.copy_(sincos_position_embedding(self.backbone.grid, pos.shape[-1]).unsqueeze(0))
            pos.requires_grad_(False)
        self.networks(
            bare_mlp(self.dim, self.hidden, self.out_dim, 3, True, last_bn=True),
            bare_mlp(self.out_dim, self.hidden, self.out_dim, 2, True, last_bn=True),  # MoCo_ViT's predictor
            total_steps,
        )
        decay_all = bool(cfg["optim"].get("decay_bias_and_norm"))
        self.opt = bare_adamw([self.online, self.predictor], self.lr, cfg["optim"]["betas"], self.wd, device, decay_all)

    def pair_loss(self, q, k):
        logits = F.normalize(q, dim=1) @ F.normalize(k, dim=1).t() / self.t
        return 2 * self.t * F.cross_entropy(logits, torch.arange(q.shape[0], device=q.device))


class BareDINO(Bare):
    """DINO on a ViT: 3-layer GELU head, normalised bottleneck, weight-normalised prototypes; the teacher (EMA,
    cosine 0.996 -> 1) on the two global crops, the student on every crop (one forward per crop size); centring,
    teacher temperature warm-up, per-tensor gradient clipping, the prototypes frozen in the first epoch, AdamW
    with the weight decay on a cosine."""

    def __init__(self, cfg, device, precision, fmt, total_steps: int):
        super().__init__(cfg, device, precision, fmt)
        m, head, o = cfg["method"], cfg["method"]["head"], cfg["optim"]
        hidden, bott, k = int(head["hidden_dim"]), int(head["bottleneck_dim"]), int(head["out_dim"])
        self.mlp = nn.Sequential(
            nn.Linear(self.dim, hidden), nn.GELU(), nn.Linear(hidden, hidden), nn.GELU(), nn.Linear(hidden, bott)
        )
        self.prototypes = nn.Linear(bott, k, bias=False)
        self.student = nn.ModuleDict({"backbone": self.backbone, "mlp": self.mlp, "prototypes": self.prototypes})
        self.teacher = frozen_copy(self.student)
        if isinstance(self.backbone, BareViT):
            self.teacher["backbone"].drop = [0.0] * len(self.backbone.drop)  # the teacher drops no path
        self.place(self.student, self.teacher)
        self.center = torch.zeros(1, k, device=device)
        self.s_p, self.t_p = list(self.student.parameters()), list(self.teacher.parameters())
        self.total, self.epochs = total_steps, int(cfg["train"]["epochs"])
        self.base_m, self.clip = float(m["momentum"]), float(m["clip_grad"])
        self.temps = (float(m["warmup_teacher_temperature"]), float(m["teacher_temperature"]))
        self.warm = min(1.0, float(m["warmup_teacher_epochs"]) / self.epochs)
        self.freeze = float(m["freeze_last_layer_epochs"]) / self.epochs
        self.wd_range = (float(o["weight_decay"]), float(o["weight_decay_end"]))
        self.opt = bare_adamw([self.student], self.lr, o["betas"], self.wd, device)

    @staticmethod
    def head(net, h):
        z = F.normalize(net["mlp"](h), dim=1)
        return F.linear(z, F.normalize(net["prototypes"].weight, dim=1))

    def loss(self, images, params):
        progress = self.steps / self.total
        self.opt.param_groups[0]["weight_decay"] = half_cosine(progress, *self.wd_range)
        tt = (
            self.temps[1]
            if progress >= self.warm
            else self.temps[0] + (self.temps[1] - self.temps[0]) * progress / self.warm
        )
        outs, i = [], 0
        while i < len(images):
            j = i + 1
            while j < len(images) and images[j].shape[-1] == images[i].shape[-1]:
                j += 1
            outs += self.head(self.student, self.student["backbone"](torch.cat(images[i:j]))).float().chunk(j - i)
            i = j
        with torch.no_grad():
            t = self.head(self.teacher, self.teacher["backbone"](torch.cat(images[:2]))).float()
            targets = F.softmax((t - self.center) / tt, 1).chunk(2)
        logs = [F.log_softmax(o / 0.1, 1) for o in outs]
        terms = [-(p * logs[v]).sum(1).mean() for g, p in enumerate(targets) for v in range(len(logs)) if v != g]
        self.center.mul_(0.9).add_(t.mean(0, keepdim=True), alpha=0.1)
        return sum(terms) / len(terms)

    @torch.no_grad()
    def before_step(self):
        if (self.steps + 1) / self.total <= self.freeze + 1e-9:
            self.prototypes.weight.grad = None
        grads = [p.grad for p in self.s_p if p.grad is not None]
        norms = torch.stack(torch._foreach_norm(grads))
        torch._foreach_mul_(grads, list((self.clip / (norms + 1e-6)).clamp(max=1.0).unbind(0)))

    @torch.no_grad()
    def after(self, images, params, loss):
        m = half_cosine(self.steps / self.total, self.base_m, 1.0)
        torch._foreach_lerp_(self.t_p, self.s_p, 1 - m)


def bare_runner(row: str, cfg: dict, device, precision, fmt, total_steps: int, s: dict) -> Callable:
    kind = cfg["method"]["kind"]
    if kind == "mocov3":
        return BareMoCoV3(cfg, device, precision, fmt, total_steps)
    if kind == "dino":
        return BareDINO(cfg, device, precision, fmt, total_steps)
    if row == "cocor":
        n_classes = len(json.loads((Path(cfg["data"]["train"]) / "manifest.json").read_text())["class_names"])
        return BareCoCor(cfg, device, precision, fmt, n_classes, s["cocor_labelled_batch"])
    if kind == "moco":
        return BareMoCo(cfg, device, precision, fmt)
    if kind == "simclr":
        return BareSimCLR(cfg, device, precision, fmt)
    if kind == "byol":
        return BareBYOL(cfg, device, precision, fmt, total_steps)
    if kind == "simsiam":
        return BareSimSiam(cfg, device, precision, fmt)
    raise ValueError(f"no bare loop for {row} ({kind})")


# ============================================================================= (b) step throughput
def images_per_s(step: Callable, images, params, batch: int, iters: int, device) -> float:
    """Throughput of `iters` back-to-back steps, synchronised only at both ends."""
    sync(device)
    t0 = time.perf_counter()
    for _ in range(iters):
        step(images, params)
    sync(device)
    return batch * iters / (time.perf_counter() - t0)


def trainable(opt: torch.optim.Optimizer) -> list[tuple[int, int]]:
    """(tensors, elements) per non-empty param group: what the two loops of a row must both train."""
    return [(len(g["params"]), sum(p.numel() for p in g["params"])) for g in opt.param_groups if g["params"]]


def measure_rows(
    rows: list[str],
    s: dict,
    device,
    precision: str,
    fmt,
    workdir: Path,
    deadline: Deadline | None = None,
    after_row: Callable[[dict], None] | None = None,
) -> dict:
    """{row: {"bare": img/s, "project": img/s, "views": n, "error": str|None}}; `after_row(results so far)` once
    each row is done, so that a caller's time cap loses no finished row."""
    results = {}
    total = s["warmup"] + s["iters"] * s["rounds"]
    deadline = deadline or Deadline(None)
    for row in rows:
        t0 = time.perf_counter()
        res = results[row] = {"bare": math.nan, "project": math.nan, "views": 0, "error": None, "same_params": None}
        if not deadline.allows_another():
            res["error"] = NOT_RUN
            print(f"  {row:8s} {NOT_RUN}", flush=True)
            continue
        try:
            data_root = None
            if row == "cocor":
                data_root = make_imagefolder_shards(workdir / "cocor_data", s["cocor_images"], 8, s["classes"])
            cfg = row_config(row, s, data_root)
            images, params = premade_views(cfg, s["batch"], device, fmt)
            res["views"] = len(images)
            runners = {
                "bare": bare_runner(row, cfg, device, precision, fmt, total, s),
                "project": project_runner(copy.deepcopy(cfg), device, precision, fmt, total),
            }
            shapes = {"bare": trainable(runners["bare"].opt), "project": trainable(runners["project"].optimizer)}
            res["same_params"] = shapes["bare"] == shapes["project"]
            for run in runners.values():  # warm-up: cudnn autotuning, allocator, lazy state
                for _ in range(s["warmup"]):
                    run(images, params)
            rates = {k: [] for k in runners}
            for _ in range(s["rounds"]):  # blocks in turn, so a passing load slows both alike; best block kept
                for which, run in runners.items():
                    rates[which].append(images_per_s(run, images, params, s["batch"], s["iters"], device))
            res.update({k: max(v) for k, v in rates.items()})
            del runners
            free_memory(device)
        except Exception as e:  # one failing row (out of memory, say) does not lose the others
            res["error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
            traceback.print_exc()
            free_memory(device)
        deadline.took(time.perf_counter() - t0)
        print(
            f"  {row:8s} bare {res['bare']:9.1f} img/s   project {res['project']:9.1f} img/s   "
            f"ratio {res['project'] / res['bare']:.3f}   ({time.perf_counter() - t0:.1f} s)"
            + (f"   FAILED {res['error']}" if res["error"] else ""),
            flush=True,
        )
        if after_row:
            after_row(results)
    return results


# ============================================================================= (a) gpu view executor
def measure_executor(s: dict, device, jpegs: list[bytes], deadline: Deadline | None = None) -> dict:
    """{recipe: {"images_s": .., "views_s": .., "views": n}} or {"unavailable": reason}; recipes past the deadline
    are left out."""
    from pipeline.augment.params import sample_views
    from pipeline.augment.view_maker import image_recipe
    from pipeline.config import compose_config

    try:
        from pipeline.augment.views import make_executor
    except ImportError as e:
        return {"unavailable": f"{type(e).__name__}: {e}"}
    out = {}
    batch = min(s["batch"], len(jpegs))
    batches = [jpegs[i : i + batch] for i in range(0, len(jpegs) - batch + 1, batch)]
    deadline = deadline or Deadline(None)
    for name, recipe_name in EXECUTOR_RECIPES.items():
        if not deadline.allows_another():
            print(f"  {name:8s} {NOT_RUN}", flush=True)
            continue
        t_recipe = time.perf_counter()
        aug = compose_config([f"augment={recipe_name}", "data=imagenet", f"data.image_size={s['size']}"])["augment"]
        recipe = image_recipe(aug)
        try:
            executor = make_executor("batched", recipe, batch, torch_device=device)
        except (ValueError, TypeError, ImportError, NotImplementedError, KeyError) as e:
            return {"unavailable": f"{type(e).__name__}: {e}"}
        rng = np.random.default_rng(0)

        def run(encoded):
            views, kept = executor(encoded, sample_views(encoded, recipe, rng))  # noqa: F821 (deleted after use)
            if len(kept) != len(encoded):
                raise RuntimeError(f"batched executor dropped {len(encoded) - len(kept)} of {len(encoded)} images")
            return views

        views = run(batches[0])  # warm-up: kernels, caches, pinned buffers
        sync(device)
        t0 = time.perf_counter()
        n = 0
        for b in batches:
            views = run(b)
            n += len(b)
        sync(device)
        wall = time.perf_counter() - t0
        out[name] = {"images_s": n / wall, "views_s": n * len(views) / wall, "views": len(views)}
        print(f"  {name:8s} {n / wall:9.1f} images/s  {n * len(views) / wall:9.1f} views/s", flush=True)
        if name == "mocov2":  # where the executor's time goes (on an H100 it made half what the step consumes)
            out[name].update(_executor_parts(batches, recipe, device))
            parts = out[name]
            print(
                f"  {'':8s} of which: drawing the parameters {parts['params_images_s']:9.1f} images/s, decoding "
                f"{parts['decode_images_s']:9.1f} images/s (each alone)",
                flush=True,
            )
        del executor, views
        free_memory(device)
        deadline.took(time.perf_counter() - t_recipe)
    return out


def _executor_parts(batches: list[list[bytes]], recipe, device) -> dict:
    """The executor's two fixed parts timed alone over the same batches: drawing the views' parameters (host, numpy)
    and decoding the JPEGs (nvJPEG on a GPU); the crops, resizes and colour ops take the rest of its time."""
    from pipeline.augment.decode import decode_batch
    from pipeline.augment.params import sample_views

    rng = np.random.default_rng(0)
    n = sum(len(b) for b in batches)
    t0 = time.perf_counter()
    for b in batches:
        sample_views(b, recipe, rng)
    params_s = time.perf_counter() - t0
    decode_batch(batches[0], np.arange(len(batches[0])), device)  # warm-up
    sync(device)
    t0 = time.perf_counter()
    for b in batches:
        decode_batch(b, np.arange(len(b)), device)
    sync(device)
    decode_s = time.perf_counter() - t0
    return {"params_images_s": n / params_s, "decode_images_s": n / decode_s}


# ============================================================================= (c) end to end
def measure_e2e(s: dict, device, workdir: Path, deadline: Deadline | None = None) -> dict:
    """jobs/pretrain.py (MoCo v2, (b)'s settings) on generated JPEG shards; its last train/epoch_images_per_s. The
    job's output is streamed with the seconds since its start and stopped at the deadline."""
    import mlflow
    from capped import run_capped

    t_data = time.perf_counter()
    data = make_imagefolder_shards(workdir / "e2e_data", s["e2e_images"], max(s["batch"], 16), s["classes"])
    name = f"gpu-bench-e2e-{dt.datetime.now().strftime('%Y%m%d-%H%M%S')}"
    uri = f"sqlite:///{workdir / 'mlflow.db'}"
    cmd = [
        sys.executable,
        str(ROOT / "jobs" / "pretrain.py"),
        "data=imagenet",
        f"data.train={data / 'train'}",
        f"data.val={data / 'val'}",
        f"trainer.use_gpu={'true' if device.type == 'cuda' else 'false'}",
        "trainer.num_workers=1",
        f"model.backbone={s['backbone']}",
        "model.cifar_stem=false",
        f"model.width={s['width']}",
        f"data.image_size={s['size']}",
        f"train.batch_size={s['batch']}",
        f"train.epochs={s['e2e_epochs']}",
        "method=mocov2",
        "method.bn_splits=1",
        f"method.queue_size={s['queue']}",
        "eval.knn.every=0",
        "eval.probe.after_pretrain=false",
        "gallery.at_pretrain=false",
        f"paths.root={workdir}",
        f"tracking.uri={uri}",
        f"run.name={name}",
    ]
    print(f"  {s['e2e_images']} JPEGs made and sharded in {time.perf_counter() - t_data:.0f} s", flush=True)
    left = (deadline or Deadline(None)).left()
    # in the work folder: with an explicit tracking.uri MLflow puts artifacts under ./mlruns of the working directory
    done = run_capped("jobs/pretrain.py", cmd, 3600.0 if left is None else left, workdir / "e2e.log", workdir, "  ")
    wall = done["seconds"]
    if done["rc"]:
        tail = done["text"].strip().splitlines()[-5:]
        why = f"stopped at the deadline after {wall:.0f} s" if done["capped"] else f"exited {done['rc']}"
        return {"error": f"jobs/pretrain.py {why}: " + " | ".join(tail), "command": cmd}
    client = mlflow.MlflowClient(uri)
    exp = client.get_experiment_by_name("augssl")
    runs = client.search_runs([exp.experiment_id], filter_string=f"tags.mlflow.runName = '{name}'")
    history = sorted(client.get_metric_history(runs[0].info.run_id, "train/epoch_images_per_s"), key=lambda m: m.step)
    return {
        "per_epoch": [m.value for m in history],
        "images_s": history[-1].value,
        "wall_s": wall,
        "command": cmd,
        "images": s["e2e_images"],
    }


# ============================================================================= report
def _fmt(x: float, spec: str = ".1f") -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def _verdict(ok: bool | None) -> str:
    return "" if ok is None else (" met" if ok else " NOT met")


def report(meta: dict, s: dict, steps: dict, executor: dict | None, e2e: dict | None) -> str:
    lines = [
        "# Performance",
        "",
        "Written by `benchmarks/gpu.py`; every ratio below comes from the one run described here. "
        "Rerun the command to refresh it.",
        "",
        f"- command: `{meta['command']}`",
        f"- device: {meta['device']}",
        f"- torch {meta['torch']}, torchvision {meta['torchvision']}, python {meta['python']}",
        f"- date: {meta['date']}",
        f"- step settings: {s['backbone']} width {s['width']}, {s['size']} px, batch {s['batch']}, "
        f"{meta['precision']} autocast, channels_last {meta['channels_last']}, cudnn.benchmark "
        f"{meta['cudnn_benchmark']}, torch CPU threads {meta['threads']}; {s['warmup']} warm-up steps, then "
        f"{s['rounds']} rounds of {s['iters']} timed steps per loop (bare and project in turn, best round "
        f"kept); MoCo: bn_splits 1, queue {s['queue']}; the ViT rows: "
        f"{'vit_tiny' if s['quick'] else 'ViT-S/16'}, their papers' recipes (AdamW, DINO's 2 + 6 crops)",
        "",
        "## Training step: the project's against a bare tuned loop",
        "",
        "images/s = samples per second (each sample is all of the row's views). project/bare: target >= "
        f"{PROJECT_TARGET}. Cost = the row's step time / its baseline framework's (project loop; the bare "
        "loop's in brackets).",
        "",
        "| row | framework | views | bare img/s | project img/s | project/bare | target | cost vs baseline "
        "| cost target |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row, r in steps.items():
        ratio = r["project"] / r["bare"] if r["bare"] and not r["error"] else math.nan
        base = BASELINE.get(row)
        cost, cost_t = "–", "–"
        if base and base in steps and not r["error"] and not steps[base]["error"]:
            c = steps[base]["project"] / r["project"]
            cb = steps[base]["bare"] / r["bare"]
            target = COST_TARGET.get(row)
            cost = f"{c:.3f}x vs {base} ({cb:.3f}x)"
            cost_t = f"<= {target}x{_verdict(c <= target)}" if target else "–"
        elif base:
            cost = f"– ({base} not measured)"
            cost_t = f"<= {COST_TARGET[row]}x" if row in COST_TARGET else "–"
        framework = base if base else row
        status = f">= {PROJECT_TARGET}x{_verdict(ratio >= PROJECT_TARGET if not math.isnan(ratio) else None)}"
        if r["error"]:
            status = f"failed: {r['error'][:120]}"
        lines.append(
            f"| {row} | {framework} | {r['views']} | {_fmt(r['bare'])} | {_fmt(r['project'])} | "
            f"{_fmt(ratio, '.3f')} | {status} | {cost} | {cost_t} |"
        )
    differ = [row for row, r in steps.items() if r["same_params"] is False]
    unchecked = [row for row, r in steps.items() if r["same_params"] is None]
    lines += [
        "",
        (
            "Trainable parameters (tensors and elements per optimiser group): identical in both loops of every "
            "measured row."
            if not differ
            else f"Trainable parameters DIFFER between the loops of: {', '.join(differ)}."
        )
        + (f" Not checked: {', '.join(unchecked)}." if unchecked else ""),
    ]
    lines += ["", "## View executor (batched)", ""]
    if executor is None:
        lines.append("Not run (--skip-executor).")
    elif "unavailable" in executor:
        lines.append(f"batched executor: not available ({executor['unavailable']}).")
    else:
        lines += [
            f"{meta['exec_images']} JPEGs of {SRC_W}x{SRC_H} ({meta['jpeg_source']}), batches of "
            f"{min(s['batch'], meta['exec_images'])}, {s['size']} px; parameters drawn inside the timed region. "
            "Step consumes = the project step's images/s for that recipe's row; target >= 2x for mocov2, 1.5x else.",
            "",
            "| recipe | views | images/s | views/s | step consumes img/s | executor/step | target |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        for name, r in executor.items():
            step = steps.get(name, {}).get("project", math.nan)
            ratio = r["images_s"] / step if step and not math.isnan(step) else math.nan
            ok = None if math.isnan(ratio) else ratio >= EXECUTOR_TARGET[name]
            lines.append(
                f"| {name} | {r['views']} | {_fmt(r['images_s'])} | {_fmt(r['views_s'])} | {_fmt(step)} | "
                f"{_fmt(ratio, '.2f')} | >= {EXECUTOR_TARGET[name]}x{_verdict(ok)} |"
            )
    lines += ["", "## End to end: jobs/pretrain.py from JPEG shards", ""]
    if e2e is None:
        lines.append("Not run: add `--e2e`.")
    elif "skipped" in e2e:
        lines.append(f"Not run: {e2e['skipped']}.")
    elif "error" in e2e:
        lines += [f"Failed: {e2e['error']}", "", f"`{shlex.join(e2e['command'])}`"]
    else:
        step = e2e.get("step", steps.get("mocov2", {}).get("project", math.nan))  # the same run's mocov2 row
        ratio = e2e["images_s"] / step if step and not math.isnan(step) else math.nan
        e2e_verdict = _verdict(None if math.isnan(ratio) else ratio >= E2E_TARGET)
        lines += [
            f"`{shlex.join(e2e['command'])}`",
            "",
            f"{e2e['images']} training JPEGs ({SRC_W}x{SRC_H}), epoch_images_per_s per epoch: "
            + ", ".join(f"{v:.1f}" for v in e2e["per_epoch"])
            + f" (wall {e2e['wall_s']:.0f} s with start-up).",
            "",
            "| path | images/s |",
            "| --- | --- |",
            f"| jobs/pretrain.py, last epoch | {_fmt(e2e['images_s'])} |",
            f"| project step on pre-made tensors (mocov2 row) | {_fmt(step)} |",
            f"| end to end / step | {_fmt(ratio, '.3f')} (target >= {E2E_TARGET}x{e2e_verdict}) |",
        ]
    return "\n".join(lines) + "\n"


# ============================================================================= main
def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default=None, help="cuda | cpu | cuda:N (default: cuda if available, else cpu)")
    ap.add_argument(
        "--out", default=str(ROOT / "docs" / "performance.md"), help="report path (default docs/performance.md)"
    )
    ap.add_argument("--quick", action="store_true", help="tiny sizes for a CPU smoke run")
    ap.add_argument("--e2e", action="store_true", help="also run jobs/pretrain.py end to end (section c)")
    ap.add_argument("--rows", nargs="+", choices=ROWS, default=list(ROWS), help="step rows (default: all)")
    ap.add_argument("--skip-executor", action="store_true", help="leave out section (a)")
    ap.add_argument("--workdir", default=None, help="generated data and the e2e run (default: a temporary folder)")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    ap.add_argument("--deadline", type=float, default=None, help="seconds: start no row or recipe likely to end later")
    ap.add_argument("--json", default=None, help="also write the measurements as JSON here (make gpu-check reads it)")
    for k, t in (
        ("backbone", str),
        ("width", int),
        ("size", int),
        ("batch", int),
        ("warmup", int),
        ("iters", int),
        ("rounds", int),
        ("queue", int),
        ("exec_images", int),
        ("e2e_images", int),
        ("e2e_epochs", int),
    ):
        ap.add_argument(f"--{k.replace('_', '-')}", type=t, default=None, help=f"override the {k} of the chosen mode")
    args = ap.parse_args(argv)
    argv_used = list(sys.argv[1:] if argv is None else argv)
    command = "python benchmarks/gpu.py" + (" " + shlex.join(argv_used) if argv_used else "")

    import torchvision

    from pipeline.train.precision import resolve_precision

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if args.threads:
        torch.set_num_threads(args.threads)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    s = settings(args)
    precision = resolve_precision("auto", device)
    fmt = torch.channels_last if device.type == "cuda" else torch.contiguous_format
    meta = {
        "command": command,
        "device": device_name(device),
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "python": platform.python_version(),
        "date": dt.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "precision": precision,
        "channels_last": fmt == torch.channels_last,
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "exec_images": s["exec_images"],
        "threads": torch.get_num_threads(),
    }
    print(
        f"command: {command}\ndevice: {meta['device']}; torch {meta['torch']}; {meta['date']}\nsettings: {s}",
        flush=True,
    )
    rows = [r for r in ROWS if r in args.rows]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    result = {"meta": meta, "settings": s, "steps": {}, "executor": None, "e2e": None, "partial": True}

    def save() -> None:
        """The JSON as measured so far: a caller's time cap (make gpu-check) loses only what was still running."""
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=1, default=str) + "\n")

    with tempfile.TemporaryDirectory(prefix="gpu-bench-") as tmp:
        workdir = Path(args.workdir or tmp).resolve()
        workdir.mkdir(parents=True, exist_ok=True)
        deadline = Deadline(args.deadline)
        if not args.skip_executor:  # first: the views were never measured on a GPU before a cap cut them off
            print("(a) gpu view executor", flush=True)
            jpegs, meta["jpeg_source"] = make_jpegs(s["exec_images"])
            result["executor"] = measure_executor(s, device, jpegs, deadline)
            if "unavailable" in result["executor"]:
                print(f"batched executor: not available ({result['executor']['unavailable']})", flush=True)
            save()
        print("(b) training step, bare vs project", flush=True)

        def after_row(steps: dict) -> None:
            result["steps"] = steps
            save()

        result["steps"] = measure_rows(rows, s, device, precision, fmt, workdir, deadline, after_row)
        if args.e2e:
            print("(c) end to end", flush=True)
            e2e = measure_e2e(s, device, workdir, deadline)
            e2e["step"] = result["steps"].get("mocov2", {}).get("project", math.nan)
            print(f"  {e2e['error']}" if "error" in e2e else f"  {e2e['images_s']:.1f} img/s", flush=True)
            result["e2e"] = e2e
    result["partial"] = False
    save()
    text = report(meta, s, result["steps"], result["executor"], result["e2e"])
    out.write_text(text)
    print("\n" + text + f"\nwritten to {out}", flush=True)
    return result


if __name__ == "__main__":
    main()
