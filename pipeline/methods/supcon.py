"""SupCon (Khosla et al. 2020): contrastive learning where every view of the same class is a positive; needs
class labels. Negatives and labels are gathered from every worker."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pipeline import dist
from pipeline.fields import Num
from pipeline.losses.contrastive import supcon_loss
from pipeline.methods.base import Method, build_encoder
from pipeline.methods.context import StepContext
from pipeline.methods.settings import Head, MethodRun, MethodSettings


class SupCon(Method):
    """Supervised Contrastive Learning (Khosla et al. 2020). `online` = backbone + projection head (normalised);
    loss L^sup_out (Eq. 2) over the 2B views, positives = every other view with the anchor's label, temperature
    0.1 (the paper's value). Labels come in `params[0]["label"]` (int64 [B], shared by the views)."""

    kind = "supcon"

    provides = frozenset({"features", "projections", "gathered", "temperature", "embed", "embed_target"})

    class Settings(MethodSettings):
        head: Head  # required: the projection head it trains
        temperature: Num(gt=0)
        # the authors' loss is scaled by τ/base_temperature (losses.py, SupConLoss: base_temperature 0.07); null:
        # no factor, the paper's Eq. 2
        base_temperature: Num(gt=0, null=True) = None

    def __init__(self, s: Settings, run: MethodRun):
        super().__init__()
        self.temperature = float(s.temperature)
        self.scale = 1.0 if s.base_temperature is None else self.temperature / float(s.base_temperature)
        self.online = build_encoder(run.model, s.head)

    def query(self, x: torch.Tensor, with_features: bool = False):
        """The L2-normalised float32 projection; with_features also returns the backbone features."""
        h, z = self.online(x, with_features=True)
        q = F.normalize(z.float(), dim=1)
        return (h, q) if with_features else q

    @staticmethod
    def _labels(params: list[dict] | None) -> torch.Tensor:
        if not params or params[0].get("label") is None:
            raise ValueError("supcon needs class labels: use a dataset whose shards carry cls")
        return torch.as_tensor(params[0]["label"]).long()

    def framework_loss(self, images: list[torch.Tensor], params: list[dict] | None = None) -> dict:
        y = self._labels(params).to(images[0].device)
        b = images[0].shape[0]
        # one forward over both views, as SimCLR and the authors' code do (BN statistics over all 2B views)
        h, z = self.online(torch.cat([images[0], images[1]]), with_features=True)
        z = z.float()  # loss in float32 under autocast
        z1, z2 = z[:b], z[b:]
        c1, c2 = dist.gather_grad(z1), dist.gather_grad(z2)
        y_all = dist.gather_nograd(y)
        n, offset = c1.shape[0], dist.rank() * b
        local = torch.arange(b, device=z.device) + offset
        # anchors: this rank's 2b views; candidates: every rank's 2N views, laid out [all view 1, all view 2]
        loss = self.scale * supcon_loss(
            torch.cat([z1, z2]),
            torch.cat([y, y]),
            self.temperature,
            candidates=torch.cat([c1, c2]),
            candidate_labels=torch.cat([y_all, y_all]),
            self_index=torch.cat([local, local + n]),
        )
        ctx = StepContext(features=[h[:b], h[b:]], projections=(z1, z2), gathered=(c1, c2), offset=offset)
        ctx.temperature = self.temperature
        return {"loss": loss, "ctx": ctx}
