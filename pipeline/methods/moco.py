"""MoCo v1/v2 (He et al. 2020; Chen et al. 2020): query encoder, momentum key encoder, queue, and the key encoder's
BatchNorm kept from leaking (shuffle-BN and its variants: methods/key_bn.py)."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union, cast

import torch
import torch.nn.functional as F
from pydantic import Field, StrictInt

from pipeline import dist
from pipeline.fields import Allowed, Bool, Choice, Int, Num, bad
from pipeline.losses.contrastive import info_nce
from pipeline.methods import key_bn
from pipeline.methods.base import Method, build_encoder, unwrap
from pipeline.methods.context import StepContext
from pipeline.methods.settings import Head, MethodRun, MethodSettings, MomentumSettings
from pipeline.models.momentum import Queue, ema_update, momentum_copy
from pipeline.models.split_bn import convert_split_bn
from pipeline.models.sync_bn import convert_sync_stats_bn
from pipeline.run_shape import RunShape
from pipeline.schedules import Momentum

KEY_BN_MODES = key_bn.MODES  # by another name: the Settings field `key_bn` hides the module in its class body


class MoCo(Method):
    kind = "moco"
    provides = frozenset({"features", "pairs", "queue", "temperature", "embed", "embed_target"})

    class Settings(MomentumSettings):
        head: Head  # required: the projection head it trains
        temperature: Num(gt=0)
        symmetric: Bool() = False
        queue_size: Int(1)
        bn_splits: Annotated[
            Union[Literal["auto"], Annotated[StrictInt, Field(ge=1)]], Allowed("auto or an integer >= 1")
        ] = "auto"
        key_bn: Choice(*KEY_BN_MODES, null=True) = None  # null: auto

    @classmethod
    def check(cls, s: MethodSettings, shape: RunShape) -> None:
        own = cast(MoCo.Settings, s)  # the registry hands each method its own Settings
        workers, key = shape.workers, own.key_bn or "auto"
        if key in ("sync", "shuffle_node") and workers < 2:
            raise bad(
                "method.key_bn",
                key,
                "needs 2 or more workers (trainer.num_workers): one worker shares its statistics with nobody; use "
                "split (BN groups within the worker) or auto",
            )
        splits = key_bn.split_groups(own.bn_splits, key, workers)
        if key == "sync" and splits != 1:
            raise bad("method.bn_splits", splits, "must be 1 with method.key_bn=sync (the key encoder's BN is synced)")
        if key == "split" and splits < 2:
            raise bad("method.bn_splits", splits, "must be 2 or more with method.key_bn=split (its BN groups)")
        local_bs = shape.local_batch
        if local_bs % splits:
            raise bad(
                "method.bn_splits",
                own.bn_splits,
                f"per-worker batch {local_bs} does not split into method.bn_splits={splits} groups "
                f"(shuffle-BN); use a batch that is a multiple of {splits * workers}, or set "
                f"method.bn_splits to a divisor of {local_bs}",
            )

    @classmethod
    def complete(cls, s: MethodSettings, shape: RunShape) -> dict[str, Any]:
        own = cast(MoCo.Settings, s)
        key = own.key_bn or "auto"  # key_bn.resolve decides `auto` by the workers' node layout, as training starts
        return {"bn_splits": key_bn.split_groups(own.bn_splits, key, shape.workers), "key_bn": key}

    def __init__(self, s: Settings, run: MethodRun):
        super().__init__()
        self.temperature = float(s.temperature)
        self.momentum = Momentum(s.momentum, s.momentum_cosine)
        # settled by `complete` (key_bn.split_groups); a config that never went through it splits nothing
        self.bn_splits = 1 if s.bn_splits == "auto" else int(s.bn_splits)
        self.symmetric = bool(s.symmetric)
        encoder = build_encoder(run.model, s.head)
        convert_split_bn(encoder, self.bn_splits)
        self.online = encoder
        self.key_encoder = momentum_copy(encoder)
        self.queue = Queue(int(s.queue_size), int(s.head.out_dim), seed=run.seed)
        nodes = dist.node_ranks()
        self.key_bn = key_bn.resolve(s.key_bn or "auto", nodes)
        self._groups = key_bn.shuffle_groups(self.key_bn, nodes)
        if self.key_bn == "sync":
            convert_sync_stats_bn(self.key_encoder)
        # the same permutations on every rank without a broadcast
        self._perm_rng = torch.Generator().manual_seed(run.seed)

    @torch.no_grad()
    def _keys(self, x: torch.Tensor) -> torch.Tensor:
        """L2-normalised key projections, each computed in the batch method.key_bn deals its view to, and returned
        in x's order (methods/key_bn.py)."""

        def encode(views: torch.Tensor) -> torch.Tensor:
            return F.normalize(self.key_encoder(views).float(), dim=1)

        if self.key_bn == "sync":
            return encode(x)
        perm = key_bn.permutation(x.shape[0], self._groups, self._perm_rng)
        return key_bn.shuffled_keys(encode, x, perm, local=all(len(g) == 1 for g in self._groups))

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
        ctx = StepContext(features=[h1], pairs=[(q1, k2)], queue=queue, temperature=self.temperature)
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
