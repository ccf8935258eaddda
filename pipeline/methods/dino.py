"""DINO (Caron et al. 2021, "Emerging Properties in Self-Supervised Vision Transformers")."""

from __future__ import annotations

from typing import cast

import torch

from pipeline import dist
from pipeline.fields import Bool, Num
from pipeline.losses.dino import dino_loss
from pipeline.methods.base import Encoder, Method, unwrap
from pipeline.methods.context import StepContext
from pipeline.methods.settings import Head, MethodRun, MomentumSettings
from pipeline.models.backbones import ViT, build_backbone
from pipeline.models.heads import DINOHead
from pipeline.models.momentum import ema_update, momentum_copy
from pipeline.schedules import Momentum


class DINO(Method):
    """Student: backbone + DINO head (`online`, the module DDP wraps); teacher: an EMA copy, fed the two global
    crops only, while the student sees every crop (augment=dino: 2 global + N local; crops of one size go through
    the backbone together, as the paper's multi-crop wrapper).

    Loss (Eq. 3, Alg. 1): the teacher's centred, sharpened distribution of each global crop is the target of the
    student's distribution of every other crop. Teacher temperature: per epoch, as the authors' code (main_dino.py:
    `linspace(0.04, 0.07, W)` for the first W epochs, then 0.07); student's 0.1. The centre is an EMA (0.9) of the
    teacher's batch mean over every worker. The teacher's momentum follows a cosine from 0.996 to 1, the update
    after iteration `it` taking the schedule's value at `it` (0.996 first). Before each optimiser step the last
    layer's gradients are dropped during the first epoch and each parameter's gradient norm is clipped to 3.0 (the
    paper's code). The teacher never drops paths (model.drop_path is the student's)."""

    kind = "dino"

    provides = frozenset({"features"})
    center: torch.Tensor  # a buffer, registered in __init__

    class Settings(MomentumSettings):
        head: Head  # required: the projection head it trains
        student_temperature: Num(gt=0)
        teacher_temperature: Num(gt=0)
        warmup_teacher_temperature: Num(gt=0)
        warmup_teacher_epochs: Num(ge=0)
        center_momentum: Num(ge=0, lt=1)
        freeze_last_layer_epochs: Num(ge=0)
        clip_grad: Num(gt=0, null=True) = None  # per-parameter gradient norm clip; null: off
        momentum_cosine: Bool() = True  # the teacher's momentum rises to 1 along a cosine (the authors')

    def __init__(self, s: Settings, run: MethodRun):
        super().__init__()
        head = s.head
        backbone = build_backbone(run.model)
        self.online = Encoder(
            backbone,
            DINOHead(
                backbone.feat_dim,
                int(head.out_dim),
                int(head.hidden_dim or 2048),
                int(head.bottleneck_dim),
                int(head.num_layers or 3),
            ),
        )
        self.teacher = momentum_copy(self.online)
        if isinstance(self.teacher.backbone, ViT):  # the authors' teacher is built without stochastic depth
            self.teacher.backbone.set_drop_path(0.0)
        self.register_buffer("center", torch.zeros(1, int(head.out_dim)))
        self.center_momentum = float(s.center_momentum)
        self.student_temperature = float(s.student_temperature)
        self.teacher_temperatures = (float(s.warmup_teacher_temperature), float(s.teacher_temperature))
        self.epochs = epochs = max(1, int(run.epochs))
        # a warm-up longer than the run is shortened to the run (the CPU runs' few epochs)
        self.teacher_warmup_epochs = min(epochs, int(s.warmup_teacher_epochs))
        self.freeze_last_layer = min(1.0, float(s.freeze_last_layer_epochs) / epochs)  # a fraction of training
        self.clip_grad = None if s.clip_grad is None else float(s.clip_grad)
        self.momentum = Momentum(s.momentum, s.momentum_cosine)
        self.progress = 0.0  # the fraction of training done before the current step

    def teacher_temperature(self) -> float:
        """The epoch's teacher temperature: linspace(start, end, W)[epoch] for the first W epochs, then end."""
        start, end = self.teacher_temperatures
        epoch, w = int(self.progress * self.epochs + 1e-9), self.teacher_warmup_epochs
        if epoch >= w:
            return end
        return start if w == 1 else start + (end - start) * epoch / (w - 1)

    def set_progress(self, progress: float) -> None:
        """Where training stands before the next step (a resumed run's first step takes its temperature here)."""
        self.progress = progress

    def _student(self, images: list[torch.Tensor]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """(features, outputs) per crop: consecutive crops of one size in one forward."""
        feats, outs, i = [], [], 0
        while i < len(images):
            j = i + 1
            while j < len(images) and images[j].shape[-2:] == images[i].shape[-2:]:
                j += 1
            h, z = self.online(torch.cat(images[i:j]), with_features=True)
            feats.extend(h.chunk(j - i))
            outs.extend(z.float().chunk(j - i))
            i = j
        return feats, outs

    @torch.no_grad()
    def _update_center(self, teacher: list[torch.Tensor]) -> None:
        # every worker's batch has the same size (the loop keeps ranks in lockstep): the mean of the workers' means
        # is the global batch mean
        batch_mean = torch.cat(teacher).mean(0, keepdim=True)
        dist.average_([batch_mean])
        self.center.mul_(self.center_momentum).add_(batch_mean, alpha=1 - self.center_momentum)

    def framework_loss(self, images: list[torch.Tensor], params: list[dict] | None = None) -> dict:
        feats, student = self._student(images)
        with torch.no_grad():
            teacher = [t.float() for t in self.teacher(torch.cat(images[:2])).chunk(2)]
        tau_t = self.teacher_temperature()
        loss = dino_loss(student, teacher, self.center, self.student_temperature, tau_t)
        self._update_center(teacher)
        return {
            "loss": loss,
            "teacher_temperature": torch.tensor(tau_t),
            "momentum": torch.tensor(self.momentum.value),
            "ctx": StepContext(features=feats[:2]),
        }

    @torch.no_grad()
    def before_optimizer_step(self, progress: float) -> dict:
        online = unwrap(self.online)
        if progress <= self.freeze_last_layer + 1e-9:  # the first epoch: the prototypes stay as initialised
            for p in cast(DINOHead, online.projector).last_layer.parameters():
                p.grad = None
        grads = [p.grad for p in online.parameters() if p.grad is not None]
        if self.clip_grad is None or not grads:
            return {}
        # each tensor's gradient clipped to norm clip_grad on its own (the paper's code), not the global norm
        norms = torch.stack(torch._foreach_norm(grads))
        scale = (self.clip_grad / (norms + 1e-6)).clamp(max=1.0)
        torch._foreach_mul_(grads, list(scale.unbind(0)))
        return {}

    def update_momentum(self, progress: float) -> None:
        # the authors' update after iteration it uses momentum_schedule[it], the schedule at the progress before it
        ema_update(self.teacher, unwrap(self.online), self.momentum.update(self.progress))
        self.progress = progress
