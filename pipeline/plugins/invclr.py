"""InvCLR (Foster et al. 2021, docs/methods/invclr.md): the gradient penalty that makes the first view's
representation insensitive to its differentiable augmentation parameters alpha (Eq. 13): lambda times the mean
over L fresh draws alpha' of (grad_alpha F . (alpha' - alpha))^2, F = e . h/|h| with Rademacher e and h the backbone
features, clipped from above.

alpha is the colour distortion (brightness, contrast, saturation, hue) for natural images (augment=invclr: the
method runs the colour stage, so d image / d alpha exists), or Spirograph's six nuisance parameters (the view is
re-rendered from the sample's factors with alpha requiring grad).
"""

from __future__ import annotations

from typing import cast

import torch

from pipeline import dist
from pipeline.augment.view_makers import image_recipe
from pipeline.data.spirograph import NUISANCE, TARGETS, render_flat, sample_nuisance
from pipeline.fields import Bool, Int, Num, Section
from pipeline.losses.invclr import gradient_penalty
from pipeline.plugins.base import Plugin, PluginRun
from pipeline.run_shape import RunShape


class InvCLR(Plugin):
    name = "invclr"
    needs = (frozenset({"features"}),)
    loss_terms = ("invclr_penalty",)

    class Settings(Section):
        lam: Num(ge=0)  # lambda, the penalty's weight
        n_samples: Int(1)  # L: fresh alpha' draws per sample
        clip: Num(ge=0, null=True) = None  # the batch-mean penalty's upper clamp; null: none
        normalize: Bool() = True  # F = e . h/|h| (false: the code's --no-gp-normalization)

    @classmethod
    def check(cls, s: Section, shape: RunShape) -> None:
        lam = cast(InvCLR.Settings, s).lam  # the registry hands each plug-in its own Settings
        if shape.compile and lam > 0:
            raise ValueError(
                "train.compile=true cannot run InvCLR's gradient penalty (torch.compile has no double "
                "backward): drop train.compile or set plugin.invclr.lam=0"
            )
        if shape.augment.get("kind") != "spirograph":
            cls.colour_law(shape.augment)

    @staticmethod
    def colour_law(aug) -> list[tuple[float, float]]:
        """The first view's colour-jitter ranges (brightness, contrast, saturation, hue), which alpha' is drawn from:
        ValueError with one line for a recipe whose colour stage does not run in the model."""
        spec = image_recipe(aug).views[0]
        if spec.color_stage != "model":
            raise ValueError(
                "plugin invclr needs a recipe whose colour stage runs in the model "
                "(augment=invclr, or color_stage: model) or Spirograph views"
            )
        b, c, sat, h = spec.jitter
        return [(max(0.0, 1 - b), 1 + b), (max(0.0, 1 - c), 1 + c), (max(0.0, 1 - sat), 1 + sat), (-h, h)]

    def __init__(self, s: Settings, run: PluginRun):
        super().__init__()
        self.lam = float(s.lam)
        self.n_samples = int(s.n_samples)
        self.clip = None if s.clip is None else float(s.clip)
        self.normalize = bool(s.normalize)
        self.spirograph = run.augment.get("kind") == "spirograph"
        self.size = int(run.augment["size"]) if self.spirograph else None
        if not self.spirograph:
            self.law = self.colour_law(run.augment)
        self.seed = run.seed
        self._gen: torch.Generator | None = None

    def alpha_grad_views(self) -> tuple[int, ...]:
        return (0,)  # the penalty is on the first view's representation

    def _generator(self) -> torch.Generator:
        if self._gen is None:  # per rank, so ranks draw different e and alpha'
            self._gen = torch.Generator().manual_seed(self.seed * 7919 + dist.rank() + 1)
        return self._gen

    def prepare(self, method, images, params, alphas):
        if not self.spirograph:
            return images
        p = params[0]
        device = images[0].device
        alpha = torch.stack([p[k].float() for k in NUISANCE], 1).to(device).requires_grad_(True)
        flat = {k: p[k].float().to(device) for k in TARGETS}
        flat.update(zip(NUISANCE, alpha.unbind(1)))
        alphas[0] = alpha
        return [render_flat(flat, self.size), *images[1:]]

    def _alpha_prime(self, k: int, d: int) -> torch.Tensor:
        g, n = self._generator(), k * self.n_samples
        if self.spirograph:
            draws = sample_nuisance(n, g)
            a = torch.stack([draws[name] for name in NUISANCE], 1)
        else:
            u = torch.rand(n, d, generator=g, dtype=torch.float64)
            lo = torch.tensor([lo for lo, _ in self.law], dtype=torch.float64)
            hi = torch.tensor([hi for _, hi in self.law], dtype=torch.float64)
            a = lo + u * (hi - lo)
        return a.view(k, self.n_samples, d)

    def loss(self, method, images, params, ctx):
        alpha = ctx.alphas.get(0)
        if alpha is None:
            raise RuntimeError("InvCLR: view 0 has no differentiable alpha")
        h = ctx.features[0].float()
        k, d = alpha.shape
        alpha_prime = self._alpha_prime(k, d).to(alpha.device, alpha.dtype)
        e = torch.randint(0, 2, h.shape, generator=self._generator()).to(h.device, h.dtype) * 2 - 1
        penalty = gradient_penalty(h, alpha, alpha_prime, e, clip=self.clip, lam=1.0, normalize=self.normalize)
        return {"invclr_penalty": (penalty, self.lam)}
