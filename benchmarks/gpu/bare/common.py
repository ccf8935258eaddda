"""What the bare loops share: torchvision's ResNet and ViT as backbones, MLP heads, SGD and AdamW in their fused
kernels, the cosine schedule, frozen copies, and `Bare`, the step every loop takes."""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from torch import nn


def bare_backbone(arch: str, width: int) -> tuple[nn.Module, int]:
    """torchvision's ResNet with `fc = Identity`; base width other than 64 by rebuilding its stages."""
    import torchvision
    from torchvision.models import resnet

    block, layers = {
        "resnet18": (resnet.BasicBlock, [2, 2, 2, 2]),
        "resnet34": (resnet.BasicBlock, [3, 4, 6, 3]),
        "resnet50": (resnet.Bottleneck, [3, 4, 6, 3]),
    }[arch]
    net = getattr(torchvision.models, arch)()
    if width != 64:
        net.inplanes = width
        net.conv1 = nn.Conv2d(3, width, kernel_size=7, stride=2, padding=3, bias=False)
        net.bn1 = nn.BatchNorm2d(width)
        for i, n in enumerate(layers):
            setattr(net, f"layer{i + 1}", net._make_layer(block, width * 2**i, n, stride=1 if i == 0 else 2))
    dim = width * 8 * block.expansion
    net.fc = nn.Identity()
    return net, dim


def bare_mlp(in_dim: int, hidden: int, out: int, layers: int, bn: bool, last_bn: bool = False) -> nn.Sequential:
    """(Linear(-BN)-ReLU) x (layers - 1), Linear; `last_bn`: no bias on the output Linear and a no-affine BN after it
    (SimSiam's and MoCo v3's projectors)."""
    mods: list[nn.Module] = []
    d = in_dim
    for _ in range(layers - 1):
        mods += [nn.Linear(d, hidden, bias=not bn)] + ([nn.BatchNorm1d(hidden)] if bn else []) + [nn.ReLU(True)]
        d = hidden
    mods.append(nn.Linear(d, out, bias=not last_bn))
    return nn.Sequential(*mods, *([nn.BatchNorm1d(out, affine=False)] if last_bn else []))


def bare_sgd(
    modules: list[nn.Module], lr: float, momentum: float, wd: float, device: torch.device, decay_all: bool = False
) -> torch.optim.SGD:
    params = [p for m in modules for p in m.parameters() if p.requires_grad]
    kernel = {"fused": True} if device.type == "cuda" else {"foreach": True}
    groups = [
        {"params": [p for p in params if p.ndim > 1 or decay_all], "weight_decay": wd},
        {"params": [p for p in params if p.ndim <= 1 and not decay_all], "weight_decay": 0.0},
    ]
    return torch.optim.SGD([g for g in groups if g["params"]], lr=lr, momentum=momentum, **kernel)


VIT_SPECS = {"vit_tiny": (4, 4, 3, 192, 768), "vit_s16": (16, 12, 6, 384, 1536), "vit_b16": (16, 12, 12, 768, 3072)}


class BareViT(nn.Module):
    """torchvision's VisionTransformer returning the class token, for any crop size (position embedding resized
    bicubically to the crop's patch grid)."""

    def __init__(self, arch: str, size: int, num_heads: int | None = None, drop_path: float = 0.0):
        from torchvision.models.vision_transformer import VisionTransformer

        super().__init__()
        p, layers, heads, dim, mlp = VIT_SPECS[arch]
        heads = num_heads or heads
        self.vit = VisionTransformer(max(p, -(-size // p) * p), p, layers, heads, dim, mlp)
        self.vit.heads = nn.Identity()
        self.grid = self.vit.image_size // p
        self.drop = [drop_path * i / max(1, layers - 1) for i in range(layers)]  # DINO's stochastic depth

    def blocks(self, x):
        if not any(self.drop):
            return self.vit.encoder.layers(x)
        from torchvision.ops import stochastic_depth

        for blk, p in zip(self.vit.encoder.layers, self.drop):
            h = blk.ln_1(x)
            x = x + stochastic_depth(
                blk.dropout(blk.self_attention(h, h, h, need_weights=False)[0]), p, "row", self.training
            )
            x = x + stochastic_depth(blk.mlp(blk.ln_2(x)), p, "row", self.training)
        return x

    def forward(self, x):
        v = self.vit
        t = v.conv_proj(x)
        gh, gw = t.shape[-2:]
        t = torch.cat([v.class_token.expand(x.shape[0], -1, -1), t.flatten(2).transpose(1, 2)], 1)
        pos = v.encoder.pos_embedding
        if (gh, gw) != (self.grid, self.grid):
            g = pos[:, 1:].reshape(1, self.grid, self.grid, -1).permute(0, 3, 1, 2).float()
            g = F.interpolate(g, size=(gh, gw), mode="bicubic", align_corners=False).to(pos.dtype)
            pos = torch.cat([pos[:, :1], g.flatten(2).transpose(1, 2)], 1)
        return v.encoder.ln(self.blocks(t + pos))[:, 0]


def bare_vit(arch: str, size: int, num_heads: int | None = None, drop_path: float = 0.0) -> tuple[nn.Module, int]:
    return BareViT(arch, size, num_heads, drop_path), VIT_SPECS[arch][3]


def bare_adamw(
    modules: list[nn.Module], lr: float, betas, wd: float, device: torch.device, decay_all: bool = False
) -> torch.optim.AdamW:
    params = [p for m in modules for p in m.parameters() if p.requires_grad]
    kernel = {"fused": True} if device.type == "cuda" else {"foreach": True}
    return torch.optim.AdamW(
        [
            {"params": [p for p in params if p.ndim > 1], "weight_decay": wd},
            {"params": [p for p in params if p.ndim <= 1], "weight_decay": wd if decay_all else 0.0},
        ],
        lr=lr,
        betas=tuple(betas),
        **kernel,
    )


def half_cosine(progress: float, start: float, end: float) -> float:
    return end + (start - end) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def frozen_copy(module: nn.Module) -> nn.Module:
    twin = copy.deepcopy(module)
    for p in twin.parameters():
        p.requires_grad_(False)
    return twin


class Bare:
    """autocast(loss) -> zero_grad -> backward -> fused SGD step -> after (EMA, queue, plug-in updates)."""

    def __init__(self, cfg: dict, device: torch.device, precision: str, fmt: torch.memory_format):
        torch.manual_seed(0)
        self.cfg, self.device, self.fmt = cfg, device, fmt
        self.bf16 = precision == "bf16"
        m, model = cfg["method"], cfg["model"]
        self.backbone, self.dim = (
            bare_vit(
                model["backbone"], int(model["image_size"]), model.get("num_heads"), float(model.get("drop_path") or 0)
            )
            if model["backbone"].startswith("vit")
            else bare_backbone(model["backbone"], int(model["width"]))
        )
        head = m["head"]
        self.hidden, self.out_dim = int(head.get("hidden_dim") or self.dim), int(head["out_dim"])
        o, b = cfg["optim"], int(cfg["train"]["batch_size"])
        self.lr, self.momentum, self.wd = float(o["base_lr"]) * b / 256, float(o["momentum"]), float(o["weight_decay"])
        self.steps = 0

    def autocast(self, enabled: bool = True):
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16 and enabled)

    def place(self, *modules: nn.Module) -> None:
        for mod in modules:
            mod.to(self.device, memory_format=self.fmt)

    def __call__(self, images, params) -> None:
        with self.autocast():
            loss = self.loss(images, params)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.before_step()
        self.opt.step()
        self.steps += 1
        with self.autocast():
            self.after(images, params, loss)

    def loss(self, images, params) -> torch.Tensor:
        raise NotImplementedError

    def before_step(self) -> None:
        pass

    def after(self, images, params, loss) -> None:
        pass
