"""augment.fuse=true: the batched executor's photometric stage (colour passes, hue, grayscale, blur, solarize,
normalisation: some sixty elementwise ops, each a pass over the whole batch in eager mode) compiled by
torch.compile into a few fused kernels, for the run's full batch (batch_size x the group's views). Another size
(a partial batch, one that lost an undecodable image) runs eager: a compile per size would cost more than it saves.

The plan is static (batch_plan.plan_group(static=True): the steps the recipe can ask for, not the ones this
batch's draws ask for), so every full batch of a group is the same graph: one graph per group of views and resize
path (a CPU resizes large batches per sample, which adds the flips to the stage's rows). The resize before it, whose
shapes follow the batch's largest image, stays eager, and so does the whole stage of a group with strong-pool views,
whose steps follow their draws. No CUDA graphs: a batch's views are still in use (made one ahead) while the next
batch is made, and a replay would overwrite them."""

from __future__ import annotations

import logging
from typing import Callable

import torch
from torch import Tensor

log = logging.getLogger(__name__)

Stage = Callable[[Tensor, dict, str, dict, dict], Tensor]


class FusedStage:
    """stage(x, d, key, plan, consts) compiled where x holds group `key`'s full batch (full[key] rows), eager
    otherwise."""

    def __init__(self, eager: Stage, full: dict[str, int]):
        self.eager = eager
        self.compiled: Stage | None = None
        self.full = full  # group key -> the rows of its full batch (batch_size x its views)

    def __call__(self, x: Tensor, d: dict[str, Tensor], key: str, plan: dict, consts: dict[str, Tensor]) -> Tensor:
        if not plan.get("static") or self.full.get(key) != x.shape[0]:
            return self.eager(x, d, key, plan, consts)
        if self.compiled is None:
            log.info("compiling the views' photometric stage (augment.fuse=true) at the first full batch")
            # dynamic=False: one shape, the full batch's; default mode: no CUDA graphs (see above)
            self.compiled = torch.compile(self.eager, dynamic=False)
        # only the group's own rows go in: the pack's other tensors (resize taps) change shape from batch to batch
        mine = {k: d[k] for k in (f"{key}.f", f"{key}.m", f"{key}.blur_taps") if k in d}
        return self.compiled(x, mine, key, plan, consts)
