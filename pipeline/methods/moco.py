"""MoCo v1/v2 (He et al. 2020; Chen et al. 2020): query encoder, momentum key encoder, queue, shuffle-BN."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pipeline import dist
from pipeline.losses import info_nce
from pipeline.methods.base import Method, build_encoder, unwrap
from pipeline.methods.context import StepContext
from pipeline.models.momentum import Queue, ema_update, momentum_copy
from pipeline.models.split_bn import convert_split_bn
from pipeline.schedules import Momentum


class MoCo(Method):
    provides = frozenset({"features", "pairs", "queue"})

    def __init__(self, cfg: dict):
        super().__init__()
        m = cfg["method"]
        self.temperature = float(m["temperature"])
        self.momentum = Momentum(m["momentum"], m.get("momentum_cosine", False))
        self.bn_splits = int(m.get("bn_splits", 1))
        self.symmetric = bool(m.get("symmetric", False))
        encoder = build_encoder(cfg["model"], m["head"])
        convert_split_bn(encoder, self.bn_splits)
        self.online = encoder
        self.key_encoder = momentum_copy(encoder)
        self.queue = Queue(int(m["queue_size"]), int(m["head"]["out_dim"]), seed=int(cfg.get("seed", 0)))

    @torch.no_grad()
    def _keys(self, x: torch.Tensor) -> torch.Tensor:
        """Key projections with shuffle-BN: the global key batch is permuted before the key encoder sees
        it, so no key shares BN statistics with its own query's group (on N workers or in N BN splits)."""
        x_all = dist.gather_nograd(x)
        perm = torch.randperm(x_all.shape[0], device=x.device)
        dist.broadcast_(perm)
        b, r = x.shape[0], dist.rank()
        mine = perm[r * b : (r + 1) * b]
        k = F.normalize(self.key_encoder(x_all[mine]).float(), dim=1)
        k_all = dist.gather_nograd(k)
        unshuffled = torch.empty_like(k_all)
        unshuffled[perm] = k_all
        return unshuffled[r * b : (r + 1) * b]

    def query(self, x: torch.Tensor, with_features: bool = False):
        """L2-normalised query projections (float32: losses run in float32 under autocast); with_features also
        returns the backbone features."""
        h, z = self.online(x, with_features=True)
        q = F.normalize(z.float(), dim=1)
        return (h, q) if with_features else q

    def framework_loss(self, images: list[torch.Tensor], params: list[dict] | None = None) -> dict:
        x1, x2 = images[0], images[1]
        queue = self.queue.keys.clone()  # the loss must see the queue before this step's keys join it
        h1, q1 = self.query(x1, with_features=True)
        k2 = self._keys(x2)
        loss = info_nce(q1, k2, queue, self.temperature)
        keys = k2
        # pairs (query, its positive key) for plug-ins that add terms per pair (CO2, CLSA)
        ctx = StepContext(features=[h1], pairs=[(q1, k2)], queue=queue)
        if self.symmetric:
            # both views serve as query and key (as in MoCo v3 and MoCo's CIFAR demo): twice the signal a step.
            # Two forwards through DDP are fine: autograd sums both uses before each gradient hook fires.
            h2, q2 = self.query(x2, with_features=True)
            k1 = self._keys(x1)
            loss = loss + info_nce(q2, k1, queue, self.temperature)
            keys = torch.cat([k1, k2])
            ctx.pairs.append((q2, k1))
            ctx.features.append(h2)
        self.queue.push(dist.gather_nograd(keys))
        return {"loss": loss, "pos_sim": (q1.detach() * k2).sum(1).mean(), "ctx": ctx}

    def update_momentum(self, progress: float) -> None:
        ema_update(self.key_encoder, unwrap(self.online), self.momentum.update(progress))
