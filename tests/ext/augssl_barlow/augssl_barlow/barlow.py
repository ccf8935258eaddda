"""Barlow Twins (Zbontar et al. 2021): the cross-correlation of the two views' projections, each dimension
standardised over the batch, pushed to the identity. An augssl method from another package: its settings beside
it, its loss as a pure function, the projections left for plug-ins (`provides`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pipeline import dist
from pipeline.fields import Num
from pipeline.methods.base import Method, build_encoder
from pipeline.methods.context import StepContext
from pipeline.methods.settings import Head, MethodRun, MethodSettings


def barlow_loss(z1: torch.Tensor, z2: torch.Tensor, lambd: float) -> torch.Tensor:
    """sum_i (1 - C_ii)^2 + lambd * sum_{i != j} C_ij^2, with C the cross-correlation of the standardised
    projections [N, D] over the batch.

    Example: barlow_loss(torch.randn(256, 64), torch.randn(256, 64), 0.0051)"""
    n = z1.shape[0]
    a = (z1 - z1.mean(0)) / z1.std(0, unbiased=False).clamp_min(1e-6)
    b = (z2 - z2.mean(0)) / z2.std(0, unbiased=False).clamp_min(1e-6)
    c = a.T @ b / n
    diag = torch.diagonal(c)
    return (1 - diag).pow(2).sum() + lambd * (c.pow(2).sum() - diag.pow(2).sum())


class BarlowTwins(Method):
    provides = frozenset({"features", "projections"})

    class Settings(MethodSettings):
        lambd: Num(gt=0)
        head: Head

    def __init__(self, s: Settings, run: MethodRun):
        super().__init__()
        self.lambd = float(s.lambd)
        self.online = build_encoder(run.model, s.head)

    def framework_loss(self, images: list[torch.Tensor], params: list[dict] | None = None) -> dict:
        b = images[0].shape[0]
        h, z = self.online(torch.cat([images[0], images[1]]), with_features=True)  # one forward for DDP
        z = z.float()
        # the correlation over every worker's batch, as the paper sums it over its GPUs
        loss = barlow_loss(dist.gather_grad(z[:b]), dist.gather_grad(z[b:]), self.lambd)
        ctx = StepContext(features=[h[:b], h[b:]], projections=(F.normalize(z[:b], dim=1), F.normalize(z[b:], dim=1)))
        return {"loss": loss, "ctx": ctx}
