"""VICReg (Bardes, Ponce & LeCun 2022, "VICReg: Variance-Invariance-Covariance Regularization for Self-Supervised
Learning"): the two views' projections kept close (invariance), each dimension's standard deviation over the batch
held above 1 (variance) and the dimensions decorrelated (covariance). No negatives, no momentum encoder, no
predictor, no normalisation of the projections.

Eq. 1-6, over the n samples of the whole batch and the d dimensions of the projections Z, Z':
  v(Z) = (1/d) sum_j max(0, gamma - sqrt(Var(z_j) + eps)),  Var unbiased, gamma = 1, eps = 1e-4;
  c(Z) = (1/d) sum_{i != j} C(Z)_ij^2,  C(Z) = (1/(n-1)) sum_b (z_b - mean)(z_b - mean)^T;
  s(Z, Z') = (1/n) sum_b ||z_b - z'_b||^2;
  L = lambda s(Z, Z') + mu [v(Z) + v(Z')] + nu [c(Z) + c(Z')].
The authors' code divides s by d too (F.mse_loss: the mean over n x d) and halves the variance term of each view
(mean(relu(1 - std)) / 2 per view), with lambda = mu = 25, nu = 1: their runs' loss, which `method.form` picks
(`code`, the default; `paper` is the equations as printed). Every worker's projections are gathered with their
gradient, as the code gathers them for v and c. Paper: a projector of three 8192-wide Linear layers (BN and ReLU
between them), LARS, lr 0.2 x batch/256 (base 0.2 at batch 2048 -> 1.6), weight decay 1e-6, 1000 epochs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pipeline import dist
from pipeline.fields import Choice, Num
from pipeline.losses.precision import float32
from pipeline.methods.base import Method, build_encoder
from pipeline.methods.context import StepContext
from pipeline.methods.settings import Head, MethodRun, MethodSettings

VAR_EPS = 1e-4  # the paper's epsilon inside the standard deviation


def _off_diagonal_sq(c: torch.Tensor) -> torch.Tensor:
    return c.pow(2).sum() - torch.diagonal(c).pow(2).sum()


@float32
def vicreg_terms(z1: torch.Tensor, z2: torch.Tensor, gamma: float = 1.0) -> dict[str, torch.Tensor]:
    """The equations' three terms for projections z1, z2 [n, d] of the whole batch: "invariance" s(Z, Z') (Eq. 5),
    "variance" v(Z) + v(Z') (Eq. 1-2), "covariance" c(Z) + c(Z') (Eq. 3-4).

    Example: vicreg_terms(torch.randn(256, 64), torch.randn(256, 64))["variance"]"""
    n, d = z1.shape
    out = {"invariance": (z1 - z2).pow(2).sum(1).mean(), "variance": z1.new_zeros(()), "covariance": z1.new_zeros(())}
    for z in (z1, z2):
        zc = z - z.mean(0)
        std = torch.sqrt(zc.var(0) + VAR_EPS)
        out["variance"] = out["variance"] + F.relu(gamma - std).mean()
        out["covariance"] = out["covariance"] + _off_diagonal_sq(zc.T @ zc / (n - 1)) / d
    return out


def vicreg_loss(
    z1: torch.Tensor, z2: torch.Tensor, sim: float, std: float, cov: float, form: str = "code"
) -> dict[str, torch.Tensor]:
    """{"loss", "invariance", "variance", "covariance"}: Eq. 6 with weights lambda = `sim`, mu = `std`, nu = `cov`;
    form "code" scales the invariance term by 1/d and the variance term by 1/2 as the authors' code does."""
    t = vicreg_terms(z1, z2)
    if form == "code":
        t = {**t, "invariance": t["invariance"] / z1.shape[1], "variance": t["variance"] / 2}
    return {"loss": sim * t["invariance"] + std * t["variance"] + cov * t["covariance"], **t}


class VICReg(Method):
    kind = "vicreg"
    # the projections (L2-normalised for the plug-ins, as the contract says) from every worker, each view's as the
    # positive key of the other's (pairs), the backbone's features and the embedding of further views
    provides = frozenset({"features", "pairs", "projections", "gathered", "embed", "embed_target"})
    loss_terms = ("invariance", "variance", "covariance")

    class Settings(MethodSettings):
        head: Head  # required: the expander (the paper's name for the projector)
        sim_coeff: Num(ge=0)  # lambda, the invariance term's weight
        std_coeff: Num(ge=0)  # mu, the variance term's
        cov_coeff: Num(ge=0)  # nu, the covariance term's
        form: Choice("code", "paper") = "code"

    def __init__(self, s: Settings, run: MethodRun):
        super().__init__()
        self.weights = (float(s.sim_coeff), float(s.std_coeff), float(s.cov_coeff))
        self.form = s.form
        self.online = build_encoder(run.model, s.head)

    def framework_loss(self, images: list[torch.Tensor], params: list[dict] | None = None) -> dict:
        b = images[0].shape[0]
        # one forward per view, as the authors' code: every BatchNorm's statistics are the view's own
        h1, z1 = self.online(images[0], with_features=True)
        h2, z2 = self.online(images[1], with_features=True)
        z1, z2 = z1.float(), z2.float()  # loss in float32 under autocast
        c1, c2 = dist.gather_grad(z1), dist.gather_grad(z2)
        out = vicreg_loss(c1, c2, *self.weights, form=self.form)
        n1, n2 = F.normalize(z1, dim=1), F.normalize(z2, dim=1)
        ctx = StepContext(
            features=[h1, h2],
            pairs=[(n1, n2.detach()), (n2, n1.detach())],
            projections=(n1, n2),
            gathered=(F.normalize(c1, dim=1), F.normalize(c2, dim=1)),
            offset=dist.rank() * b,
        )
        return {"loss": out["loss"], **{k: v.detach() for k, v in out.items() if k != "loss"}, "ctx": ctx}
