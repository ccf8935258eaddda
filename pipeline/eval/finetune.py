"""Semi-supervised fine-tuning: the whole network (backbone and a new linear head) trained on a labelled subset,
scored on the validation split (docs/finetune.md).

The papers' protocol (CO2 A.2, after MoCo and PIRL): SGD with momentum, one learning rate for the pretrained
backbone and a larger one for the randomly initialised head, both multiplied by `gamma` at the milestone epochs;
random-resized crop and horizontal flip for training, the un-augmented eval view for scoring; BatchNorm trains
too. Classification reports top-1 and top-5, regression (Spirograph's factors) MSE and R² per target.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence, cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torchvision.transforms import InterpolationMode
from torchvision.transforms.v2 import RandomResizedCrop
from torchvision.transforms.v2 import functional as TF

from pipeline.augment.torch_exec import decode_rgb, eval_images, eval_transform
from pipeline.data.reader import Split
from pipeline.eval.probe.lbfgs import regression_scores


@dataclass
class Schedule:
    epochs: int
    batch_size: int
    lr_backbone: float
    lr_head: float
    milestones: Sequence[int]
    gamma: float
    momentum: float
    weight_decay: float
    crop_scale: Sequence[float]  # RandomResizedCrop's area range; (1, 1) with flip=False is no augmentation
    flip: bool
    clip_grad_norm: float | None = None  # each parameter's gradient norm at most this (None: no clipping)
    precise_bn: bool = False  # BatchNorm's statistics recomputed over the labelled subset's eval views before scoring
    head_lr_cap: bool = (
        False  # lr_head at most HEAD_STABLE / E||f||^2 of the labelled subset's features (stable_head_lr)
    )


def train_view(
    encoded: Sequence[bytes], size: int, mean, std, scale: Sequence[float], flip: bool, gen: torch.Generator
) -> torch.Tensor:
    """The fine-tuning view of each image: a random-resized crop at `size` (area in `scale`, aspect 3/4-4/3) and a
    horizontal flip with probability 1/2, normalised. Undecodable images were dropped when the split was loaded."""
    rows = []
    for e in encoded:
        img = decode_rgb(e)
        if tuple(scale) == (1.0, 1.0):
            x = eval_images([img], size, mean, std)[0]
        else:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=gen)))
                top, left, h, w = RandomResizedCrop.get_params(img, list(scale), [3 / 4, 4 / 3])
            x = TF.resized_crop(
                img.float() / 255.0,
                top,
                left,
                h,
                w,
                [size, size],
                interpolation=InterpolationMode.BILINEAR,
                antialias=True,
            )
            x = TF.normalize(x, mean=list(mean), std=list(std))
        if flip and bool(torch.rand((), generator=gen) < 0.5):
            x = x.flip(-1)
        rows.append(x)
    return torch.stack(rows)


def decodable(split: Split) -> tuple[Split, list[int]]:
    """The split without the images that do not decode (counted by the caller), and the indices it kept."""
    keep = [i for i, e in enumerate(split.encoded) if _decodes(e)]
    return Split([split.encoded[i] for i in keep], split.y[keep], split.names), keep


def _decodes(e: bytes) -> bool:
    try:
        decode_rgb(e)
    except RuntimeError:
        return False
    return True


class Classifier(nn.Module):
    """The backbone with a linear head on its pooled features (head: N(0, 0.01) weights, zero bias, as MoCo's)."""

    def __init__(self, backbone: nn.Module, out_dim: int):
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(cast(int, backbone.feat_dim), out_dim)  # build_backbone's feat_dim
        nn.init.normal_(self.head.weight, std=0.01)
        nn.init.zeros_(self.head.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        """Outputs in the targets' units (a regression head trains on z-scored targets)."""
        out = self(x)
        if hasattr(self.head, "target_mean"):
            out = out * self.head.target_std + self.head.target_mean
        return out


def optimiser(model: Classifier, s: Schedule) -> torch.optim.SGD:
    """SGD with the backbone's and the head's learning rates (finetune sets them each epoch: lr_factor)."""
    return torch.optim.SGD(
        [
            {"params": model.backbone.parameters(), "lr": s.lr_backbone},
            {"params": model.head.parameters(), "lr": s.lr_head},
        ],
        lr=s.lr_backbone,
        momentum=s.momentum,
        weight_decay=s.weight_decay,
    )


def lr_factor(s: Schedule, epoch: int) -> float:
    """Both learning rates' multiplier in `epoch` (from 0): gamma for each milestone passed."""
    return s.gamma ** sum(epoch >= m for m in s.milestones)


HEAD_STABLE = 2.0


@torch.no_grad()
def mean_sq_norm(backbone: nn.Module, x: torch.Tensor) -> float:
    """E||f||^2 of the backbone's features of `x`, BatchNorm on the batch's statistics as in training (on a copy:
    the backbone's running statistics stay as they are)."""
    f = copy.deepcopy(backbone).train()(x).float()
    return float((f**2).sum(1).mean())


def stable_head_lr(lr: float, sq_norm: float) -> float:
    """`lr` capped where a linear head on features of mean squared norm `sq_norm` takes stable steps: plain
    gradient descent on a least-squares head diverges past lr = 2 / lambda_max of the features' second moment
    (heavy-ball momentum beta moves it to 2(1 + beta) / lambda_max), and lambda_max <= E||f||^2; softmax cross-entropy's
    curvature is at most half of that. The papers' head lr (1.0) is set for ImageNet features of small norm; a
    backbone whose pooled features have E||f||^2 in the thousands (a ResNet-50 trained briefly) diverges there."""
    return min(lr, HEAD_STABLE / max(sq_norm, 1e-12))


def clip_each_(params, max_norm: float | None) -> None:
    """Each parameter's gradient scaled down to L2 norm `max_norm` at most (detectron2's SOLVER.CLIP_GRADIENTS with
    CLIP_TYPE "norm": both detection engines and fine-tuning clip alike); None: no clipping."""
    if max_norm:
        for p in params:
            if p.grad is not None:
                nn.utils.clip_grad_norm_(p, max_norm)


def loss_of(out: torch.Tensor, y: torch.Tensor, task: str) -> torch.Tensor:
    return F.cross_entropy(out, y) if task == "classification" else F.mse_loss(out, y)


def batches(n: int, batch_size: int, gen: torch.Generator) -> list[torch.Tensor]:
    """A shuffled epoch's index batches; a last batch of one sample is dropped (BatchNorm cannot train on it)."""
    order = torch.randperm(n, generator=gen)
    out = [order[i : i + batch_size] for i in range(0, n, batch_size)]
    return [b for b in out if len(b) > 1] or out


@torch.no_grad()
def scores(
    model: nn.Module, val: Split, size: int, mean, std, task: str, device: torch.device, batch_size: int = 256
) -> dict[str, float]:
    """Classification: {"top1", "top5"} (top-5 with at least 6 classes); regression: {"mse", "r2", "mse_<t>",
    "r2_<t>"}. The eval view, BatchNorm in eval mode."""
    was = model.training
    model.eval()
    outs = []
    for i in range(0, len(val.encoded), batch_size):
        x, _ = eval_transform(val.encoded[i : i + batch_size], size, mean, std)
        outs.append(getattr(model, "predict", model)(x.to(device)).float().cpu())
    model.train(was)
    out = torch.cat(outs)
    y = torch.as_tensor(val.y)
    if task == "classification":
        res = {"top1": float((out.argmax(1) == y).float().mean())}
        if out.shape[1] > 5:
            res["top5"] = float((out.topk(5, dim=1).indices == y[:, None]).any(1).float().mean())
        return res
    return regression_scores(out, y, val.names)


def finetune(
    backbone: nn.Module,
    train: Split,
    val: Split,
    task: str,
    out_dim: int,
    s: Schedule,
    size: int,
    mean,
    std,
    device: torch.device,
    seed: int,
    ckpt: Path | None = None,
    log: Callable[[int, dict], None] = lambda epoch, m: None,
) -> dict[str, float]:
    """Fine-tune `backbone` with a new head on `train`, score on `val`. With `ckpt`, the state after every epoch
    is saved there and a run that stopped part-way resumes from it (same seed: the same batches)."""
    torch.manual_seed(seed)
    model = Classifier(backbone, out_dim).to(device)
    ys = torch.as_tensor(train.y)
    if task == "regression":  # trained on z-scored targets (the heads' lr is set for unit-scale outputs), scored
        mu, sd = ys.mean(0), ys.std(0).clamp_min(1e-6)  # in the targets' own units
        ys = (ys - mu) / sd
        model.head.register_buffer("target_mean", mu.to(device))
        model.head.register_buffer("target_std", sd.to(device))
    if s.head_lr_cap:
        x, _ = eval_transform(train.encoded[: s.batch_size], size, mean, std)
        sq = mean_sq_norm(model.backbone, x.to(device))
        lr_head = stable_head_lr(s.lr_head, sq)
        if lr_head < s.lr_head:
            print(
                f"[finetune] head lr {s.lr_head:g} -> {lr_head:.3g}: the features' mean squared norm is {sq:.4g} "
                f"(a linear head is stable below {HEAD_STABLE:g} / that; lr_head=<number> sets it)",
                flush=True,
            )
        s = dataclasses.replace(s, lr_head=lr_head, head_lr_cap=False)
    opt = optimiser(model, s)
    start = 0
    if ckpt is not None and ckpt.exists():
        saved = torch.load(ckpt, map_location=device, weights_only=False)
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
        start = saved["epoch"]
        print(f"[finetune] resuming after epoch {start} from {ckpt}", flush=True)
    model.train()
    for epoch in range(start, s.epochs):
        gen = torch.Generator().manual_seed(seed * 100_003 + epoch)  # per epoch: a resumed run draws the same
        total, seen = 0.0, 0
        for group, base in zip(opt.param_groups, (s.lr_backbone, s.lr_head)):
            group["lr"] = base * lr_factor(s, epoch)
        for idx in batches(len(train.encoded), s.batch_size, gen):
            x = train_view([train.encoded[i] for i in idx.tolist()], size, mean, std, s.crop_scale, s.flip, gen)
            loss = loss_of(model(x.to(device)), ys[idx].to(device), task)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            clip_each_(model.parameters(), s.clip_grad_norm)
            opt.step()
            total, seen = total + float(loss.detach()) * len(idx), seen + len(idx)
        if not math.isfinite(total):
            raise FloatingPointError(f"fine-tuning loss is {total} in epoch {epoch + 1}: lower the learning rates")
        log(
            epoch + 1,
            {
                "loss": total / max(seen, 1),
                "lr_backbone": opt.param_groups[0]["lr"],
                "lr_head": opt.param_groups[1]["lr"],
            },
        )
        if ckpt is not None:
            ckpt.parent.mkdir(parents=True, exist_ok=True)
            torch.save(
                {"model": model.state_dict(), "opt": opt.state_dict(), "epoch": epoch + 1},
                ckpt,
            )
    if s.precise_bn:
        precise_bn_(model, train.encoded, size, mean, std, s.batch_size, device)
    return scores(model, val, size, mean, std, task, device)


@torch.no_grad()
def precise_bn_(model: nn.Module, encoded: Sequence[bytes], size: int, mean, std, batch_size: int, device) -> None:
    """Every BatchNorm's running statistics set to their averages over `encoded`'s eval views (precise BN): a
    fine-tuning of a few dozen steps leaves them mostly where they started, and scoring in eval mode uses them. Each
    batch weighs by its size (momentum n / seen-so-far), so the running mean is the subset's own mean exactly and
    the variance the mean of the batches' variances: the batches are drawn at random (seeded), as training's are,
    for that to be the subset's variance (class-sorted batches would leave out the variance between classes)."""
    bns = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    momenta, was = [m.momentum for m in bns], model.training
    for m in bns:
        m.reset_running_stats()
    model.train()
    order = torch.randperm(len(encoded), generator=torch.Generator().manual_seed(0)).tolist()
    for i in range(0, len(encoded), batch_size):
        x, _ = eval_transform([encoded[j] for j in order[i : i + batch_size]], size, mean, std)
        for m in bns:
            m.momentum = len(x) / (i + len(x))
        model(x.to(device))
    for m, mo in zip(bns, momenta):
        m.momentum = mo
    model.train(was)


def out_dim(train: Split, task: str) -> int:
    """Classes (from the manifest's names, else the labels) or regression targets."""
    if task == "classification":
        return max(len(train.names), int(np.max(train.y)) + 1)
    return int(train.y.shape[1])
