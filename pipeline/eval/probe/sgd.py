"""MoCo's linear-probe schedule, for sets too large for full-batch L-BFGS: a linear layer trained by SGD on frozen
features read from disk in shuffled mini-batches (MoCo: lr 30, momentum 0.9, no weight decay, 100 epochs, x0.1
after epochs 60 and 80, batch 256; the schedule is eval.probe.sgd). The features are used as they are, as in MoCo;
the large learning rate is what makes that work for contrastive features.

One difference from MoCo's protocol: MoCo feeds the frozen backbone a fresh random-resized crop and flip of every
image each epoch; here each image's features are extracted once, from its centre view. That is what makes the
probe one extraction plus cheap epochs, and it usually scores a little below MoCo's numbers."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from pipeline.eval.probe.lbfgs import regression_scores


@dataclass
class SgdSchedule:
    epochs: int
    lr: float
    milestones: Sequence[int]
    gamma: float
    momentum: float
    weight_decay: float
    batch_size: int


def _rows(a: np.ndarray, idx: np.ndarray) -> torch.Tensor:
    """Rows of a (memory-mapped) array, read in index order (sequential on disk), returned in `idx`'s order."""
    order = np.argsort(idx)
    out = np.empty((len(idx), *a.shape[1:]), dtype=a.dtype)
    out[order] = a[idx[order]]
    return torch.from_numpy(out)


def fit_sgd(
    feat: np.ndarray,
    y: np.ndarray,
    task: str,
    out_dim: int,
    s: SgdSchedule,
    seed: int = 0,
    device: str | torch.device = "cpu",
    log: Callable[[int, float], None] = lambda epoch, loss: None,
) -> nn.Linear:
    """The linear layer (N(0, 0.01) weights, zero bias) after the schedule; cross-entropy or MSE."""
    torch.manual_seed(seed)
    head = nn.Linear(feat.shape[1], out_dim).to(device)
    nn.init.normal_(head.weight, std=0.01)
    nn.init.zeros_(head.bias)
    opt = torch.optim.SGD(head.parameters(), lr=s.lr, momentum=s.momentum, weight_decay=s.weight_decay)
    sched = torch.optim.lr_scheduler.MultiStepLR(opt, list(s.milestones), s.gamma)
    rng = np.random.default_rng(seed)
    n = len(feat)
    for epoch in range(s.epochs):
        order = rng.permutation(n)
        total = 0.0
        for i in range(0, n, s.batch_size):
            idx = order[i : i + s.batch_size]
            x, t = _rows(feat, idx).to(device).float(), _rows(y, idx).to(device)
            out = head(x)
            loss = F.cross_entropy(out, t.long()) if task == "classification" else F.mse_loss(out, t.float())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            total += float(loss.detach()) * len(idx)
        sched.step()
        if not math.isfinite(total):
            raise FloatingPointError(
                f"the SGD probe's loss is {total} in epoch {epoch + 1}: lower eval.probe.sgd.lr "
                f"(lr 30 is MoCo's for classification; regression targets need far less)"
            )
        log(epoch + 1, total / n)
    return head


@torch.no_grad()
def score(
    head: nn.Linear,
    feat: np.ndarray,
    y: np.ndarray,
    task: str,
    names: list[str] | None = None,
    device: str | torch.device = "cpu",
    chunk: int = 65536,
) -> dict[str, float]:
    """{"top1"} for classes; {"mse", "r2", "mse_<t>", "r2_<t>"} for regression targets, as the L-BFGS probe."""
    outs = [
        head(torch.from_numpy(np.array(feat[i : i + chunk])).to(device).float()).cpu()
        for i in range(0, len(feat), chunk)
    ]
    out, t = torch.cat(outs), torch.from_numpy(np.array(y))
    if task == "classification":
        return {"top1": float((out.argmax(1) == t).double().mean())}
    return regression_scores(out, t.float(), names)
