"""SimCLR (Chen et al. 2020): NT-Xent over both views, negatives gathered from every worker.

The loss is the mean over all 2B anchors; `method.sum_directions: true` makes it the authors' `loss_a + loss_b`
(objective.py, add_contrastive_loss: one cross-entropy mean per direction, summed), twice that mean. Under SGD it
doubles the gradient; under LARS the trust ratio cancels the factor, but weight decay weighs half as much against
it."""

from __future__ import annotations

import torch

from pipeline import dist
from pipeline.fields import Bool, Num
from pipeline.losses.contrastive import nt_xent_anchors
from pipeline.methods.base import Method, build_encoder
from pipeline.methods.context import StepContext
from pipeline.methods.settings import Head, MethodRun, MethodSettings


class SimCLR(Method):
    kind = "simclr"
    provides = frozenset({"features", "projections", "gathered", "temperature", "embed", "embed_target"})

    class Settings(MethodSettings):
        head: Head  # required: the projection head it trains
        temperature: Num(gt=0)
        sum_directions: Bool() = False  # true: loss_a + loss_b as the authors' code, 2x the mean over 2B anchors

    def __init__(self, s: Settings, run: MethodRun):
        super().__init__()
        self.temperature = float(s.temperature)
        self.directions = 2.0 if s.sum_directions else 1.0
        self.online = build_encoder(run.model, s.head)

    def framework_loss(self, images: list[torch.Tensor], params: list[dict] | None = None) -> dict:
        b = images[0].shape[0]
        # one forward over both views: DDP expects a single forward per backward
        h, z = self.online(torch.cat([images[0], images[1]]), with_features=True)
        z = z.float()  # loss in float32 under autocast
        z1, z2 = z[:b], z[b:]
        c1, c2 = dist.gather_grad(z1), dist.gather_grad(z2)
        loss = self.directions * nt_xent_anchors(z1, z2, c1, c2, self.temperature, offset=dist.rank() * b)
        # the gathered projections let in-batch plug-ins (CO2 on SimCLR) see every worker's negatives
        ctx = StepContext(
            features=[h[:b], h[b:]],
            projections=(z1, z2),
            gathered=(c1, c2),
            offset=dist.rank() * b,
            temperature=self.temperature,
        )
        return {"loss": loss, "ctx": ctx}
