"""Barlow Twins (Zbontar et al. 2021, "Barlow Twins: Self-Supervised Learning via Redundancy Reduction"): the
cross-correlation matrix of the two views' projections, each dimension standardised over the batch, pushed to the
identity. No negatives, no momentum encoder, no predictor.

Eq. 1-2: L = sum_i (1 - C_ii)^2 + lambda sum_i sum_{j != i} C_ij^2, C_ij = sum_b a_bi b_bj / N over the N samples
of the whole batch, a and b the projections of views A and B standardised per dimension (mean 0, variance 1 over
the batch). The authors' code standardises with a BatchNorm1d without affine parameters, made synchronous across
GPUs, and sums C over the GPUs before dividing by the global batch: here every worker's projections are gathered
(with their gradient) and standardised as that BatchNorm does (biased variance, eps 1e-5). Paper: lambda = 5.1e-3,
a projector of three 8192-wide Linear layers (BN and ReLU between them, no bias), LARS (lr 0.2 for weights, 0.0048
for biases and BN, weight decay 1.5e-6), batch 2048, 1000 epochs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pipeline import dist
from pipeline.fields import Num
from pipeline.losses.precision import float32
from pipeline.methods.base import Method, build_encoder
from pipeline.methods.context import StepContext
from pipeline.methods.settings import Head, MethodRun, MethodSettings

BN_EPS = 1e-5  # torch's BatchNorm1d default, which the authors' code standardises with


def standardise(z: torch.Tensor) -> torch.Tensor:
    """Each column of z [N, D] at mean 0 and variance 1 over the rows: BatchNorm1d(affine=False) in training mode."""
    return (z - z.mean(0)) / torch.sqrt(z.var(0, unbiased=False) + BN_EPS)


@float32
def barlow_twins_loss(z1: torch.Tensor, z2: torch.Tensor, lambd: float) -> torch.Tensor:
    """Eq. 1 for the two views' projections z1, z2 [N, D] of the whole batch.

    Example: barlow_twins_loss(torch.randn(256, 64), torch.randn(256, 64), 5.1e-3)"""
    c = standardise(z1).T @ standardise(z2) / z1.shape[0]
    on_diag = (torch.diagonal(c) - 1).pow(2).sum()
    off_diag = c.pow(2).sum() - torch.diagonal(c).pow(2).sum()
    return on_diag + lambd * off_diag


class BarlowTwins(Method):
    kind = "barlowtwins"
    # the projections (L2-normalised for the plug-ins, as the contract says) from every worker, each view's as the
    # positive key of the other's (pairs), the backbone's features and the embedding of further views
    provides = frozenset({"features", "pairs", "projections", "gathered", "embed", "embed_target"})

    class Settings(MethodSettings):
        head: Head  # required: the projector
        lambd: Num(gt=0)  # the off-diagonal terms' weight

    def __init__(self, s: Settings, run: MethodRun):
        super().__init__()
        self.lambd = float(s.lambd)
        self.online = build_encoder(run.model, s.head)

    def framework_loss(self, images: list[torch.Tensor], params: list[dict] | None = None) -> dict:
        b = images[0].shape[0]
        # one forward per view, as the authors' code: every BatchNorm's statistics are the view's own (two forwards
        # through DDP are fine: autograd sums both uses before each gradient hook fires)
        h1, z1 = self.online(images[0], with_features=True)
        h2, z2 = self.online(images[1], with_features=True)
        z1, z2 = z1.float(), z2.float()  # loss in float32 under autocast
        c1, c2 = dist.gather_grad(z1), dist.gather_grad(z2)
        loss = barlow_twins_loss(c1, c2, self.lambd)
        n1, n2 = F.normalize(z1, dim=1), F.normalize(z2, dim=1)
        ctx = StepContext(
            features=[h1, h2],
            pairs=[(n1, n2.detach()), (n2, n1.detach())],
            projections=(n1, n2),
            gathered=(F.normalize(c1, dim=1), F.normalize(c2, dim=1)),
            offset=dist.rank() * b,
        )
        return {"loss": loss, "ctx": ctx}
