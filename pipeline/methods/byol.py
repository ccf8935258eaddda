"""BYOL (Grill et al. 2020): an online network with a predictor regresses an EMA target network's projection of
the other view; no negatives."""

from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F

from pipeline.fields import Bool
from pipeline.losses.predictive import byol_loss
from pipeline.methods.base import Encoder, build_encoder
from pipeline.methods.context import StepContext
from pipeline.methods.predictor import PredictorEncoder, PredictorMethod, build_predictor
from pipeline.methods.settings import Head, MethodRun, MomentumSettings
from pipeline.models.momentum import momentum_copy
from pipeline.schedules import Momentum


def head_hidden_dim(encoder: Encoder, head: Head) -> int:
    """The projector's hidden width as build_encoder resolves it (null: the backbone's feature dim)."""
    return int(head.hidden_dim or cast(int, encoder.backbone.feat_dim))  # build_backbone's feat_dim


class BYOL(PredictorMethod):
    """BYOL (Grill et al. 2020, "Bootstrap your own latent"). Online: backbone + projector + predictor (`online`,
    the module DDP wraps); target: an EMA copy of backbone + projector, never trained by gradient. Loss: the
    symmetric 2 − 2cos(q_θ(z_θ), sg(z'_ξ)) over both view orders (Eq. 2, L + L̃). The target momentum follows
    τ = 1 − (1 − τ_base)(cos(πk/K) + 1)/2, reaching 1 at the end of training (τ_base = 0.996 in the paper)."""

    kind = "byol"

    provides = frozenset({"features", "pairs", "embed", "embed_target"})

    class Settings(MomentumSettings):
        head: Head  # required: the projection head it trains
        momentum_cosine: Bool() = True  # the paper's: the target's momentum rises to 1 along a cosine

    def __init__(self, s: Settings, run: MethodRun):
        super().__init__()
        self.fix_predictor_lr = bool(s.fix_predictor_lr)
        self.momentum = Momentum(s.momentum, s.momentum_cosine)
        head = s.head
        encoder = build_encoder(run.model, head)
        # the paper's predictor: as wide as the projector (4096)
        predictor = build_predictor(int(head.out_dim), s.predictor, head_hidden_dim(encoder, head))
        self.online = PredictorEncoder(encoder.backbone, encoder.projector, predictor)
        # the target network: backbone + projector only (no predictor), frozen, updated by EMA in update_momentum
        self.target = momentum_copy(Encoder(encoder.backbone, encoder.projector))

    @torch.no_grad()
    def _targets(self, x: torch.Tensor) -> torch.Tensor:
        return self.target(x).float()

    def framework_loss(self, images: list[torch.Tensor], params: list[dict] | None = None) -> dict:
        x1, x2 = images[0], images[1]
        # one forward per view, so BN statistics are per view as in the paper's implementation; DDP tolerates two
        # forwards before one backward (autograd sums both uses before each gradient hook fires)
        h1, _, p1 = self.online(x1, with_features=True, predict=True)
        h2, _, p2 = self.online(x2, with_features=True, predict=True)
        p1, p2 = p1.float(), p2.float()  # losses in float32 under autocast
        t1, t2 = self._targets(x1), self._targets(x2)
        loss = byol_loss(p1, t2) + byol_loss(p2, t1)
        q1, k2 = F.normalize(p1, dim=1), F.normalize(t2, dim=1)
        ctx = StepContext(features=[h1, h2], pairs=[(q1, k2)])
        return {
            "loss": loss,
            "pos_sim": (q1.detach() * k2).sum(1).mean(),
            "momentum": torch.tensor(self.momentum.value),
            "ctx": ctx,
        }

    def update_momentum(self, progress: float) -> None:
        self.ema_into(self.target, self.momentum.update(progress))
