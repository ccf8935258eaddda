"""What every method shares: an online encoder (the only module DDP wraps) and the step contract."""
from __future__ import annotations

import torch
from torch import nn

from pipeline.models.backbones import build_backbone
from pipeline.models.heads import mlp_head


class Encoder(nn.Module):
    """Backbone + projection head; `forward` returns the projection, `backbone` gives features."""

    def __init__(self, backbone: nn.Module, projector: nn.Module):
        super().__init__()
        self.backbone = backbone
        self.projector = projector

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.projector(self.backbone(x))


def build_encoder(model_cfg: dict, head_cfg: dict) -> Encoder:
    backbone = build_backbone(model_cfg["backbone"], model_cfg.get("cifar_stem", False), model_cfg.get("width", 64))
    dim = backbone.feat_dim
    projector = mlp_head(dim, head_cfg.get("hidden_dim") or dim, head_cfg["out_dim"],
                         head_cfg.get("num_layers", 2), head_cfg.get("bn", False))
    return Encoder(backbone, projector)


def unwrap(module: nn.Module) -> nn.Module:
    """The module inside a DDP wrapper (or the module itself)."""
    return getattr(module, "module", module)


class Method(nn.Module):
    """One small class per framework.

    `online` holds every trainable network and is the one module wrapped in DDP, so gradient
    synchronisation covers exactly what the optimiser updates. Momentum encoders and queues live beside
    it and stay identical across ranks by construction.
    """

    online: nn.Module
    n_views: int = 2

    def training_step(self, images: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        """Return a dict with at least "loss"; other entries are logged."""
        raise NotImplementedError

    def after_step(self, progress: float) -> None:
        """Called after every optimiser step with progress in [0, 1] (momentum schedules)."""

    @property
    def backbone(self) -> nn.Module:
        return unwrap(self.online).backbone
