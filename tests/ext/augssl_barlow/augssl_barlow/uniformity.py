"""The uniformity term of Wang & Isola (2020) as an augssl plug-in: log E[exp(-t ||z_i - z_j||^2)] over the
pairs of a batch's normalised projections, averaged over the two views. It reads the projections the method
leaves in the step's context (`needs`), nothing else."""

from __future__ import annotations

import torch

from pipeline.fields import Num, Section
from pipeline.plugins.base import Plugin, PluginRun


def uniformity(z: torch.Tensor, t: float) -> torch.Tensor:
    """log of the mean over pairs i < j of exp(-t ||z_i - z_j||^2), for L2-normalised rows of z [B, D].

    Example: uniformity(torch.nn.functional.normalize(torch.randn(64, 16), dim=1), 2.0)"""
    return torch.pdist(z, p=2).pow(2).mul(-t).exp().mean().log()


class Uniformity(Plugin):
    name = "uniformity"
    needs = (frozenset({"projections"}),)

    class Settings(Section):
        weight: Num(ge=0)
        t: Num(gt=0)

    def __init__(self, s: Settings, run: PluginRun):
        super().__init__()
        self.weight, self.t = float(s.weight), float(s.t)

    def loss(self, method, images, params, ctx):
        z1, z2 = ctx.projections
        return {"uniformity": ((uniformity(z1, self.t) + uniformity(z2, self.t)) / 2, self.weight)}
