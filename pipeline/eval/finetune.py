"""Semi-supervised fine-tuning: the whole network (backbone and a new linear head) trained on a labelled subset,
scored on the validation split (docs/finetune.md).

The papers' protocol (CO2 A.2, after MoCo and PIRL): SGD with momentum, one learning rate for the pretrained
backbone and a larger one for the randomly initialised head, both multiplied by `gamma` at the milestone epochs;
random-resized crop and horizontal flip for training, the un-augmented eval view for scoring; BatchNorm trains
too. Classification reports top-1 and top-5, regression (Spirograph's factors) MSE and R² per target.
"""

from __future__ import annotations

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
from pipeline.eval.linear_probe import regression_scores


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


def optimiser(model: Classifier, s: Schedule) -> tuple[torch.optim.SGD, torch.optim.lr_scheduler.MultiStepLR]:
    """SGD with the backbone's and the head's learning rates, the step decay applied per epoch."""
    opt = torch.optim.SGD(
        [
            {"params": model.backbone.parameters(), "lr": s.lr_backbone},
            {"params": model.head.parameters(), "lr": s.lr_head},
        ],
        lr=s.lr_backbone,
        momentum=s.momentum,
        weight_decay=s.weight_decay,
    )
    return opt, torch.optim.lr_scheduler.MultiStepLR(opt, list(s.milestones), s.gamma)


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
    opt, sched = optimiser(model, s)
    start = 0
    if ckpt is not None and ckpt.exists():
        saved = torch.load(ckpt, map_location=device, weights_only=False)
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
        sched.load_state_dict(saved["sched"])
        start = saved["epoch"]
        print(f"[finetune] resuming after epoch {start} from {ckpt}", flush=True)
    model.train()
    for epoch in range(start, s.epochs):
        gen = torch.Generator().manual_seed(seed * 100_003 + epoch)  # per epoch: a resumed run draws the same
        total, seen = 0.0, 0
        for idx in batches(len(train.encoded), s.batch_size, gen):
            x = train_view([train.encoded[i] for i in idx.tolist()], size, mean, std, s.crop_scale, s.flip, gen)
            loss = loss_of(model(x.to(device)), ys[idx].to(device), task)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            total, seen = total + float(loss.detach()) * len(idx), seen + len(idx)
        lr = opt.param_groups[0]["lr"]  # the epoch's own, before the step to the next epoch's
        sched.step()
        if not math.isfinite(total):
            raise FloatingPointError(f"fine-tuning loss is {total} in epoch {epoch + 1}: lower the learning rates")
        log(epoch + 1, {"loss": total / max(seen, 1), "lr_backbone": lr})
        if ckpt is not None:
            ckpt.parent.mkdir(parents=True, exist_ok=True)
            torch.save(
                {"model": model.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict(), "epoch": epoch + 1},
                ckpt,
            )
    return scores(model, val, size, mean, std, task, device)


def out_dim(train: Split, task: str) -> int:
    """Classes (from the manifest's names, else the labels) or regression targets."""
    if task == "classification":
        return max(len(train.names), int(np.max(train.y)) + 1)
    return int(train.y.shape[1])
