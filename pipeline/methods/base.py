"""What every method shares: an online encoder (the only module DDP wraps) and the step contract."""

from __future__ import annotations

import contextlib
from typing import Any, ClassVar, Iterator, cast

import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from pipeline.methods.context import StepContext, visible
from pipeline.methods.settings import Head, MethodSettings
from pipeline.models.backbones import build_backbone
from pipeline.models.heads import mlp_head
from pipeline.run_shape import RunShape


class Encoder(nn.Module):
    """Backbone + projection head; `forward` returns the projection, `backbone` gives features."""

    def __init__(self, backbone: nn.Module, projector: nn.Module):
        super().__init__()
        self.backbone = backbone
        self.projector = projector

    def forward(self, x: torch.Tensor, with_features: bool = False):
        """The projection, or (backbone features, projection): through DDP's forward either way, so gradient
        synchronisation sees every use."""
        h = self.backbone(x)
        z = self.projector(h)
        return (h, z) if with_features else z


def build_encoder(model: dict, head: Head, last_bn: bool = False) -> Encoder:
    """The backbone the model section names and an MLP projector as `head` says (hidden_dim null: the backbone's
    feature dim; num_layers null: 2); `last_bn`: BN without affine parameters after its last Linear."""
    backbone = build_backbone(model)
    dim = backbone.feat_dim
    projector = mlp_head(
        dim,
        head.hidden_dim or dim,
        head.out_dim,
        head.num_layers or 2,
        head.bn,
        last_bn=last_bn,
        last_bias=head.last_bias,
        last_bn_scale=head.last_bn_scale,
    )
    return Encoder(backbone, projector)


def unwrap(module: nn.Module) -> nn.Module:
    """The module inside a DDP wrapper (or the module itself)."""
    return getattr(module, "module", module)


class Method(nn.Module):
    """One small class per framework.

    `online` holds every trainable network and is the one module wrapped in DDP, so gradient
    synchronisation covers exactly what the optimiser updates. Momentum encoders and queues live beside
    it and stay identical across ranks by construction.

    A method declares its `kind` and its settings (`Settings`, the `method.*` keys its conf/method/<name>.yaml
    gives, checked by the schema before the run starts), writes `framework_loss` (its loss and the StepContext it
    declares in `provides`) and, where it has them, the hooks around the optimiser step: `before_optimizer_step` (on the
    gradients) and `update_momentum` (momentum encoders, after the step).
    """

    kind: ClassVar[str]  # the name `method.kind` picks it by; a class that sets it is registered (pipeline.registry)
    Settings: type[MethodSettings] = MethodSettings
    online: nn.Module
    provides: frozenset[str] = frozenset()  # the StepContext fields framework_loss fills
    loss_terms: ClassVar[tuple[str, ...]] = ()  # logged parts of its loss, drawn beside it (pipeline.curve_panels)

    @classmethod
    def check(cls, s: MethodSettings, shape: RunShape) -> None:
        """What the method asks of the run (e.g. its BN groups against the per-worker batch): ConfigError with one
        line (pipeline.fields.bad). `s` is its `Settings`, already checked; `shape` what it may read of the run."""

    @classmethod
    def complete(cls, s: MethodSettings, shape: RunShape) -> dict[str, Any]:
        """The method's `auto` settings settled for this run, as `method.*` keys and values: the job writes them into
        the config once it is checked, so that the checkpoint's config rebuilds the same model."""
        return {}

    def __init__(self):
        super().__init__()
        self.plugins = nn.ModuleList()
        self.colour_stage = None  # set by build_method for recipes whose colour stage runs in the model

    def framework_loss(self, images: list[torch.Tensor], params: list[dict] | None = None) -> dict:
        """Return a dict with at least "loss" and "ctx" (the StepContext); other 0-dim entries are logged."""
        raise NotImplementedError

    def total_loss(self, images: list[torch.Tensor], params: list[dict] | None = None) -> dict:
        """framework_loss with the plug-ins: each may rewrite the views first (InvCLR's differentiable colour
        stage) and adds weighted loss terms after; every term is logged under its own name."""
        params = params or [{} for _ in images]
        grad_views = sorted({v for p in self.plugins for v in p.alpha_grad_views()})
        # a gradient through those parameters' gradient (InvCLR's penalty) through attention needs its plain (math)
        # kernel: the fused ones have no double backward
        with sdpa_kernel([SDPBackend.MATH]) if grad_views else contextlib.nullcontext():
            return self._total_loss(images, params, grad_views)

    def _total_loss(self, images: list[torch.Tensor], params: list[dict], grad_views: list[int]) -> dict:
        alphas = {}
        if self.colour_stage:
            images, alphas = self.colour_stage(images, params, grad_views)
        for plugin in self.plugins:
            images = plugin.prepare(self, images, params, alphas)
        out = self.framework_loss(images, params)
        ctx: StepContext = out.pop("ctx")
        ctx.alphas = alphas
        if "embed" in self.provides:
            ctx.embed, ctx.embed_target = self.embed, self.embed_target
        for plugin in self.plugins:
            for name, (value, weight) in plugin.loss(self, images, params, visible(ctx, plugin.needs)).items():
                if weight is not None:  # None: logged only
                    out["loss"] = out["loss"] + weight * value
                out[name] = value.detach()
        return out

    @contextlib.contextmanager
    def state_kept(self) -> Iterator[None]:
        """Every buffer of the method (queues, BatchNorm statistics, centres) put back as it was once the block
        ends: a forward inside leaves no trace. A method with state outside its buffers overrides this."""
        saved = {name: b.clone() for name, b in self.named_buffers()}
        try:
            yield
        finally:
            for name, b in self.named_buffers():
                b.copy_(saved[name])

    @torch.no_grad()
    def loss_again(self, images: list[torch.Tensor], params: list[dict] | None = None) -> torch.Tensor:
        """The framework's loss of these views at the current weights: no gradient, no side effect (state_kept).
        CoCor's upper-level step re-evaluates the step's loss this way after the optimiser moved the weights."""
        with self.state_kept():
            return self.framework_loss(images, params)["loss"]

    def fixed_lr_parameters(self) -> list[nn.Parameter]:
        """Parameters the lr schedule leaves at its peak (a group of their own in the loop's optimiser); none here."""
        return []

    def before_optimizer_step(self, progress: float) -> dict:
        """Called between backward and the optimiser step (gradient surgery: DINO's last-layer freeze and
        clipping). Returns logged scalars."""
        return {}

    def update_momentum(self, progress: float) -> None:
        """Called after every optimiser step with progress in [0, 1]: momentum encoders follow their schedule."""

    def set_progress(self, progress: float) -> None:
        """Called when a run resumes, with the fraction of training done: methods that keep it (DINO's teacher
        temperature) take it up here rather than from 0."""

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """The L2-normalised float32 embedding of a further view, WITH gradient (StepContext.embed, for methods
        that provide "embed"). Default: the online encoder's projection (MoCo's query encoder, SimCLR/SupCon's
        encoder); BYOL, SimSiam and MoCo v3 add the predictor."""
        return nn.functional.normalize(self.online(x).float(), dim=1)

    @torch.no_grad()
    def embed_target(self, x: torch.Tensor) -> torch.Tensor:
        """The L2-normalised float32 embedding without gradient, by a target's path (StepContext.embed_target).
        Default: the online encoder's projection (for SimSiam and BYOL: stop-gradient backbone + projector, no
        predictor)."""
        return nn.functional.normalize(self.online(x).float(), dim=1)

    @property
    def backbone(self) -> nn.Module:
        return cast(Encoder, unwrap(self.online)).backbone  # every method's online network is an Encoder
