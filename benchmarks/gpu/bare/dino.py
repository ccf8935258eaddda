"""DINO on a ViT by hand."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .common import Bare, BareViT, bare_adamw, frozen_copy, half_cosine


class BareDINO(Bare):
    """DINO on a ViT: 3-layer GELU head, normalised bottleneck, weight-normalised prototypes; the teacher (EMA,
    cosine 0.996 -> 1) on the two global crops, the student on every crop (one forward per crop size); centring,
    teacher temperature warm-up, per-tensor gradient clipping, the prototypes frozen in the first epoch, AdamW
    with the weight decay on a cosine."""

    def __init__(self, cfg, device, precision, fmt, total_steps: int):
        super().__init__(cfg, device, precision, fmt)
        m, head, o = cfg["method"], cfg["method"]["head"], cfg["optim"]
        hidden, bott, k = int(head["hidden_dim"]), int(head["bottleneck_dim"]), int(head["out_dim"])
        self.mlp = nn.Sequential(
            nn.Linear(self.dim, hidden), nn.GELU(), nn.Linear(hidden, hidden), nn.GELU(), nn.Linear(hidden, bott)
        )
        self.prototypes = nn.Linear(bott, k, bias=False)
        self.student = nn.ModuleDict({"backbone": self.backbone, "mlp": self.mlp, "prototypes": self.prototypes})
        self.teacher = frozen_copy(self.student)
        if isinstance(self.backbone, BareViT):
            self.teacher["backbone"].drop = [0.0] * len(self.backbone.drop)  # the teacher drops no path
        self.place(self.student, self.teacher)
        self.center = torch.zeros(1, k, device=device)
        self.s_p, self.t_p = list(self.student.parameters()), list(self.teacher.parameters())
        self.total, self.epochs = total_steps, int(cfg["train"]["epochs"])
        self.base_m, self.clip = float(m["momentum"]), float(m["clip_grad"])
        self.temps = (float(m["warmup_teacher_temperature"]), float(m["teacher_temperature"]))
        self.warm = min(1.0, float(m["warmup_teacher_epochs"]) / self.epochs)
        self.freeze = float(m["freeze_last_layer_epochs"]) / self.epochs
        self.wd_range = (float(o["weight_decay"]), float(o["weight_decay_end"]))
        self.opt = bare_adamw([self.student], self.lr, o["betas"], self.wd, device)

    @staticmethod
    def head(net, h):
        z = F.normalize(net["mlp"](h), dim=1)
        return F.linear(z, F.normalize(net["prototypes"].weight, dim=1))

    def loss(self, images, params):
        progress = self.steps / self.total
        self.opt.param_groups[0]["weight_decay"] = half_cosine(progress, *self.wd_range)
        tt = (
            self.temps[1]
            if progress >= self.warm
            else self.temps[0] + (self.temps[1] - self.temps[0]) * progress / self.warm
        )
        outs, i = [], 0
        while i < len(images):
            j = i + 1
            while j < len(images) and images[j].shape[-1] == images[i].shape[-1]:
                j += 1
            outs += self.head(self.student, self.student["backbone"](torch.cat(images[i:j]))).float().chunk(j - i)
            i = j
        with torch.no_grad():
            t = self.head(self.teacher, self.teacher["backbone"](torch.cat(images[:2]))).float()
            targets = F.softmax((t - self.center) / tt, 1).chunk(2)
        logs = [F.log_softmax(o / 0.1, 1) for o in outs]
        terms = [-(p * logs[v]).sum(1).mean() for g, p in enumerate(targets) for v in range(len(logs)) if v != g]
        self.center.mul_(0.9).add_(t.mean(0, keepdim=True), alpha=0.1)
        return sum(terms) / len(terms)

    @torch.no_grad()
    def before_step(self):
        if (self.steps + 1) / self.total <= self.freeze + 1e-9:
            self.prototypes.weight.grad = None
        grads = [p.grad for p in self.s_p if p.grad is not None]
        norms = torch.stack(torch._foreach_norm(grads))
        torch._foreach_mul_(grads, list((self.clip / (norms + 1e-6)).clamp(max=1.0).unbind(0)))

    @torch.no_grad()
    def after(self, images, params, loss):
        m = half_cosine(self.steps / self.total, self.base_m, 1.0)
        torch._foreach_lerp_(self.t_p, self.s_p, 1 - m)
