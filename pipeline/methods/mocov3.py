"""MoCo v3 (Chen, Xie, He 2021, "An Empirical Study of Training Self-Supervised Vision Transformers")."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pipeline import dist
from pipeline.fields import Bool, Num
from pipeline.losses.contrastive import mocov3_loss
from pipeline.methods.base import Encoder
from pipeline.methods.context import StepContext
from pipeline.methods.predictor import PredictorEncoder, PredictorMethod, build_predictor
from pipeline.methods.settings import Head, MethodRun, MomentumSettings
from pipeline.models.backbones import build_backbone
from pipeline.models.catalogue import is_vit
from pipeline.models.heads import mlp_head
from pipeline.models.momentum import momentum_copy
from pipeline.schedules import Momentum


class MoCoV3(PredictorMethod):
    """Online: backbone + projector + predictor (`online`, the module DDP wraps); momentum encoder: an EMA copy of
    backbone + projector. As the authors' `_build_mlp`: every Linear bias-free, BN after each hidden fc, and a BN
    without affine after the output of the projector and, on a ViT, of the predictor too (`MoCo_ViT`; the ResNet
    model's predictor ends with its Linear). Projector: 3 layers on a ViT, 2 on a ResNet; predictor: 2.

    Loss (Alg. 1): ctr(q1, k2) + ctr(q2, k1), ctr the InfoNCE of each query against every worker's keys of the other
    view, scaled by 2τ; no queue. τ is 0.2 for ViT and 1.0 for ResNet-50 (method.temperature null picks by the
    backbone). The momentum follows a cosine from 0.99 to 1. On a ViT the patch projection is random and frozen
    (§5, "random patch projection", method.random_patch_projection). The paper's optimisers: AdamW for ViT,
    LARS for ResNet (+experiment=mocov3_vit, mocov3_resnet)."""

    kind = "mocov3"

    provides = frozenset({"features", "pairs", "key_bank", "temperature", "embed", "embed_target"})

    class Settings(MomentumSettings):
        head: Head  # required: the projection head it trains
        temperature: Num(gt=0, null=True) = None  # null: 0.2 for a ViT, 1.0 for a ResNet (the paper's)
        random_patch_projection: Bool() = True  # on a ViT: the patch projection frozen at its random init
        momentum_cosine: Bool() = True  # the key encoder's momentum rises to 1 along a cosine (the authors')

    def __init__(self, s: Settings, run: MethodRun):
        super().__init__()
        self.fix_predictor_lr = bool(s.fix_predictor_lr)
        model = run.model
        vit = is_vit(model["backbone"])
        self.temperature = float(s.temperature if s.temperature is not None else (0.2 if vit else 1.0))
        self.momentum = Momentum(s.momentum, s.momentum_cosine)
        backbone = build_backbone(model)
        if vit and s.random_patch_projection:
            backbone.freeze_patch_projection()
        head, pred = s.head, s.predictor
        dim, out = backbone.feat_dim, int(head.out_dim)
        hidden = int(head.hidden_dim or dim)  # 4096 in the paper
        projector = mlp_head(dim, hidden, out, int(head.num_layers or (3 if vit else 2)), bn=True, last_bn=True)
        predictor = build_predictor(out, pred, hidden, last_bn=vit, last_bias=False)
        self.online = PredictorEncoder(backbone, projector, predictor)
        self.key_encoder = momentum_copy(Encoder(backbone, projector))

    @torch.no_grad()
    def _keys(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.key_encoder(x).float(), dim=1)

    def framework_loss(self, images: list[torch.Tensor], params: list[dict] | None = None) -> dict:
        x1, x2 = images[0], images[1]
        # one forward per view (per-view BN statistics, as the paper's code); DDP sums both uses before its hooks
        h1, q1 = self.query(x1, with_features=True)
        h2, q2 = self.query(x2, with_features=True)
        k1, k2 = self._keys(x1), self._keys(x2)
        bank1, bank2 = dist.gather_nograd(k1), dist.gather_nograd(k2)
        offset = dist.rank() * x1.shape[0]
        loss = mocov3_loss(q1, bank2, offset, self.temperature) + mocov3_loss(q2, bank1, offset, self.temperature)
        ctx = StepContext(
            features=[h1, h2],
            pairs=[(q1, k2), (q2, k1)],
            key_bank=[bank2, bank1],
            offset=offset,
            temperature=self.temperature,
        )
        return {
            "loss": loss,
            "pos_sim": (q1.detach() * k2).sum(1).mean(),
            "momentum": torch.tensor(self.momentum.value),
            "ctx": ctx,
        }

    def update_momentum(self, progress: float) -> None:
        self.ema_into(self.key_encoder, self.momentum.update(progress))
