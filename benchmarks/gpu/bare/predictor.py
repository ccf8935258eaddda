"""The frameworks with a predictor by hand: BYOL and MoCo v3 (an EMA target) and SimSiam (stop-gradient)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .common import Bare, bare_adamw, bare_mlp, bare_sgd, frozen_copy, half_cosine


class BarePredictorTarget(Bare):
    """What BYOL's and MoCo v3's loops share: online backbone + projector + predictor, one forward per view, an EMA
    target of backbone + projector (cosine momentum to 1); `pair_loss(prediction, target)` is each method's own."""

    def networks(self, projector: nn.Module, predictor: nn.Module, total_steps: int) -> None:
        self.base_m, self.total = float(self.cfg["method"]["momentum"]), total_steps
        self.online = nn.Sequential(self.backbone, projector)
        self.predictor = predictor
        self.target = frozen_copy(self.online)
        self.place(self.online, self.predictor, self.target)
        self.online_p, self.target_p = list(self.online.parameters()), list(self.target.parameters())

    def pair_loss(self, p: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def loss(self, images, params):
        p1 = self.predictor(self.online(images[0])).float()
        p2 = self.predictor(self.online(images[1])).float()
        with torch.no_grad():
            t1, t2 = self.target(images[0]).float(), self.target(images[1]).float()
        return self.pair_loss(p1, t2) + self.pair_loss(p2, t1)

    @torch.no_grad()
    def after(self, images, params, loss):
        m = half_cosine(self.steps / self.total, self.base_m, 1.0)
        torch._foreach_lerp_(self.target_p, self.online_p, 1 - m)


class BareBYOL(BarePredictorTarget):
    """BYOL: 2 - 2 cos(prediction, target) both ways, SGD."""

    def __init__(self, cfg, device, precision, fmt, total_steps: int):
        super().__init__(cfg, device, precision, fmt)
        head, pred = cfg["method"]["head"], cfg["method"].get("predictor") or {}
        self.networks(
            bare_mlp(self.dim, self.hidden, self.out_dim, int(head["num_layers"]), bool(head["bn"])),
            bare_mlp(
                self.out_dim,
                int(pred.get("hidden_dim") or self.hidden),
                self.out_dim,
                int(pred.get("num_layers", 2)),
                bool(pred.get("bn", True)),
            ),
            total_steps,
        )
        self.opt = bare_sgd([self.online, self.predictor], self.lr, self.momentum, self.wd, device)

    @staticmethod
    def pair_loss(p, z):
        return (2 - 2 * (F.normalize(p, dim=1) * F.normalize(z.detach(), dim=1)).sum(1)).mean()


class BareSimSiam(Bare):
    """SimSiam: projector with BN on every layer (no-affine BN on the output), bottleneck predictor, stop-gradient."""

    def __init__(self, cfg, device, precision, fmt):
        super().__init__(cfg, device, precision, fmt)
        head, pred = cfg["method"]["head"], cfg["method"].get("predictor") or {}
        self.projector = bare_mlp(self.dim, self.hidden, self.out_dim, int(head["num_layers"]), True, last_bn=True)
        self.predictor = bare_mlp(
            self.out_dim,
            int(pred.get("hidden_dim") or max(1, self.out_dim // 4)),
            self.out_dim,
            int(pred.get("num_layers", 2)),
            bool(pred.get("bn", True)),
        )
        self.place(self.backbone, self.projector, self.predictor)
        self.opt = bare_sgd([self.backbone, self.projector, self.predictor], self.lr, self.momentum, self.wd, device)

    @staticmethod
    def d(p, z):
        return -(F.normalize(p, dim=1) * F.normalize(z.detach(), dim=1)).sum(1).mean()

    def loss(self, images, params):
        z1, z2 = self.projector(self.backbone(images[0])), self.projector(self.backbone(images[1]))
        p1, p2 = self.predictor(z1).float(), self.predictor(z2).float()
        return 0.5 * self.d(p1, z2.float()) + 0.5 * self.d(p2, z1.float())


class BareMoCoV3(BarePredictorTarget):
    """MoCo v3 on a ViT: frozen random patch projection, fixed sine-cosine position embedding, BN MLP heads (3-layer
    projector with a no-affine output BN, 2-layer predictor), 2τ-scaled InfoNCE against the batch's keys both ways,
    cosine momentum 0.99 -> 1, AdamW."""

    def __init__(self, cfg, device, precision, fmt, total_steps: int):
        super().__init__(cfg, device, precision, fmt)
        self.t = float(cfg["method"]["temperature"] or 0.2)
        conv = self.backbone.vit.conv_proj
        conv.weight.requires_grad_(False)
        conv.bias.requires_grad_(False)
        if cfg["model"].get("pos_embedding") == "sincos":  # the paper's fixed 2-D sine-cosine position embedding
            from pipeline.models.backbones import sincos_position_embedding

            pos = self.backbone.vit.encoder.pos_embedding
            with torch.no_grad():
                pos.copy_(sincos_position_embedding(self.backbone.grid, pos.shape[-1]).unsqueeze(0))
            pos.requires_grad_(False)
        self.networks(
            bare_mlp(self.dim, self.hidden, self.out_dim, 3, True, last_bn=True),
            bare_mlp(self.out_dim, self.hidden, self.out_dim, 2, True, last_bn=True),  # MoCo_ViT's predictor
            total_steps,
        )
        decay_all = bool(cfg["optim"].get("decay_bias_and_norm"))
        self.opt = bare_adamw([self.online, self.predictor], self.lr, cfg["optim"]["betas"], self.wd, device, decay_all)

    def pair_loss(self, q, k):
        logits = F.normalize(q, dim=1) @ F.normalize(k, dim=1).t() / self.t
        return 2 * self.t * F.cross_entropy(logits, torch.arange(q.shape[0], device=q.device))
