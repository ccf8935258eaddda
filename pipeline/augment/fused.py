"""augment.fuse=true: the batched executor's photometric stage (colour passes, hue, grayscale, blur, solarize,
normalisation: some sixty elementwise ops, each a pass over the whole batch in eager mode) compiled by
torch.compile into a few fused kernels, for the batch size that repeats (a run's full batches). Another size
(the last, partial batch) runs eager: a compile per size would cost more than it saves.

The plan is static (batch_plan.plan_group(static=True): the steps the recipe can ask for, not the ones this
batch's draws ask for), so every full batch is the same graph. The resize before it, whose shapes follow the
batch's largest image, and the strong pool, whose steps follow its draws, stay eager. No CUDA graphs: a batch's
views are still in use (made one ahead) while the next batch is made, and a replay would overwrite them."""

from __future__ import annotations

import logging
from typing import Callable

import torch
from torch import Tensor

log = logging.getLogger(__name__)

Stage = Callable[[Tensor, dict, str, dict, dict], Tensor]


class FusedStage:
    """stage(x, d, key, plan, consts) compiled for the first batch size each group meets, eager otherwise."""

    def __init__(self, eager: Stage):
        self.eager = eager
        self.compiled: Stage | None = None
        self.full: dict[str, int] = {}  # group key -> the batch size it is compiled for

    def __call__(self, x: Tensor, d: dict[str, Tensor], key: str, plan: dict, consts: dict[str, Tensor]) -> Tensor:
        if not plan.get("static") or self.full.setdefault(key, x.shape[0]) != x.shape[0]:
            return self.eager(x, d, key, plan, consts)
        if self.compiled is None:
            log.info("compiling the views' photometric stage (augment.fuse=true) at the first full batch")
            self.compiled = torch.compile(self.eager, dynamic=False)
        # only the group's own rows go in: the pack's other tensors (resize taps) change shape from batch to batch
        mine = {k: d[k] for k in (f"{key}.f", f"{key}.m", f"{key}.blur_taps") if k in d}
        return self.compiled(x, mine, key, plan, consts)
