"""SimSiam (Chen & He 2021): a Siamese network with a predictor and a stop-gradient; no negatives, no momentum
encoder."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pipeline.losses.predictive import negative_cosine
from pipeline.methods.base import build_encoder
from pipeline.methods.context import StepContext
from pipeline.methods.predictor import PredictorEncoder, PredictorMethod, build_predictor
from pipeline.methods.settings import Head, MethodRun, MethodSettings


class SimSiam(PredictorMethod):
    """SimSiam (Chen & He 2021, "Exploring Simple Siamese Representation Learning"). `online` = backbone +
    projector (3 fc layers, BN on each including the output) + predictor (the bottleneck MLP 2048→512→2048: BN on
    the hidden fc, none on the output). Loss: L = ½D(p1, sg(z2)) + ½D(p2, sg(z1)) with D the negative cosine
    (Eq. 3). Paper optimiser: SGD, lr 0.05·batch/256 (cosine), wd 1e-4, momentum 0.9."""

    kind = "simsiam"

    provides = frozenset({"features", "embed", "embed_target"})

    class Settings(MethodSettings):
        head: Head  # required: the projection head it trains

    def __init__(self, s: Settings, run: MethodRun):
        super().__init__()
        self.fix_predictor_lr = bool(s.fix_predictor_lr)
        head = s.head
        # BN after every fc of the projector, its output fc's too (no ReLU, no affine parameters, as in the paper's
        # code; that fc's bias, which BN would cancel, is dropped)
        encoder = build_encoder(run.model, head, last_bn=head.bn)
        projector = encoder.projector
        out_dim = int(head.out_dim)
        predictor = build_predictor(out_dim, s.predictor, max(1, out_dim // 4))  # the paper's bottleneck: 512 for 2048
        self.online = PredictorEncoder(encoder.backbone, projector, predictor)

    def framework_loss(self, images: list[torch.Tensor], params: list[dict] | None = None) -> dict:
        # one forward per view (per-view BN statistics, as in the paper's pseudocode); two forwards through DDP
        # are fine: autograd sums both uses before each gradient hook fires
        h1, z1, p1 = self.online(images[0], with_features=True, predict=True)
        h2, z2, p2 = self.online(images[1], with_features=True, predict=True)
        z1, z2, p1, p2 = z1.float(), z2.float(), p1.float(), p2.float()  # losses in float32 under autocast
        loss = 0.5 * negative_cosine(p1, z2) + 0.5 * negative_cosine(p2, z1)
        # the paper's collapse monitor (Fig. 2): per-dimension std of the normalised projection, 1/sqrt(d) when
        # the outputs spread over the sphere, 0 when they collapse
        z_std = F.normalize(z1.detach(), dim=1).std(dim=0).mean()
        return {"loss": loss, "z_std": z_std, "ctx": StepContext(features=[h1, h2])}
