"""Optimisers (SGD, LARS, AdamW) over parameter groups with and without weight decay; the schedules that drive
them live in pipeline/schedules.py."""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from typing import Any, Mapping, cast

import torch
from torch import nn

from pipeline.sections import Optim


class LARS(torch.optim.Optimizer):
    """SGD with momentum whose step for each weight tensor is scaled by the layer-wise trust ratio
    eta * ||w|| / ||g + wd * w|| (You et al. 2017; 1 where either norm is 0). Groups with `lars=False` (biases,
    norms) take plain momentum SGD steps without weight decay, the usual exclusion.

    One step is a handful of multi-tensor kernels per (group, device, dtype), whatever the number of tensors:
    the norms come from `torch._foreach_norm`, the trust ratios are one `torch.where` over the stacked norms
    (tensors, never read back on the host), and the scaling, momentum and update are `torch._foreach_*` ops.
    State: `state[p]["momentum_buffer"]`, as torch's SGD, so checkpoints load either way."""

    def __init__(self, params, lr: float, momentum: float = 0.9, weight_decay: float = 0.0, eta: float = 1e-3):
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay, eta=eta, lars=True))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for params in _by_device_and_dtype(p for p in group["params"] if p.grad is not None):
                self._step_tensors(group, params)
        return loss

    def _step_tensors(self, group: dict, params: list[torch.Tensor]) -> None:
        """One group's parameters that share a device and dtype."""
        grads = cast(list[torch.Tensor], [p.grad for p in params])  # step() passes only params with a grad
        if group["lars"]:
            wd = group["weight_decay"]
            d = torch._foreach_add(grads, params, alpha=wd) if wd else grads
            w_norm = torch.stack(torch._foreach_norm(params))
            d_norm = torch.stack(torch._foreach_norm(d))
            trust = torch.where(
                (w_norm > 0) & (d_norm > 0), group["eta"] * w_norm / d_norm, torch.ones_like(w_norm)
            ).unbind(0)
            if wd:  # d is already a fresh list
                torch._foreach_mul_(d, trust)
            else:  # never scale p.grad in place
                d = torch._foreach_mul(grads, trust)
        else:
            d = grads  # plain momentum SGD, no weight decay; p.grad is only read
        old: list[int] = []  # indices of params with and without a momentum buffer
        new: list[int] = []
        for i, p in enumerate(params):
            (old if "momentum_buffer" in self.state[p] else new).append(i)
        if old:  # buf = momentum * buf + d
            old_bufs = [self.state[params[i]]["momentum_buffer"] for i in old]
            torch._foreach_mul_(old_bufs, group["momentum"])
            torch._foreach_add_(old_bufs, [d[i] for i in old])
        if new:  # first step: the buffer starts at d (a copy where d is p.grad)
            first = [d[i] for i in new] if group["lars"] else torch._foreach_mul([d[i] for i in new], 1.0)
            for i, buf in zip(new, first):
                self.state[params[i]]["momentum_buffer"] = buf
        bufs = [self.state[p]["momentum_buffer"] for p in params]
        torch._foreach_add_(params, bufs, alpha=-group["lr"])


def _by_device_and_dtype(params) -> list[list[torch.Tensor]]:
    """Parameters split by (device, dtype), the unit a multi-tensor kernel takes; order kept within each."""
    groups: dict[tuple, list[torch.Tensor]] = {}
    for p in params:
        groups.setdefault((p.device, p.dtype), []).append(p)
    return list(groups.values())


def param_groups(
    model: nn.Module, weight_decay: float, decay_bias_and_norm: bool = False, fixed_lr: Iterable[nn.Parameter] = ()
) -> list[dict]:
    """Weights get weight decay (and LARS adaptation); biases and norm parameters get neither, or, with
    `decay_bias_and_norm`, the weight decay alone under SGD and AdamW (MoCo v3's AdamW decays every parameter; LARS
    never decays its lars=False group). `decay` marks the groups a weight-decay schedule sets. Parameters in
    `fixed_lr` (SimSiam's predictor) go into groups of their own marked `fixed_lr`, which set_lr leaves at the lr
    the optimiser was built with."""

    def split(params: list[nn.Parameter]) -> list[dict]:
        return [
            {"params": [p for p in params if p.ndim > 1], "weight_decay": weight_decay, "lars": True, "decay": True},
            {
                "params": [p for p in params if p.ndim <= 1],
                "weight_decay": weight_decay if decay_bias_and_norm else 0.0,
                "lars": False,
                "decay": decay_bias_and_norm,
            },
        ]

    fixed = {id(p) for p in fixed_lr}
    trained = [p for p in model.parameters() if p.requires_grad]
    held = [p for p in trained if id(p) in fixed]
    groups = split([p for p in trained if id(p) not in fixed])
    return groups + [{**g, "fixed_lr": True} for g in split(held)] if held else groups


_SGD_HAS_FUSED = "fused" in inspect.signature(torch.optim.SGD.__init__).parameters  # torch >= 2.3


def sgd_kernels(params) -> dict:
    """torch SGD's implementation for these parameters: the fused kernel when every parameter is on CUDA, else
    the multi-tensor (foreach) one. Same maths either way; both replace the per-tensor for-loop."""
    params = list(params)
    if _SGD_HAS_FUSED and params and all(p.device.type == "cuda" for p in params):
        return {"fused": True, "foreach": False}
    return {"foreach": True, "fused": False} if _SGD_HAS_FUSED else {"foreach": True}


def build_optimizer(
    model: nn.Module, optim: Optim | Mapping[str, Any], lr: float, fixed_lr: Iterable[nn.Parameter] = ()
) -> torch.optim.Optimizer:
    """The optimiser the config's `optim` section names (typed, or as composed), at `lr`; `fixed_lr`: parameters
    whose lr the schedule leaves at the peak (SimSiam's predictor)."""
    optim = Optim.of(optim)
    groups = param_groups(model, float(optim.weight_decay), bool(optim.decay_bias_and_norm), fixed_lr)
    if optim.name == "sgd":
        for g in groups:
            g.pop("lars")
        kernels = sgd_kernels(p for g in groups for p in g["params"])
        opt = torch.optim.SGD(groups, lr=lr, momentum=float(optim.momentum), **kernels)

        def keep_kernels(o: torch.optim.Optimizer) -> None:
            # a checkpoint's param groups carry the kernel choice of the machine that saved it (fused on a GPU
            # would fail on a CPU); keep the one made for these parameters
            for g in o.param_groups:
                g.update(kernels)

        opt.register_load_state_dict_post_hook(keep_kernels)
        return opt
    if optim.name == "lars":
        assert optim.eta is not None  # Optim.check asks optim.eta with lars
        return LARS(groups, lr=lr, momentum=float(optim.momentum), eta=float(optim.eta))
    if optim.name == "adamw":  # MoCo v3's and DINO's optimiser for ViTs
        for g in groups:
            g.pop("lars")
        params = [p for g in groups for p in g["params"]]
        kernels = {"fused": True} if params and all(p.device.type == "cuda" for p in params) else {"foreach": True}
        return torch.optim.AdamW(groups, lr=lr, betas=tuple(optim.betas or (0.9, 0.999)), **kernels)
    raise ValueError(f"unknown optimizer {optim.name!r}; choose sgd, lars or adamw")


def set_weight_decay(opt: torch.optim.Optimizer, weight_decay: float) -> None:
    """The weight decay of every decayed group (a checkpoint saved before groups were marked: the first alone)."""
    for i, g in enumerate(opt.param_groups):
        if g.get("decay", i == 0):
            g["weight_decay"] = weight_decay


def set_lr(opt: torch.optim.Optimizer, lr: float) -> None:
    """Every group's lr, but a fixed_lr group's (SimSiam's predictor), which keeps the lr it was built with."""
    for g in opt.param_groups:
        if not g.get("fixed_lr"):
            g["lr"] = lr
