"""Backbones, selected by `model.backbone`: torchvision ResNets (optionally with the CIFAR stem) returning pooled
features, and torchvision Vision Transformers returning the class token after the final LayerNorm. Each module
carries `feat_dim` for the heads built on top of it."""

from __future__ import annotations

import math
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn
from torchvision.models.resnet import BasicBlock, Bottleneck, ResNet
from torchvision.models.vision_transformer import EncoderBlock, VisionTransformer
from torchvision.ops import stochastic_depth

from pipeline.models.catalogue import BACKBONES, RESNETS, VITS, vit_patch

BLOCKS = {"basic": BasicBlock, "bottleneck": Bottleneck}


class _NarrowResNet(ResNet):
    """torchvision's ResNet with a configurable base width (64 is the standard)."""

    fc: nn.Module  # torchvision's Linear classifier; build_backbone makes it an Identity
    feat_dim: int  # set by build_backbone

    def __init__(self, block, layers, base_width: int):
        super().__init__(block, layers)
        if base_width == 64:
            return
        # Rebuild with a narrower trunk; torchvision hard-codes 64 so we construct the layers again.
        self.inplanes = base_width
        self.conv1 = nn.Conv2d(3, base_width, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(base_width)
        self.layer1 = self._make_layer(block, base_width, layers[0])
        self.layer2 = self._make_layer(block, base_width * 2, layers[1], stride=2)
        self.layer3 = self._make_layer(block, base_width * 4, layers[2], stride=2)
        self.layer4 = self._make_layer(block, base_width * 8, layers[3], stride=2)
        self.fc = nn.Linear(base_width * 8 * block.expansion, cast(nn.Linear, self.fc).out_features)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")


class ViT(VisionTransformer):
    """torchvision's VisionTransformer as a feature extractor: `forward` returns the class token after the final
    LayerNorm (DINO's and MoCo v3's features). Images of another size than `image_size` (DINO's local crops) get
    the position embedding resized bicubically to their patch grid; the grid of `image_size` uses it as trained."""

    def __init__(
        self, image_size: int, patch_size: int, num_layers: int, num_heads: int, hidden_dim: int, mlp_dim: int
    ):
        # the grid is rounded up to whole patches so every size the config allows builds
        image_size = max(patch_size, math.ceil(image_size / patch_size) * patch_size)
        super().__init__(image_size, patch_size, num_layers, num_heads, hidden_dim, mlp_dim)
        self.heads = nn.Identity()
        self.feat_dim = hidden_dim

    def position_embedding(self, grid_h: int, grid_w: int) -> torch.Tensor:
        pos = self.encoder.pos_embedding  # [1, 1 + g*g, D]: the class token's, then the grid's row by row
        g = self.image_size // self.patch_size
        if (grid_h, grid_w) == (g, g):
            return pos
        grid = pos[:, 1:].reshape(1, g, g, -1).permute(0, 3, 1, 2)
        grid = F.interpolate(grid.float(), size=(grid_h, grid_w), mode="bicubic", align_corners=False)
        return torch.cat([pos[:, :1], grid.to(pos.dtype).flatten(2).transpose(1, 2)], dim=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.conv_proj(x)  # [n, D, h/p, w/p]
        gh, gw = tokens.shape[-2:]
        tokens = tokens.flatten(2).transpose(1, 2)
        tokens = torch.cat([self.class_token.expand(x.shape[0], -1, -1), tokens], dim=1)
        tokens = tokens + self.position_embedding(gh, gw)
        enc = self.encoder
        return enc.ln(enc.layers(enc.dropout(tokens)))[:, 0]

    def init_weights(self, scheme: str) -> None:
        """`torchvision` keeps torchvision's init. `mocov3`: the authors' VisionTransformerMoCo (vits.py): Q, K and V
        each Xavier-uniform over (D, D), every other Linear Xavier-uniform, biases 0, the class token N(0, 1e-6), the
        patch projection Xavier-uniform over (3·p·p, D). `dino`: the authors' _init_weights (vision_transformer.py):
        every Linear (Q, K, V included) N(0, 0.02) truncated at ±2, biases 0, LayerNorms 1 and 0, the class token
        and position embedding N(0, 0.02), the patch convolution at nn.Conv2d's default."""
        if scheme == "torchvision":
            return
        if scheme not in ("mocov3", "dino"):
            raise ValueError(f"unknown ViT init {scheme!r}; choose torchvision, mocov3 or dino")
        with torch.no_grad():
            for m in self.encoder.modules():
                if isinstance(m, nn.MultiheadAttention):  # its fused qkv is a parameter, not a Linear
                    d = m.embed_dim
                    if scheme == "mocov3":
                        bound = math.sqrt(6.0 / (d + d))  # the authors' shape[0] // 3 + shape[1]
                        m.in_proj_weight.uniform_(-bound, bound)
                    else:
                        nn.init.trunc_normal_(m.in_proj_weight, std=0.02, a=-2.0, b=2.0)
                    m.in_proj_bias.zero_()
                if isinstance(m, nn.Linear):  # out_proj and the MLPs
                    if scheme == "mocov3":
                        nn.init.xavier_uniform_(m.weight)
                    else:
                        nn.init.trunc_normal_(m.weight, std=0.02, a=-2.0, b=2.0)
                    nn.init.zeros_(m.bias)
                if isinstance(m, nn.LayerNorm):
                    nn.init.ones_(m.weight)
                    nn.init.zeros_(m.bias)
            if scheme == "mocov3":
                nn.init.normal_(self.class_token, std=1e-6)
                self._xavier_patch_projection()
            else:
                nn.init.trunc_normal_(self.class_token, std=0.02, a=-2.0, b=2.0)
                if self.encoder.pos_embedding.requires_grad:  # a learned one (sincos stays as it is)
                    nn.init.trunc_normal_(self.encoder.pos_embedding, std=0.02, a=-2.0, b=2.0)
                self.conv_proj.reset_parameters()

    def set_drop_path(self, rate: float) -> None:
        """Stochastic depth (DINO's `drop_path_rate`): block i of L drops each sample's attention and MLP branches
        with probability rate·i/(L-1) in training, scaling kept ones by 1/(1 - p); 0 turns it off (a teacher)."""
        blocks = list(self.encoder.layers)
        for i, block in enumerate(blocks):
            block.__class__ = DropPathBlock
            cast(DropPathBlock, block).drop_prob = rate * i / max(1, len(blocks) - 1)

    def fix_sincos_position_embedding(self) -> None:
        """MoCo v3's position embedding (Chen et al. 2021, §5): the fixed 2-D sine-cosine one, never trained."""
        g = self.image_size // self.patch_size
        pos = self.encoder.pos_embedding
        with torch.no_grad():
            pos.copy_(sincos_position_embedding(g, pos.shape[-1]).unsqueeze(0).to(pos.dtype))
        pos.requires_grad_(False)

    def freeze_patch_projection(self) -> None:
        """MoCo v3's stability trick (Chen et al. 2021, §5): a random patch projection that is never trained,
        initialised Xavier-uniform over its fan-in and fan-out (3·p·p inputs, D outputs), bias 0."""
        self._xavier_patch_projection(torch.Generator().manual_seed(0))
        self.conv_proj.requires_grad_(False)

    def _xavier_patch_projection(self, generator: torch.Generator | None = None) -> None:
        """The patch projection Xavier-uniform over its fan-in and fan-out (3·p·p inputs, D outputs), bias 0."""
        w = self.conv_proj.weight
        bound = math.sqrt(6.0 / (w.shape[1] * w.shape[2] * w.shape[3] + w.shape[0]))
        with torch.no_grad():
            w.uniform_(-bound, bound, generator=generator)
            self.conv_proj.bias.zero_()


class DropPathBlock(EncoderBlock):
    """torchvision's transformer block with each residual branch dropped per sample (torchvision's
    stochastic_depth in "row" mode: zero, or scaled by 1/(1 - p)) with probability `drop_prob` in training. Same
    parameters and state-dict keys as the block it replaces."""

    drop_prob: float = 0.0

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        p, training = self.drop_prob, self.training
        h = self.ln_1(input)
        x = input + stochastic_depth(
            self.dropout(self.self_attention(h, h, h, need_weights=False)[0]), p, "row", training
        )
        return x + stochastic_depth(self.mlp(self.ln_2(x)), p, "row", training)


def sincos_position_embedding(grid: int, dim: int, temperature: float = 10000.0) -> torch.Tensor:
    """The fixed 2-D sine-cosine position embedding of a grid x grid patch grid, class token first: [1 + grid², dim].

    The patch in row r, column c gets [sin(r·ω), cos(r·ω), sin(c·ω), cos(c·ω)] with ω_k = T^(-k/q), k < q = dim/4
    (each quarter of the dimensions one of the four); the class token's is zeros (MoCo v3)."""
    if dim % 4:
        raise ValueError(f"a 2-D sine-cosine embedding needs a width divisible by 4, not {dim}")
    q = dim // 4
    omega = temperature ** (-torch.arange(q, dtype=torch.float64) / q)
    rows, cols = torch.meshgrid(
        torch.arange(grid, dtype=torch.float64), torch.arange(grid, dtype=torch.float64), indexing="ij"
    )
    r, c = rows.flatten()[:, None] * omega, cols.flatten()[:, None] * omega  # patches row by row, as conv_proj's
    emb = torch.cat([r.sin(), r.cos(), c.sin(), c.cos()], dim=1)
    return torch.cat([torch.zeros(1, dim, dtype=torch.float64), emb]).float()


def patch_size(model: dict) -> int:
    """A ViT's patch size: model.patch_size, or the architecture's."""
    return int(model.get("patch_size") or vit_patch(model["backbone"]))


def build_backbone(model: dict) -> ViT | _NarrowResNet:
    """The backbone `model` (the config's `model` section) names.

    ResNets: `fc = Identity`, so `forward` returns the pooled feature vector; `cifar_stem` swaps the 7x7/2 conv +
    max-pool for a 3x3/1 conv and no pool (32-64 px input); `width` is the base width (64 standard);
    `zero_init_residual` starts each residual block's last BN at scale 0 (torchvision's flag; SimSiam, SimCLR and
    MoCo v3 use it).
    ViTs: `image_size` sizes the position embedding (other sizes are resized to), `patch_size` overrides the
    architecture's, `pos_embedding` is `learned` (DINO's) or `sincos` (MoCo v3's fixed one), `num_heads` overrides
    the architecture's, `drop_path` sets stochastic depth, `vit_init` picks the weights' initialisation
    (ViT.init_weights).
    """
    name = model["backbone"]
    if name in VITS:
        _, depth, heads, dim, mlp = VITS[name]
        heads = int(model.get("num_heads") or heads)
        vit = ViT(int(model.get("image_size") or 224), patch_size(model), depth, heads, dim, mlp)
        vit.init_weights(model.get("vit_init") or "torchvision")
        if model.get("pos_embedding", "learned") == "sincos":
            vit.fix_sincos_position_embedding()
        vit.set_drop_path(float(model.get("drop_path") or 0.0))
        return vit
    if name not in RESNETS:
        raise ValueError(f"unknown backbone {name!r}; choose one of {sorted(BACKBONES)}")
    cifar_stem, width = bool(model.get("cifar_stem", False)), int(model.get("width", 64))
    block, layers = RESNETS[name]
    net = _NarrowResNet(BLOCKS[block], list(layers), width)
    if cifar_stem:
        net.conv1 = nn.Conv2d(3, width, kernel_size=3, stride=1, padding=1, bias=False)
        nn.init.kaiming_normal_(net.conv1.weight, mode="fan_out", nonlinearity="relu")
        net.maxpool = nn.Identity()
    if model.get("zero_init_residual"):  # each block's last BN scale 0: a block starts as its shortcut
        for m in net.modules():
            if isinstance(m, (Bottleneck, BasicBlock)):
                nn.init.zeros_(m.bn3.weight if isinstance(m, Bottleneck) else m.bn2.weight)
    net.feat_dim = cast(nn.Linear, net.fc).in_features
    net.fc = nn.Identity()
    return net
