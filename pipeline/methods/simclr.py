"""SimCLR (Chen et al. 2020): NT-Xent over both views, negatives gathered from every worker."""
from __future__ import annotations

import torch

from pipeline import dist
from pipeline.losses import nt_xent_anchors
from pipeline.methods.base import Method, build_encoder


class SimCLR(Method):
    def __init__(self, cfg: dict):
        super().__init__()
        m = cfg["method"]
        self.temperature = float(m["temperature"])
        self.online = build_encoder(cfg["model"], m["head"])

    def training_step(self, images: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        b = images[0].shape[0]
        # one forward over both views: DDP expects a single forward per backward
        z = self.online(torch.cat([images[0], images[1]])).float()  # loss in float32 under autocast
        z1, z2 = z[:b], z[b:]
        c1, c2 = dist.gather_grad(z1), dist.gather_grad(z2)
        loss = nt_xent_anchors(z1, z2, c1, c2, self.temperature, offset=dist.rank() * b)
        return {"loss": loss}
