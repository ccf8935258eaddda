"""Optimisers (SGD, LARS) and the per-step learning-rate schedule (linear warm-up, cosine decay)."""
from __future__ import annotations

import math

import torch
from torch import nn


class LARS(torch.optim.Optimizer):
    """SGD with momentum whose step for each weight tensor is scaled by the layer-wise trust ratio
    eta * ||w|| / (||g|| + wd * ||w||) (You et al. 2017). Groups with `lars=False` (biases, norms) take
    plain SGD steps without weight decay, the usual exclusion."""

    def __init__(self, params, lr: float, momentum: float = 0.9, weight_decay: float = 0.0, eta: float = 1e-3):
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay, eta=eta, lars=True))

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                d = p.grad
                if group["lars"]:
                    d = d.add(p, alpha=group["weight_decay"])
                    w_norm, g_norm = torch.linalg.norm(p), torch.linalg.norm(d)
                    trust = torch.where((w_norm > 0) & (g_norm > 0), group["eta"] * w_norm / g_norm,
                                        torch.ones_like(w_norm))
                    d = d.mul(trust)
                buf = self.state[p].get("momentum_buffer")
                if buf is None:
                    buf = self.state[p]["momentum_buffer"] = d.clone()
                else:
                    buf.mul_(group["momentum"]).add_(d)
                p.add_(buf, alpha=-group["lr"])
        return loss


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Weights get weight decay (and LARS adaptation); biases and norm parameters get neither."""
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (no_decay if p.ndim <= 1 else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay, "lars": True},
            {"params": no_decay, "weight_decay": 0.0, "lars": False}]


def build_optimizer(model: nn.Module, cfg: dict, lr: float) -> torch.optim.Optimizer:
    groups = param_groups(model, float(cfg["weight_decay"]))
    name = cfg["name"]
    if name == "sgd":
        for g in groups:
            g.pop("lars")
        return torch.optim.SGD(groups, lr=lr, momentum=float(cfg["momentum"]))
    if name == "lars":
        return LARS(groups, lr=lr, momentum=float(cfg["momentum"]), eta=float(cfg.get("eta", 1e-3)))
    raise ValueError(f"unknown optimizer {name!r}; choose sgd or lars")


def scaled_lr(base_lr: float, global_batch: int) -> float:
    """The linear scaling rule: lr = base_lr * global_batch / 256."""
    return base_lr * global_batch / 256


def lr_at(step: int, total_steps: int, warmup_steps: int, peak: float, final: float = 0.0) -> float:
    """Linear warm-up from ~0 to `peak`, then half-cosine down to `final`."""
    if warmup_steps and step < warmup_steps:
        return peak * (step + 1) / warmup_steps
    t = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return final + (peak - final) * 0.5 * (1 + math.cos(math.pi * min(1.0, t)))


def set_lr(opt: torch.optim.Optimizer, lr: float) -> None:
    for g in opt.param_groups:
        g["lr"] = lr
