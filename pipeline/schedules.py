"""Every schedule of training in one place, as pure functions of where training is.

- `warmup_cosine`: the learning rate (linear warm-up, then half-cosine to `final`), per step;
- `warmup_step_decay`: the learning rate (the same warm-up, then ×gamma at each milestone epoch: MoCo v1's);
- `cosine`: a value that moves from `start` to `end` along a half-cosine over training: momentum encoders to 1
  (BYOL Eq. 4 convention: tau = 1 - (1 - tau_base)(cos(pi k / K) + 1) / 2, used by MoCo v3 and DINO too), DINO's
  weight decay 0.04 -> 0.4, CoCor's classifier lr;
- `scaled_lr`: the linear scaling rule of the learning rate with the global batch.

DINO's teacher temperature follows its epochs, as the authors' code does (pipeline/methods/dino.py).

`progress` is the fraction of training done, in [0, 1].
"""

from __future__ import annotations

import math


def cosine(progress: float, start: float, end: float) -> float:
    """start at progress 0, end at progress 1, along a half-cosine."""
    p = min(1.0, max(0.0, progress))
    return end + (start - end) * 0.5 * (1 + math.cos(math.pi * p))


def warmup_cosine(step: int, total_steps: int, warmup_steps: int, peak: float, final: float = 0.0) -> float:
    """Linear warm-up from peak / warmup_steps to `peak` over the first steps, then a half-cosine down to `final`
    at `total_steps`."""
    if warmup_steps and step < warmup_steps:
        return peak * (step + 1) / warmup_steps
    return cosine((step - warmup_steps) / max(1, total_steps - warmup_steps), peak, final)


def warmup_step_decay(
    step: int, steps_per_epoch: int, warmup_steps: int, peak: float, milestones: list[int], gamma: float
) -> float:
    """Linear warm-up as in `warmup_cosine`, then `peak` times `gamma` once for every milestone epoch reached: the
    lr drops at the first step of each milestone epoch (main_moco.py's `--schedule 120 160`, ×0.1)."""
    if warmup_steps and step < warmup_steps:
        return peak * (step + 1) / warmup_steps
    epoch = step // max(1, steps_per_epoch)
    return peak * gamma ** sum(epoch >= m for m in milestones)


class Momentum:
    """An EMA coefficient that follows `cosine` from `base` to 1 (or stays at `base`): the one object every
    momentum encoder (MoCo, BYOL, MoCo v3, DINO) reads its coefficient from."""

    def __init__(self, base: float, to_one: bool):
        self.base, self.to_one = float(base), bool(to_one)
        self.value = self.base

    def at(self, progress: float) -> float:
        return cosine(progress, self.base, 1.0) if self.to_one else self.base

    def update(self, progress: float) -> float:
        self.value = self.at(progress)
        return self.value


def scaled_lr(base_lr: float, global_batch: int) -> float:
    """The linear scaling rule: lr = base_lr * global_batch / 256."""
    return base_lr * global_batch / 256
