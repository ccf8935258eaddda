"""CoCor (Wang et al., TMLR; docs/methods/cocor.md): DA consistency. Each composite view A_l(x) (lengths 1, 2, 3 from
the 14-op pool, augment=cocor) should stay at least as similar to the original as its target g(v(A_l)), which never
rises when ops are added. The target is learned bi-level from a small labelled subset, or fixed (Table 9).

One step (Algorithm 1, Eq. 8, Eq. 20):
1. `loss`, inside the encoder's step: latent similarities s_l = f(A_l(x))ᵀ sg(f(x)) (f(x): the mean of the two
   standard views' no-grad embeddings, the code's "center"), the consistency loss against the detached targets,
   and CE(θe), the labelled loss of a linear head on frozen backbone features before the step.
2. the loop's optimiser step gives θe'.
3. `outer_loss`: a side-effect-free second forward at θe' (buffers such as MoCo's queue and BN statistics are
   restored after it) gives L_u(θe') and s'_l; the labelled loss at θe' gives CE(θe'). The loss it returns moves
   the target network along the finite-difference hypergradient (losses.cocor.cocor_target_surrogate) and the
   linear head along CE(θe'); the loop steps both `optimizers` (pipeline.train.plugin_optim: averaged across
   workers, scheduled, checkpointed), the target network frozen for its first epochs.

The outer loss is cross-entropy for class labels and MSE (on standardised targets) for regression targets such as
Spirograph's (m, b, σ, f_r).
"""

from __future__ import annotations

from functools import partial
from typing import Any, Mapping, cast

import torch
import torch.nn.functional as F
from pydantic import StrictFloat
from torch import nn

from pipeline import dist
from pipeline.augment.strong import POOLS
from pipeline.augment.torch_exec import eval_transform
from pipeline.augment.view_makers import eval_settings, image_recipe
from pipeline.curve_panels import Panel
from pipeline.data.labelled import LabelledBatches, labelled_subset
from pipeline.data.manifest import read_manifest
from pipeline.fields import Choice, Int, Num, Section, field
from pipeline.losses.cocor import COCOR_FORMS, cocor_consistency, cocor_target_surrogate
from pipeline.models.mmnn import MonotoneTarget
from pipeline.plugins.base import OwnOptimizer, Plugin, PluginRun
from pipeline.run_shape import RunShape
from pipeline.schedules import cosine, warmup_cosine


class CoCor(Plugin):
    name = "cocor"
    needs = (frozenset({"embed", "embed_target"}),)  # it embeds the composite views and the originals through them
    loss_terms = ("cocor_consistency",)
    panels = (  # each composite length's target beside the similarity it constrains, in one colour
        Panel(
            "CoCor: target g(v) (solid) and latent similarity (dashed) per composite length",
            r"cocor_(?:target|sim)_l(\d+)",
            dashed="cocor_sim_",
        ),
    )

    class Settings(Section):
        weight: Num(ge=0) = 1.0  # alpha on the consistency loss
        form: Choice(*COCOR_FORMS) = "code"  # losses.cocor.cocor_consistency
        target: Choice("learned", "fixed") = "learned"  # learned: MMNN, bi-level; fixed: Table 9's constants
        # one per composite view; null (or empty): table9's for each view's length
        fixed_targets: field(list[StrictFloat], "a list of numbers", null=True) = None
        # Table 9's hand-tuned targets for composite lengths 1, 2, 3 (conf/plugin/cocor.yaml's per_method table):
        # the fixed targets, and where the learned ones start
        table9: field(list[StrictFloat], "a list of numbers", null=True) = None
        hidden: Int(1) = 64  # the MMNN's width
        target_lr: Num(ge=0) = 0.05  # eta_d
        target_freeze_epochs: Int(0) = 3  # the MMNN's lr is 0 for these first epochs ...
        target_warmup_epochs: Int(0) = 2  # ... then warms up linearly over these, then cosine
        classifier_lr: Num(ge=0) = 0.4  # the outer loss's linear head
        labelled_fraction: Num(gt=0, le=1) = 0.01  # of the pretraining split; class-balanced, seeded
        labelled_batch: Int(1) = 64
        # derived: the sign from differentiating the one-step update; paper: Eq. 20 as printed
        hypergradient: Choice("derived", "paper") = "derived"
        min_denominator: Num(gt=0) = 1e-4  # |L_u' - L_u| floor in the hypergradient ratio
        # null: the code's step size. N: the step scaled so that the run's updates add up to the learning rate N
        # updates of the code's schedule would (its IN-100 run: 200 epochs of ~500 steps, ~98,500 after the freeze);
        # at a CPU budget of a few hundred updates the code's step leaves the targets where they start
        target_lr_match: Int(1, null=True) = None

    @classmethod
    def check(cls, s: Section, shape: RunShape) -> None:
        cls.lengths_and_targets(cast(CoCor.Settings, s), shape.augment)

    @staticmethod
    def lengths_and_targets(s: Settings, aug: Mapping[str, Any]) -> tuple[list[int], list[int], dict[int, float]]:
        """The composite views' indices, their lengths and each length's constant target: ValueError with one line
        for a recipe without composite views or a length no target is given for."""
        if aug.get("kind", "views") != "views":
            raise ValueError("plugin cocor needs composite image views: augment=cocor")
        views = image_recipe(aug).views
        composites = [i for i, v in enumerate(views) if i >= 2 and v.strong_ops]
        if not composites:
            raise ValueError("plugin cocor needs composite views after the two standard ones: augment=cocor")
        lengths = [views[i].strong_ops for i in composites]
        fixed = s.fixed_targets
        table = dict(zip(lengths, fixed)) if fixed else dict(enumerate(s.table9 or [], start=1))
        missing = [n for n in lengths if n not in table]
        if missing:
            raise ValueError(
                f"plugin.cocor.fixed_targets: no target for composite lengths {missing} "
                "(table9 covers 1, 2, 3; give one value per composite view)"
            )
        return composites, lengths, {n: float(table[n]) for n in lengths}

    def __init__(self, s: Settings, run: PluginRun):
        super().__init__()
        aug = run.augment
        self.composites, self.lengths, self.constants = self.lengths_and_targets(s, aug)
        self.n_ops = len(POOLS[image_recipe(aug).views[self.composites[0]].strong_pool])
        self.weight = float(s.weight)
        self.form = s.form
        self.mode = s.target
        self.sign = {"derived": -1.0, "paper": 1.0}[s.hypergradient]
        self.min_denominator = float(s.min_denominator)
        self.target_lr, self.classifier_lr = float(s.target_lr), float(s.classifier_lr)
        self.lr_match: int | None = s.target_lr_match
        self.epochs = run.epochs
        self.freeze_epochs = int(s.target_freeze_epochs)
        self.warmup_epochs = int(s.target_warmup_epochs)
        self.schedule(1)  # until the loop tells it the run's steps per epoch
        self.fraction = float(s.labelled_fraction)
        self.labelled_batch = int(s.labelled_batch)
        self.task, self.targets = run.data_task, run.data_targets
        self.data_root, self.seed, self.aug = run.data_train, run.seed, aug
        if self.mode == "learned":
            self.target = MonotoneTarget(self.n_ops, int(s.hidden), seed=self.seed)
            self.target.fit_constants(self.constants, self.n_ops, seed=self.seed)  # the same on every rank
        self._labelled: LabelledBatches | None = None  # loaded on first use
        self._pending: dict | None = None

    # -- networks sized by the backbone ------------------------------------------------------------------------
    def schedule(self, steps_per_epoch: int) -> None:
        self.total_steps = max(1, steps_per_epoch * self.epochs)
        self.freeze_steps = steps_per_epoch * self.freeze_epochs
        self.warmup_steps = steps_per_epoch * self.warmup_epochs
        updates = max(1, self.total_steps - self.freeze_steps)
        self.lr_scale = 1.0 if self.lr_match is None else self.lr_match / updates

    def attach(self, method) -> None:
        if self.mode != "learned":
            return
        dim = method.backbone.feat_dim
        n_out = len(self.targets or []) if self.task == "regression" else int(self._n_classes())
        self.classifier = nn.Linear(dim, n_out)
        with torch.no_grad():  # seeded: the same head on every worker
            self.classifier.weight.normal_(0, 0.01, generator=torch.Generator().manual_seed(self.seed + 1))
            self.classifier.bias.zero_()
        self.target_opt = torch.optim.SGD(self.target.parameters(), lr=0.0, momentum=0.9)
        self.classifier_opt = torch.optim.SGD(
            self.classifier.parameters(), lr=self.classifier_lr, momentum=0.9, weight_decay=1e-4
        )

    def _n_classes(self) -> int:
        manifest, _ = read_manifest(self.data_root)
        names = manifest.get("class_names") or []
        if not names:
            raise ValueError("plugin cocor (learned targets) on classification data needs class_names in the manifest")
        return len(names)

    # -- the encoder step ---------------------------------------------------------------------------------------
    def _similarities(self, embed, embed_target, images) -> list[torch.Tensor]:
        anchor = F.normalize(embed_target(images[0]) + embed_target(images[1]), dim=1)
        return [(embed(images[i]) * anchor).sum(1) for i in self.composites]

    def _targets(self, params, device) -> list[torch.Tensor]:
        if self.mode == "fixed":
            b = params[self.composites[0]]["counts"].shape[0]
            return [torch.full((b,), self.constants[n], device=device) for n in self.lengths]
        with torch.no_grad():  # θd is fixed in the lower-level step
            return [self.target(params[i]["counts"].to(device)) for i in self.composites]

    def loss(self, method, images, params, ctx):
        sims = self._similarities(ctx.embed, ctx.embed_target, images)
        targets = self._targets(params, sims[0].device)
        value = cocor_consistency(sims, targets, self.form)
        out = {"cocor_consistency": (value, self.weight)}
        for n, s, g in zip(self.lengths, sims, targets):
            out[f"cocor_sim_l{n}"] = (s.detach().mean(), None)
            out[f"cocor_target_l{n}"] = (g.mean(), None)
        if self.mode == "learned":
            x, y = self._labelled_batch(sims[0].device)
            self._pending = {
                "x": x,
                "y": y,
                "s": torch.stack([s.detach().mean() for s in sims]),
                "targets": targets,
                "ce": self._outer_loss(method, x, y).detach(),
            }
        return out

    # -- the upper-level step -----------------------------------------------------------------------------------
    def _labelled_batch(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        if self._labelled is None:
            self._labelled = self._load_labelled(pin=device.type == "cuda")
        return self._labelled.next()

    def _load_labelled(self, pin: bool = False) -> LabelledBatches:
        split = labelled_subset(self.data_root, self.task, self.targets, self.fraction, self.seed)
        gen = torch.Generator().manual_seed(self.seed * 7919 + dist.rank() + 11)  # ranks draw different batches
        size, mean, std = eval_settings(self.aug)  # the kNN monitor's and the probe's un-augmented view
        transform = partial(eval_transform, size=size, mean=mean, std=std)
        print(
            f"[cocor] labelled subset: {len(split.encoded)} samples ({self.fraction:.1%} of {self.data_root})",
            flush=True,
        )
        return LabelledBatches(split, transform, self.labelled_batch, gen, self.task, ahead=True, pin=pin)

    def _outer_loss(self, method, x, y) -> torch.Tensor:
        """The labelled loss of the linear head on frozen backbone features (eval-mode BN: no statistics drift)."""
        backbone = method.backbone
        was = backbone.training
        backbone.eval()
        with torch.no_grad():
            h = backbone(x.to(next(backbone.parameters()).device, non_blocking=True)).float()
        backbone.train(was)
        # unit-length features: the head's step size (the code's lr 0.4) then does not depend on the backbone's
        # feature scale, which at CPU scale made an MSE head diverge
        pred = self.classifier(F.normalize(h, dim=1))
        y = y.to(pred.device, non_blocking=True)
        return F.cross_entropy(pred, y) if self.task == "classification" else F.mse_loss(pred, y)

    def _target_lr(self, updates: int) -> float:
        """Zero for the first epochs, then the encoder's own schedule (warm-up, cosine): the code's MMNN schedule."""
        if updates < self.freeze_steps:
            return 0.0
        return warmup_cosine(
            updates - self.freeze_steps,
            self.total_steps - self.freeze_steps,
            self.warmup_steps,
            self.target_lr * self.lr_scale,
        )

    def optimizers(self) -> dict[str, OwnOptimizer]:
        if self.mode != "learned":
            return {}
        return {
            "target": OwnOptimizer(self.target_opt, lambda updates, progress: self._target_lr(updates)),
            "classifier": OwnOptimizer(
                self.classifier_opt, lambda updates, progress: cosine(progress, self.classifier_lr, 0.0)
            ),
        }

    def outer_loss(self, method, images, params, out):
        if self.mode != "learned" or self._pending is None:
            return None, {}
        pending, self._pending = self._pending, None
        # L_u and s at θe': the same views, no gradient, and the method's state put back (queue, BN statistics)
        with torch.no_grad(), method.state_kept():
            sims = self._similarities(method.embed, method.embed_target, images)  # the bi-level part: θe' itself
            consistency = cocor_consistency(sims, pending["targets"], self.form)
        lu_after = method.loss_again(images, params) + self.weight * consistency
        s_after = torch.stack([s.mean() for s in sims]).float()
        # no value is read back to the host here (float() would stall a GPU's queue mid-step): the loop reads the
        # logged tensors once, after the step; the differences are taken in float64, as of Python numbers before
        lu_before = out["loss"].detach().double()
        ce_before, lu_after = pending["ce"].double(), lu_after.detach().double()
        ce_after = self._outer_loss(method, pending["x"], pending["y"])
        g_bar = self._mean_targets(params, s_after.device)
        self._moved_from = g_bar.detach().float()
        surrogate = cocor_target_surrogate(
            g_bar.float(),
            pending["s"].float(),
            s_after,
            ce_before,
            ce_after.detach(),
            lu_before,
            lu_after,
            min_denominator=self.min_denominator,
            sign=self.sign,
        )
        ce = ce_after.detach().double()
        logged = {
            "cocor_outer_loss": ce,
            "cocor_outer_gain": ce_before - ce,
            # the finite differences Eq. 20 multiplies: the unsupervised loss's and the similarities' per-step changes
            "cocor_lu_change": lu_after - lu_before,
            "cocor_sim_change": (s_after - pending["s"].float()).abs().mean(),
        }
        return surrogate + ce_after, logged

    def after_outer_step(self, method, params):
        with torch.no_grad():  # how far this step moved the batch's mean targets (the hypergradient's reach)
            moved = self._mean_targets(params, self._moved_from.device).float() - self._moved_from
        return {"cocor_target_step": moved.abs().mean()}

    def _mean_targets(self, params, device) -> torch.Tensor:
        return torch.stack([self.target(params[i]["counts"].to(device)).mean() for i in self.composites])
