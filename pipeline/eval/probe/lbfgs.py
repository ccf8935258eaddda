"""Linear probe on frozen features: cross-entropy for classes, MSE per target for regression.

Full-batch L-BFGS on standardised features, weight decay on the weights only (InvCLR's protocol,
docs/methods/invclr.md §4.1), so the probe's result depends on the features and not on an SGD schedule.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pipeline.eval.knn import r2_score


def _standardise(train: torch.Tensor, test: torch.Tensor):
    """Per-feature z-scores from the train split. Near-constant features (std below 1% of the median std: dead
    units, or directions an invariant encoder averaged away) are not blown up: dividing test-time noise by
    a tiny train std made the probe's predictions explode (seen with feature-averaged InvCLR features)."""
    mu, sd = train.mean(0), train.std(0)
    floor = max(1e-6, 1e-2 * float(sd.median())) if sd.numel() else 1e-6
    sd = sd.clamp_min(floor)
    return (train - mu) / sd, (test - mu) / sd


def fit_linear(
    x: torch.Tensor,
    y: torch.Tensor,
    task: str,
    steps: int = 200,
    weight_decay: float = 1e-5,
    num_classes: int | None = None,
) -> nn.Linear:
    out_dim = (num_classes or int(y.max()) + 1) if task == "classification" else y.shape[1]
    head = nn.Linear(x.shape[1], out_dim).double()
    x = x.double()
    y = y if task == "classification" else y.double()
    opt = torch.optim.LBFGS(head.parameters(), lr=1, max_iter=20, history_size=10, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        out = head(x)
        loss = F.cross_entropy(out, y) if task == "classification" else F.mse_loss(out, y)
        loss = loss + weight_decay * head.weight.pow(2).sum()
        loss.backward()
        return loss

    for _ in range(steps):
        opt.step(closure)
    return head


def probe(
    train_x,
    train_y,
    test_x,
    test_y,
    task: str,
    names: list[str] | None = None,
    steps: int = 200,
    weight_decay: float = 1e-5,
    num_classes: int | None = None,
) -> dict[str, float]:
    """Fit on train, score on test. Classification: {"top1"}; regression: {"mse_<t>", "r2_<t>", "mse", "r2"}."""
    train_x, test_x = _standardise(train_x.double(), test_x.double())
    head = fit_linear(train_x, train_y, task, steps, weight_decay, num_classes)
    with torch.no_grad():
        out = head(test_x)
    if task == "classification":
        return {"top1": float((out.argmax(1) == test_y).double().mean())}
    return regression_scores(out, test_y.double(), names)


def regression_scores(out: torch.Tensor, y: torch.Tensor, names: list[str] | None = None) -> dict[str, float]:
    """Predictions against targets, per column and averaged: {"mse", "r2", "mse_<t>", "r2_<t>"} (every probe's and
    fine-tuning's regression report)."""
    mse, r2 = ((out - y) ** 2).mean(0), r2_score(out, y)
    res = {"mse": float(mse.mean()), "r2": float(r2.mean())}
    for i, name in enumerate(names or [f"y{i}" for i in range(y.shape[1])]):
        res[f"mse_{name}"], res[f"r2_{name}"] = float(mse[i]), float(r2[i])
    return res
