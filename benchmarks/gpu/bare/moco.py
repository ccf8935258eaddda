"""MoCo v2 by hand (with CO2's and CLSA's terms) and MoCo v2 + CoCor with its learned target."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .common import Bare, bare_mlp, bare_sgd, frozen_copy


class BareMoCo(Bare):
    """MoCo v2: query encoder, momentum key encoder on a permuted batch, InfoNCE against the queue; CO2's and CLSA's
    terms when the row has them."""

    def __init__(self, cfg, device, precision, fmt):
        super().__init__(cfg, device, precision, fmt)
        m, head = cfg["method"], cfg["method"]["head"]
        self.t, self.m = float(m["temperature"]), float(m["momentum"])
        self.online = nn.Sequential(
            self.backbone, bare_mlp(self.dim, self.hidden, self.out_dim, int(head["num_layers"]), bool(head["bn"]))
        )
        self.key = frozen_copy(self.online)
        self.place(self.online, self.key)
        self.online_p, self.key_p = list(self.online.parameters()), list(self.key.parameters())
        self.queue = F.normalize(torch.randn(int(m["queue_size"]), self.out_dim, device=device), dim=1)
        self.ptr = 0
        plugins = cfg.get("plugin") or {}
        self.co2 = (0.3, 0.05) if "co2" in plugins else None  # docs/methods/co2.md §1.6 MoCo v2 constants
        self.clsa = float(plugins["clsa"]["beta"]) if "clsa" in plugins else None
        self.opt = bare_sgd([self.online], self.lr, self.momentum, self.wd, device)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.online(x).float(), dim=1)

    @torch.no_grad()
    def keys(self, x: torch.Tensor) -> torch.Tensor:
        perm = torch.randperm(x.shape[0], device=x.device)
        k = F.normalize(self.key(x[perm]).float(), dim=1)
        out = torch.empty_like(k)
        out[perm] = k
        return out

    def info_nce(self, q, k, queue, t):
        logits = torch.cat([(q * k).sum(1, keepdim=True), q @ queue.t()], 1) / t
        return F.cross_entropy(logits, torch.zeros(q.shape[0], dtype=torch.long, device=q.device))

    def loss(self, images, params):
        q, k = self.embed(images[0]), self.keys(images[1])
        loss = self.info_nce(q, k, self.queue, self.t)
        if self.co2:
            alpha, tc = self.co2
            log_q = F.log_softmax(q @ self.queue.t() / tc, 1)
            log_p = F.log_softmax(k @ self.queue.t() / tc, 1)
            kl = 0.5 * (log_p.exp() * (log_p - log_q)).sum(1) + 0.5 * (log_q.exp() * (log_q - log_p)).sum(1)
            loss = loss + alpha * kl.mean()
        if self.clsa is not None:

            def logits(z):
                return torch.cat([(z * k).sum(1, keepdim=True), z @ self.queue.t()], 1) / self.t

            target = F.softmax(logits(q.detach()), 1)
            ddm = sum(-(target * F.log_softmax(logits(self.embed(x)), 1)).sum(1).mean() for x in images[2:])
            loss = loss + self.clsa * ddm
        self._k = k
        return loss

    @torch.no_grad()
    def after(self, images, params, loss):
        torch._foreach_lerp_(self.key_p, self.online_p, 1 - self.m)
        n = self._k.shape[0]
        self.queue[self.ptr : self.ptr + n] = self._k
        self.ptr = (self.ptr + n) % self.queue.shape[0]


class BareCoCor(BareMoCo):
    """MoCo v2 + CoCor with its learned target: consistency of three composite views with a monotone target network's
    output, a linear head's labelled loss before and after the encoder step, a side-effect-free second forward at
    the new weights (buffers saved and restored with _foreach_copy_), and the target network's step along the
    finite-difference hypergradient; no host syncs."""

    def __init__(self, cfg, device, precision, fmt, n_classes: int, labelled_batch: int):
        super().__init__(cfg, device, precision, fmt)
        pc = cfg["plugin"]["cocor"]
        self.weight, self.hid = float(pc["weight"]), int(pc["hidden"])
        dims = [14, self.hid, self.hid, 1]
        self.raw = nn.ParameterList(nn.Parameter(0.5 * torch.randn(i, o) - 4.0) for i, o in zip(dims, dims[1:]))
        self.bias = nn.ParameterList(nn.Parameter(torch.zeros(o)) for o in dims[1:])
        self.head = nn.Linear(self.dim, n_classes)
        self.mmnn = nn.ModuleList([self.raw, self.bias])
        self.place(self.mmnn, self.head)
        kernel = {"fused": True} if device.type == "cuda" else {"foreach": True}
        self.target_opt = torch.optim.SGD(self.mmnn.parameters(), lr=float(pc["target_lr"]), momentum=0.9, **kernel)
        self.head_opt = torch.optim.SGD(
            self.head.parameters(), lr=float(pc["classifier_lr"]), momentum=0.9, weight_decay=1e-4, **kernel
        )
        self.freeze = int(pc["target_freeze_epochs"])  # steps per epoch = 1 in this benchmark's configs
        g = torch.Generator().manual_seed(1)
        size = int(cfg["data"]["image_size"])
        self.x_lab = torch.randn(labelled_batch, 3, size, size, generator=g).to(device).contiguous(memory_format=fmt)
        self.y_lab = torch.randint(0, n_classes, (labelled_batch,), generator=g).to(device)
        self.buffers = [b for mod in (self.online, self.key) for b in mod.buffers()] + [self.queue]
        self.saved = [torch.empty_like(b) for b in self.buffers]

    def target(self, counts: torch.Tensor) -> torch.Tensor:
        h = counts.float()
        for i, (w, b) in enumerate(zip(self.raw, self.bias)):
            h = h @ F.softplus(w) + b
            h = F.relu(h) if i < len(self.raw) - 1 else h
        return 1.0 - F.softplus(h.squeeze(-1))

    def similarities(self, images):
        with torch.no_grad():
            anchor = F.normalize(self.embed(images[0]) + self.embed(images[1]), dim=1)
        return [(self.embed(x) * anchor).sum(1) for x in images[2:]]

    def outer(self, grad_head: bool) -> torch.Tensor:
        self.backbone.eval()
        with torch.no_grad():
            h = self.backbone(self.x_lab).float()
        self.backbone.train()
        with torch.set_grad_enabled(grad_head):
            return F.cross_entropy(self.head(F.normalize(h, dim=1)), self.y_lab)

    @staticmethod
    def consistency(sims, targets):
        return sum(F.softplus(g.mean() - s.mean()) for s, g in zip(sims, targets))

    def loss(self, images, params):
        loss = super().loss(images, params)
        sims = self.similarities(images)
        with torch.no_grad():
            self._g = [self.target(p["counts"]) for p in params[2:]]
        self._s = torch.stack([s.detach().mean() for s in sims]).float()
        self._ce = self.outer(grad_head=False)
        return loss + self.weight * self.consistency(sims, self._g)

    def after(self, images, params, loss):
        super().after(images, params, loss)
        torch._foreach_copy_(self.saved, self.buffers)
        with torch.no_grad():  # L_u and s at the new weights; every buffer put back after
            lu = self.info_nce(self.embed(images[0]), self.keys(images[1]), self.queue, self.t)
            sims = self.similarities(images)
            lu_after = lu + self.weight * self.consistency(sims, self._g)
        torch._foreach_copy_(self.buffers, self.saved)
        s_after = torch.stack([s.mean() for s in sims]).float()
        ce_after = self.outer(grad_head=True)
        g_bar = torch.stack([self.target(p["counts"]).mean() for p in params[2:]]).float()
        denom = lu_after.detach() - loss.detach()
        denom = torch.where(denom.abs() < 1e-4, torch.where(denom >= 0, 1e-4, -1e-4), denom)
        ratio = (ce_after.detach() - self._ce) / denom
        k = (s_after - g_bar).detach()
        coef = (-torch.sigmoid(k) * (1 - torch.sigmoid(k)) * ratio * (s_after - self._s)).detach()
        self.target_opt.zero_grad(set_to_none=True)
        self.head_opt.zero_grad(set_to_none=True)
        ((coef * g_bar).sum() + ce_after).backward()
        grads = [p.grad for p in [*self.mmnn.parameters(), *self.head.parameters()]]
        finite = torch.isfinite(torch.stack(torch._foreach_norm(grads))).all()
        for g in grads:  # a non-finite outer loss moves nothing (no host sync to skip the step)
            g.copy_(torch.where(finite, g, 0.0))
        if self.steps >= self.freeze:  # the project's target lr is 0 for its first updates
            self.target_opt.step()
        self.head_opt.step()
