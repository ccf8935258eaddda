"""SimCLR by hand, and InvCLR's colour distortion in the step and its gradient penalty."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .common import Bare, bare_mlp, bare_sgd


class BareSimCLR(Bare):
    """SimCLR: one forward over both views, NT-Xent in float32; with InvCLR, the colour distortion of both views in
    the step (view 0 differentiable in its alpha) and the gradient penalty on view 0's features (double backward)."""

    def __init__(self, cfg, device, precision, fmt):
        super().__init__(cfg, device, precision, fmt)
        head = cfg["method"]["head"]
        self.t = float(cfg["method"]["temperature"])
        self.head = bare_mlp(self.dim, self.hidden, self.out_dim, int(head["num_layers"]), bool(head["bn"]))
        self.place(self.backbone, self.head)
        self.opt = bare_sgd([self.backbone, self.head], self.lr, self.momentum, self.wd, device)
        inv = (cfg.get("plugin") or {}).get("invclr")
        self.invclr = inv
        if inv:
            aug = cfg["augment"]
            self.mean = torch.tensor(aug["mean"], device=device).view(1, 3, 1, 1)
            self.std = torch.tensor(aug["std"], device=device).view(1, 3, 1, 1)
            b, c, s, h = aug["jitter"]
            self.lo = torch.tensor([1 - b, 1 - c, 1 - s, -h], device=device)
            self.hi = torch.tensor([1 + b, 1 + c, 1 + s, h], device=device)
            self.gen = torch.Generator(device=device).manual_seed(0)
            self.luma = torch.tensor([0.299, 0.587, 0.114], device=device).view(1, 3, 1, 1)
            self.yiq = torch.tensor(
                [[0.299, 0.587, 0.114], [0.5959, -0.2746, -0.3213], [0.2115, -0.5227, 0.3112]], device=device
            )
            self.rgb = torch.tensor([[1.0, 0.956, 0.619], [1.0, -0.272, -0.647], [1.0, -1.106, 1.703]], device=device)

    def gray(self, x):
        return (x * self.luma).sum(1, keepdim=True)

    def colour(self, x, p, alpha):
        """Brightness, contrast, saturation, YIQ hue (clipped after each), gated by jitter_on; grayscale; normalise."""
        b, c, s, h = (a.view(-1, 1, 1, 1) for a in alpha.unbind(1))
        y = (x * b).clamp(0, 1)
        y = (c * y + (1 - c) * self.gray(y).mean((2, 3), keepdim=True)).clamp(0, 1)
        y = (s * y + (1 - s) * self.gray(y)).clamp(0, 1)
        theta = 2 * math.pi * h.view(-1)
        cos, sin, one, zero = theta.cos(), theta.sin(), torch.ones_like(theta), torch.zeros_like(theta)
        rot = torch.stack([one, zero, zero, zero, cos, -sin, zero, sin, cos], 1).view(-1, 3, 3)
        y = torch.einsum("bij,bjhw->bihw", self.rgb @ rot @ self.yiq, y).clamp(0, 1)
        y = torch.where(p["jitter_on"].bool().view(-1, 1, 1, 1), y, x)
        y = torch.where(p["gray"].bool().view(-1, 1, 1, 1), self.gray(y).expand_as(y), y)
        return (y - self.mean) / self.std

    def loss(self, images, params):
        x1, x2 = images[0], images[1]
        alpha = None
        if self.invclr:
            with torch.autocast(self.device.type, enabled=False):
                alphas = [
                    torch.stack([p[k].float() for k in ("brightness", "contrast", "saturation", "hue")], 1)
                    for p in params[:2]
                ]
                alpha = alphas[0].clone().requires_grad_(True)
                x1 = self.colour(x1, params[0], alpha).contiguous(memory_format=self.fmt)
                x2 = self.colour(x2, params[1], alphas[1]).contiguous(memory_format=self.fmt)
        b = x1.shape[0]
        h = self.backbone(torch.cat([x1, x2]))
        z = F.normalize(self.head(h).float(), dim=1)
        logits = (z @ z.t() / self.t).masked_fill(torch.eye(2 * b, dtype=torch.bool, device=z.device), float("-inf"))
        target = torch.cat([torch.arange(b, 2 * b), torch.arange(b)]).to(z.device)
        loss = F.cross_entropy(logits, target)
        if self.invclr:
            inv = self.invclr
            feats = h[:b].float()
            e = torch.randint(0, 2, feats.shape, device=feats.device, generator=self.gen).float() * 2 - 1
            (grad,) = torch.autograd.grad((e * F.normalize(feats, dim=1)).sum(), alpha, create_graph=True)
            u = torch.rand(b, int(inv["n_samples"]), 4, device=feats.device, generator=self.gen)
            prime = self.lo + u * (self.hi - self.lo)
            penalty = ((prime - alpha.unsqueeze(1)) * grad.unsqueeze(1)).sum(-1).pow(2).mean()
            loss = loss + float(inv["lam"]) * penalty.clamp(max=float(inv["clip"]))
        return loss
