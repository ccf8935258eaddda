"""What BYOL, SimSiam and MoCo v3 share: an online network with a predictor, whose prediction is the query, and
(BYOL, MoCo v3) a momentum copy of its backbone and projector."""

from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from pipeline.methods.base import Encoder, Method, unwrap
from pipeline.methods.settings import Predictor
from pipeline.models.heads import mlp_head
from pipeline.models.momentum import ema_update


class PredictorEncoder(Encoder):
    """Backbone + projector + predictor (the online network of BYOL, SimSiam and MoCo v3), one module so DDP syncs
    all three.

    `forward(x)` keeps Encoder's contract (the projection, or (features, projection) with `with_features`);
    `predict=True` also runs the predictor: (projection, prediction), or (features, projection, prediction).
    """

    def __init__(self, backbone: nn.Module, projector: nn.Module, predictor: nn.Module):
        super().__init__(backbone, projector)
        self.predictor = predictor

    def forward(self, x: torch.Tensor, with_features: bool = False, predict: bool = False):
        h = self.backbone(x)
        z = self.projector(h)
        if not predict:
            return (h, z) if with_features else z
        p = self.predictor(z)
        return (h, z, p) if with_features else (z, p)


def build_predictor(
    dim: int, pred: Predictor | None, default_hidden: int, last_bn: bool = False, last_bias: bool | None = None
) -> nn.Sequential:
    """The predictor MLP dim -> hidden -> dim: `method.predictor`'s layers, width, BN and last bias where the config
    gives them, else 2 layers with BN at `default_hidden` (each paper's width: BYOL's and MoCo v3's the projector's
    hidden width, SimSiam's a bottleneck of dim / 4). `last_bn`: an affine-free BN after the output (MoCo v3's ViT
    model); `last_bias` overrides the config's (MoCo v3's Linears are all bias-free)."""
    hidden = int((pred and pred.hidden_dim) or default_hidden)
    layers, bn = (int(pred.num_layers), bool(pred.bn)) if pred else (2, True)
    bias = (bool(pred.last_bias) if pred else True) if last_bias is None else last_bias
    return mlp_head(dim, hidden, dim, layers, bn, last_bn=last_bn, last_bias=bias)


class PredictorMethod(Method):
    """A method whose `online` is a PredictorEncoder."""

    fix_predictor_lr = False  # its constructor sets method.fix_predictor_lr (SimSiam's --fix-pred-lr)

    def fixed_lr_parameters(self) -> list[nn.Parameter]:
        """The predictor's, when `method.fix_predictor_lr` keeps it at the peak lr."""
        return list(cast(PredictorEncoder, unwrap(self.online)).predictor.parameters()) if self.fix_predictor_lr else []

    def query(self, x: torch.Tensor, with_features: bool = False):
        """The L2-normalised float32 prediction; with_features also returns the backbone features."""
        h, _, p = self.online(x, with_features=True, predict=True)
        q = F.normalize(p.float(), dim=1)
        return (h, q) if with_features else q

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """With the predictor, as the loss's query (the target path, embed_target, is the base's: stop-gradient
        backbone + projector)."""
        return self.query(x)

    def ema_into(self, target: Encoder, m: float) -> None:
        """target's backbone and projector <- m * target + (1 - m) * online (no predictor in the target)."""
        online = cast(PredictorEncoder, unwrap(self.online))
        ema_update(target.backbone, online.backbone, m)
        ema_update(target.projector, online.projector, m)
