"""CoCor (Wang et al., TMLR; docs/methods/cocor.md): DA consistency. Each composite view A_l(x) (lengths 1, 2, 3 from
the 14-op pool, augment=cocor) should stay at least as similar to the original as its target g(v(A_l)), which never
rises when ops are added. The target is learned bi-level from a small labelled subset, or fixed (Table 9).

One step (Algorithm 1, Eq. 8, Eq. 20):
1. `loss`, inside the encoder's step: latent similarities s_l = f(A_l(x))ᵀ sg(f(x)) (f(x): the mean of the two
   standard views' no-grad embeddings, the code's "center"), the consistency loss against the detached targets,
   and CE(θe), the labelled loss of a linear head on frozen backbone features before the step.
2. the loop's optimiser step gives θe'.
3. `after_update`: a side-effect-free second forward at θe' (buffers such as MoCo's queue and BN statistics are
   restored after it) gives L_u(θe') and s'_l; the labelled loss at θe' gives CE(θe'); the target network takes a
   step along the finite-difference hypergradient (losses.cocor.cocor_target_surrogate), the linear head along CE(θe').
   Both are small networks outside DDP: their gradients are averaged across workers by hand.

The outer loss is cross-entropy for class labels and MSE (on standardised targets) for regression targets such as
Spirograph's (m, b, σ, f_r).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Sequence, cast

import torch
import torch.nn.functional as F
from torch import nn

from pipeline import dist
from pipeline.losses.cocor import COCOR_FORMS, cocor_consistency, cocor_target_surrogate
from pipeline.models.mmnn import MonotoneTarget
from pipeline.plugins.base import Plugin
from pipeline.schedules import cosine, warmup_cosine

if TYPE_CHECKING:
    import numpy as np

    from pipeline.data.reader import Split

    # CoCor's labelled subset, its eval transform (encoded -> (images, kept)) and the batch generator
    Labelled = tuple[Split, Callable[[Sequence[bytes]], tuple[torch.Tensor, np.ndarray]], torch.Generator]

# Table 9: hand-tuned constant targets per length (w/o MMNN), and the start of the learned targets
TABLE9 = {"moco": {1: 0.80, 2: 0.75, 3: 0.65}, "simsiam": {1: 0.75, 2: 0.70, 3: 0.60}}


class CoCor(Plugin):
    name = "cocor"
    frameworks = ("moco", "mocov3", "simsiam", "supcon", "byol", "simclr")
    needs = (frozenset({"embed", "embed_target"}),)  # it embeds the composite views and the originals through them

    def __init__(self, pcfg: dict, cfg: dict):
        super().__init__()
        from pipeline.augment.strong import POOLS
        from pipeline.augment.view_maker import image_recipe

        aug = cfg["augment"]
        if aug.get("kind", "views") != "views":
            raise ValueError("plugin cocor needs composite image views: augment=cocor")
        views = image_recipe(aug).views
        self.composites = [i for i, v in enumerate(views) if i >= 2 and v.strong_ops]
        if not self.composites:
            raise ValueError("plugin cocor needs composite views after the two standard ones: augment=cocor")
        self.lengths = [views[i].strong_ops for i in self.composites]
        self.n_ops = len(POOLS[views[self.composites[0]].strong_pool])
        self.weight = float(pcfg.get("weight", 1.0))
        self.form = pcfg.get("form", "code")
        if self.form not in COCOR_FORMS:
            raise ValueError(f"plugin.cocor.form must be one of {COCOR_FORMS}, not {self.form!r}")
        self.mode = pcfg.get("target", "learned")
        if self.mode not in ("learned", "fixed"):
            raise ValueError(f"plugin.cocor.target must be learned or fixed, not {self.mode!r}")
        kind = cfg["method"]["kind"]
        fixed = pcfg.get("fixed_targets")
        table = dict(zip(self.lengths, fixed)) if fixed else TABLE9.get(kind, TABLE9["moco"])
        missing = [n for n in self.lengths if n not in table]
        if missing:
            raise ValueError(
                f"plugin.cocor.fixed_targets: no target for composite lengths {missing} "
                "(Table 9 covers 1, 2, 3; give one value per composite view)"
            )
        self.constants = {n: float(table[n]) for n in self.lengths}
        self.sign = {"derived": -1.0, "paper": 1.0}[pcfg.get("hypergradient", "derived")]
        self.min_denominator = float(pcfg.get("min_denominator", 1e-4))
        self.target_lr, self.classifier_lr = float(pcfg.get("target_lr", 0.05)), float(pcfg.get("classifier_lr", 0.4))
        # None: the code's step size. N: the step scaled so that the run's updates add up to the learning rate N
        # updates of the code's schedule would (its IN-100 run: 200 epochs of ~500 steps, ~98,500 after the freeze);
        # at a CPU budget of a few hundred updates the code's step leaves the targets where they start
        match = pcfg.get("target_lr_match")
        if match is not None and (isinstance(match, bool) or not isinstance(match, int) or match < 1):
            raise ValueError(f"plugin.cocor.target_lr_match={match}: expected an integer >= 1 (or null)")
        self.lr_match: int | None = match
        self.epochs = int(cfg.get("train", {}).get("epochs", 1))
        self.freeze_epochs = int(pcfg.get("target_freeze_epochs", 3))
        self.warmup_epochs = int(pcfg.get("target_warmup_epochs", 2))
        self.schedule(1)  # until the loop tells it the run's steps per epoch
        self.fraction = float(pcfg.get("labelled_fraction", 0.01))
        self.labelled_batch = int(pcfg.get("labelled_batch", 64))
        data = cfg.get("data", {})
        self.task, self.targets = data.get("task", "classification"), data.get("targets")
        self.data_root, self.seed, self.aug = data.get("train"), int(cfg.get("seed", 0)), aug
        if self.mode == "learned":
            self.target = MonotoneTarget(self.n_ops, int(pcfg.get("hidden", 64)), seed=self.seed)
            self.target.fit_constants(self.constants, self.n_ops, seed=self.seed)  # the same on every rank
        self._labelled: Labelled | None = None  # loaded on first use
        self._pending: dict | None = None
        self.updates = 0
        self.skipped = 0  # bi-level steps skipped for a non-finite outer loss

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
        from pipeline.data.manifest import read_manifest

        manifest, _ = read_manifest(self.data_root)
        names = manifest.get("class_names") or []
        if not names:
            raise ValueError("plugin cocor (learned targets) on classification data needs class_names in the manifest")
        return len(names)

    # -- checkpointed optimiser state and progress -------------------------------------------------------------
    def get_extra_state(self):
        if self.mode != "learned":
            return {"updates": self.updates}
        return {
            "updates": self.updates,
            "target_opt": self.target_opt.state_dict(),
            "classifier_opt": self.classifier_opt.state_dict(),
        }

    def set_extra_state(self, state) -> None:
        self.updates = int(state.get("updates", 0))
        if self.mode == "learned" and "target_opt" in state:
            self.target_opt.load_state_dict(state["target_opt"])
            self.classifier_opt.load_state_dict(state["classifier_opt"])

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
            x, y = self._labelled_batch()
            self._pending = {
                "x": x,
                "y": y,
                "s": torch.stack([s.detach().mean() for s in sims]),
                "targets": targets,
                "ce": self._outer_loss(method, x, y).detach(),
            }
        return out

    # -- the upper-level step -----------------------------------------------------------------------------------
    def _labelled_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._labelled is None:
            self._load_labelled()
        assert self._labelled is not None  # set by _load_labelled
        split, pre, gen = self._labelled
        idx = torch.randperm(len(split.encoded), generator=gen)[: self.labelled_batch].numpy()
        x, kept = pre([split.encoded[i] for i in idx])
        y = torch.as_tensor(split.y[idx[kept]])
        if self.task == "regression":
            y = (y - self._y_mean) / self._y_std
        return x, y

    def _load_labelled(self) -> None:
        from functools import partial

        from pipeline.augment.torch_exec import eval_transform
        from pipeline.augment.view_maker import eval_settings
        from pipeline.data.labelled import labelled_subset

        split = labelled_subset(self.data_root, self.task, self.targets, self.fraction, self.seed)
        if self.task == "regression":
            y = torch.as_tensor(split.y)
            self._y_mean, self._y_std = y.mean(0), y.std(0).clamp_min(1e-6)
        gen = torch.Generator().manual_seed(self.seed * 7919 + dist.rank() + 11)  # ranks draw different batches
        size, mean, std = eval_settings(self.aug)  # the kNN monitor's and the probe's un-augmented view
        self._labelled = (split, partial(eval_transform, size=size, mean=mean, std=std), gen)
        print(
            f"[cocor] labelled subset: {len(split.encoded)} samples ({self.fraction:.1%} of {self.data_root})",
            flush=True,
        )

    def _outer_loss(self, method, x, y) -> torch.Tensor:
        """The labelled loss of the linear head on frozen backbone features (eval-mode BN: no statistics drift)."""
        backbone = method.backbone
        was = backbone.training
        backbone.eval()
        with torch.no_grad():
            h = backbone(x.to(next(backbone.parameters()).device)).float()
        backbone.train(was)
        # unit-length features: the head's step size (the code's lr 0.4) then does not depend on the backbone's
        # feature scale, which at CPU scale made an MSE head diverge
        pred = self.classifier(F.normalize(h, dim=1))
        y = y.to(pred.device)
        return F.cross_entropy(pred, y) if self.task == "classification" else F.mse_loss(pred, y)

    def _target_lr(self) -> float:
        """Zero for the first epochs, then the encoder's own schedule (warm-up, cosine): the code's MMNN schedule."""
        if self.updates < self.freeze_steps:
            return 0.0
        return warmup_cosine(
            self.updates - self.freeze_steps,
            self.total_steps - self.freeze_steps,
            self.warmup_steps,
            self.target_lr * self.lr_scale,
        )

    def after_update(self, method, images, params, out, progress):
        if self.mode != "learned" or self._pending is None:
            return {}
        pending, self._pending = self._pending, None
        # L_u and s at θe': the same views, no gradient, and every buffer put back (queue, BN statistics)
        buffers = {name: b.clone() for name, b in method.named_buffers()}
        with torch.no_grad():
            after = method.framework_loss(images, params)
            sims = self._similarities(method.embed, method.embed_target, images)  # the bi-level part: θe' itself
            lu_after = after["loss"] + self.weight * cocor_consistency(sims, pending["targets"], self.form)
        for name, b in method.named_buffers():
            b.copy_(buffers[name])
        s_after = torch.stack([s.mean() for s in sims]).float()
        lu_before = float(out["loss"].detach())
        ce_after = self._outer_loss(method, pending["x"], pending["y"])
        g_bar = torch.stack([self.target(params[i]["counts"].to(s_after.device)).mean() for i in self.composites])
        surrogate = cocor_target_surrogate(
            g_bar.float(),
            pending["s"].float(),
            s_after,
            float(pending["ce"]),
            float(ce_after.detach()),
            lu_before,
            float(lu_after),
            min_denominator=self.min_denominator,
            sign=self.sign,
        )
        self.target_opt.zero_grad(set_to_none=True)
        self.classifier_opt.zero_grad(set_to_none=True)
        (surrogate + ce_after).backward()
        _average_grads([*self.target.parameters(), *self.classifier.parameters()])
        self.updates += 1
        # a non-finite outer loss on any rank (averaged in) must not reach the target network: skip the step
        grads = [p.grad for p in [*self.target.parameters(), *self.classifier.parameters()] if p.grad is not None]
        if not all(torch.isfinite(g).all() for g in grads):
            self.skipped += 1
            return {"cocor_skipped_updates": float(self.skipped)}
        lr = self._target_lr()
        for g in self.target_opt.param_groups:
            g["lr"] = lr
        for g in self.classifier_opt.param_groups:
            g["lr"] = cosine(progress, self.classifier_lr, 0.0)
        if lr > 0:  # frozen: not even momentum moves it
            self.target_opt.step()
        self.classifier_opt.step()
        with torch.no_grad():  # how far this step moved the batch's mean targets (the hypergradient's reach)
            g_new = torch.stack([self.target(params[i]["counts"].to(s_after.device)).mean() for i in self.composites])
        ce_after = float(ce_after.detach())
        return {
            "cocor_outer_loss": ce_after,
            "cocor_outer_gain": float(pending["ce"]) - ce_after,
            "cocor_target_lr": lr,
            "cocor_skipped_updates": float(self.skipped),
            # the finite differences Eq. 20 multiplies: the unsupervised loss's and the similarities' per-step changes
            "cocor_lu_change": float(lu_after) - lu_before,
            "cocor_sim_change": float((s_after - pending["s"].float()).abs().mean()),
            "cocor_target_step": float((g_new - g_bar.detach().float()).abs().mean()),
        }


def _average_grads(params: list[torch.Tensor]) -> None:
    if not dist.is_dist():
        return
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    dist.average_(cast(list[torch.Tensor], [p.grad for p in params]))  # none is None: set above
