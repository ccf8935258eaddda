"""One optimisation step, as every worker (and the benchmarks) runs it: the views on the worker's device in its
memory format, the lr and weight-decay schedule, the step itself (loss, backward, optimiser, momentum updates,
plug-ins), and the views topped up to a full batch after corrupt samples were dropped (_Pending).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import torch

from pipeline import dist
from pipeline.schedules import cosine, warmup_cosine, warmup_step_decay
from pipeline.sections import Optim
from pipeline.train.optim import set_lr, set_weight_decay
from pipeline.train.plugin_optim import PluginOptimizers
from pipeline.train.precision import autocast


def memory_format(choice: str | bool, device: torch.device) -> torch.memory_format:
    """channels_last where cuDNN's convolutions are fastest with it (CUDA, tensor cores); `choice`
    (train.channels_last) true/false forces it, "auto" decides by the device."""
    on = device.type == "cuda" if choice == "auto" else bool(choice)
    return torch.channels_last if on else torch.contiguous_format


def compile_backbones(method) -> None:
    """torch.compile every backbone in place (`Module.compile`): the state-dict keys stay as they are, so
    checkpoints load with or without it. The heads and losses are small and stay eager."""
    for name, module in method.named_modules():
        if name.split(".")[-1] == "backbone":
            module.compile()


def to_device(
    images: list[torch.Tensor],
    params: list[dict] | None,
    device: torch.device,
    fmt: torch.memory_format = torch.contiguous_format,
) -> tuple[list[torch.Tensor], list[dict] | None]:
    """Views and their parameters on the worker's device. Host tensors bound for a GPU are pinned first so the
    copies run asynchronously; views made on the device already (the batched executor, DALI mixed) are not copied."""

    def move(t: torch.Tensor) -> torch.Tensor:
        if device.type == "cuda" and t.device.type == "cpu":
            t = t.pin_memory()
        return t.to(device, non_blocking=True)

    images = [move(v).contiguous(memory_format=fmt) for v in images]  # views are [B, 3, H, W]
    if params is not None:
        params = [{k: move(t) for k, t in p.items()} for p in params]
    return images, params


def schedule_step(
    optimizer,
    optim: Optim | Mapping[str, Any],
    step: int,
    total_steps: int,
    warmup_steps: int,
    peak_lr: float,
    steps_per_epoch: int | None = None,
) -> float:
    """Set the optimiser's lr (warm-up, then a cosine to optim.min_lr, or ×optim.lr_decay at each epoch of
    optim.milestones, which needs `steps_per_epoch`) and, where `optim.weight_decay_end` is set (DINO), its weight
    decay (cosine from weight_decay) for optimisation step `step`; returns the lr. `optim`: the section typed, or
    as composed."""
    optim = Optim.of(optim)
    if optim.milestones:
        if not steps_per_epoch:
            raise ValueError("optim.milestones are epochs: schedule_step needs steps_per_epoch")
        lr = warmup_step_decay(
            step, steps_per_epoch, warmup_steps, peak_lr, list(optim.milestones), float(optim.lr_decay)
        )
    else:
        lr = warmup_cosine(step, total_steps, warmup_steps, peak_lr, float(optim.min_lr))
    set_lr(optimizer, lr)
    if optim.weight_decay_end is not None:
        set_weight_decay(
            optimizer, cosine(step / total_steps, float(optim.weight_decay), float(optim.weight_decay_end))
        )
    return lr


def optimisation_step(
    method,
    optimizer,
    images: list[torch.Tensor],
    params: list[dict] | None,
    precision: str,
    device: torch.device,
    progress: float,
    plugin_optimizers: PluginOptimizers | None = None,
) -> dict:
    """One step of any method with its plug-ins: loss under autocast, backward, the method's gradient hook (DINO's
    last-layer freeze and clipping), optimiser step, momentum updates, then the plug-ins' own optimisers (CoCor's
    bi-level step), which a method whose plug-ins have some must be given. `progress` in [0, 1] is the fraction of
    training done after this step. The benchmark times exactly this function."""
    with autocast(precision, device):
        out = method.total_loss(images, params)
    optimizer.zero_grad(set_to_none=True)
    out["loss"].backward()
    out.update(method.before_optimizer_step(progress))
    optimizer.step()
    method.update_momentum(progress)
    if plugin_optimizers is None and any(p.optimizers() for p in method.plugins):
        raise ValueError("this method's plug-ins have optimisers of their own: pass PluginOptimizers(method.plugins)")
    if plugin_optimizers:
        with autocast(precision, device):
            out.update(plugin_optimizers.step(method, images, params or [{} for _ in images], out, progress))
    return out


@dataclass
class Stepper:
    """One training step as the loop takes it, and as benchmarks/gpu times it: the lr schedule, the views to the
    device, BatchNorm's buffers synced across workers, optimisation_step, every logged value read back once.
    `step` counts the steps taken (a resumed run sets it)."""

    method: Any
    optimizer: torch.optim.Optimizer
    plugin_optimizers: PluginOptimizers
    optim: Optim
    peak_lr: float
    total_steps: int
    warmup_steps: int
    steps_per_epoch: int | None
    device: torch.device
    memory_format: torch.memory_format
    precision: str
    step: int = 0

    def __call__(self, images: list[torch.Tensor], params: list[dict] | None = None) -> dict[str, float]:
        lr = schedule_step(
            self.optimizer,
            self.optim,
            self.step,
            self.total_steps,
            self.warmup_steps,
            self.peak_lr,
            self.steps_per_epoch,
        )
        images, params = to_device(images, params, self.device, self.memory_format)
        dist.sync_buffers_(self.method.online)
        self.step += 1
        progress = min(1.0, self.step / self.total_steps)
        out = optimisation_step(
            self.method, self.optimizer, images, params, self.precision, self.device, progress, self.plugin_optimizers
        )
        return {"lr": lr, **{k: float(v.detach()) if torch.is_tensor(v) else float(v) for k, v in out.items()}}


class _Pending:
    """Views left over after corrupt samples were dropped, topped up from the next raw batch so every step
    still sees exactly `batch` samples (DDP collectives need equal shapes on every rank). Each view's images
    travel with its parameters."""

    def __init__(self, batch: int):
        self.batch = batch
        self.parts: list[tuple[list[torch.Tensor], list[dict]]] = []

    def add(self, images: list[torch.Tensor], params: list[dict] | None = None) -> None:
        if images[0].shape[0]:
            self.parts.append((images, params if params is not None else [{} for _ in images]))

    def __len__(self) -> int:
        return sum(p[0][0].shape[0] for p in self.parts)

    def take(self) -> tuple[list[torch.Tensor], list[dict]]:
        n_views = len(self.parts[0][0])
        images = [torch.cat([imgs[v] for imgs, _ in self.parts]) for v in range(n_views)]
        params = [
            {k: torch.cat([ps[v][k] for _, ps in self.parts]) for k in self.parts[0][1][v]} for v in range(n_views)
        ]
        b = self.batch
        self.parts = []
        self.add([x[b:] for x in images], [{k: t[b:] for k, t in p.items()} for p in params])
        return [x[:b] for x in images], [{k: t[:b] for k, t in p.items()} for p in params]
