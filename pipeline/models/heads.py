"""Every projection and prediction head: the MLP heads of MoCo, SimCLR, BYOL, SimSiam and MoCo v3, and DINO's head
with its weight-normalised last layer."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def mlp_head(
    in_dim: int,
    hidden_dim: int,
    out_dim: int,
    num_layers: int = 2,
    bn: bool = False,
    last_bn: bool = False,
    last_bias: bool = True,
    last_bn_scale: bool = False,
) -> nn.Sequential:
    """Linear(-BN)-ReLU blocks then a final Linear; `num_layers=1` is a plain linear projection (MoCo v1).

    `last_bn` puts BN without affine parameters after the final Linear, whose bias it would cancel and which is
    dropped: SimSiam's projector and MoCo v3's. `last_bias=False` drops the final Linear's bias without it (MoCo v3's
    official `_build_mlp` makes every Linear bias-free, the ResNet predictor's last one included). `last_bn_scale`
    puts BN with a learned scale and no shift there instead (SimCLR's output layer: `center=False`), the Linear
    before it bias-free too."""
    if num_layers < 1:
        raise ValueError("num_layers must be >= 1")
    layers: list[nn.Module] = []
    dim = in_dim
    for _ in range(num_layers - 1):
        layers.append(nn.Linear(dim, hidden_dim, bias=not bn))
        if bn:
            layers.append(nn.BatchNorm1d(hidden_dim))
        layers.append(nn.ReLU(inplace=True))
        dim = hidden_dim
    layers.append(nn.Linear(dim, out_dim, bias=last_bias and not (last_bn or last_bn_scale)))
    if last_bn_scale:
        layers.append(ScaleBatchNorm1d(out_dim))
    elif last_bn:
        layers.append(nn.BatchNorm1d(out_dim, affine=False))
    return nn.Sequential(*layers)


class ScaleBatchNorm1d(nn.BatchNorm1d):
    """BatchNorm1d whose affine part is the scale γ alone, no shift β (SimCLR's `batch_norm_relu(..., center=False)`
    after the projection head's last Dense). torch's batch_norm takes a weight without a bias, and SyncBatchNorm's
    conversion copies both as they are."""

    def __init__(self, num_features: int):
        super().__init__(num_features)
        self.register_parameter("bias", None)

    def reset_parameters(self) -> None:
        self.reset_running_stats()
        nn.init.ones_(self.weight)


class NormedLinear(nn.Module):
    """A bias-free Linear whose weight rows are L2-normalised on use: weight normalisation w = g·v/‖v‖ with the gain
    g fixed to 1 (DINO's `norm_last_layer`), so only the direction v is learned."""

    def __init__(self, in_dim: int, out_dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_dim, in_dim))
        # nn.Linear's default, as the authors' weight-normed nn.Linear keeps (kaiming-uniform, a = sqrt 5): its
        # direction is the same as trunc-normal's, but AdamW's per-coordinate steps turn a row of this length
        # about 1.8 times slower than one of trunc-normal(0.02)'s
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, F.normalize(self.weight, dim=1))


class DINOHead(nn.Module):
    """DINO's projection head (Caron et al. 2021, §3.1 and App. "Projection head"): a 3-layer MLP (hidden 2048,
    GELU, no BN) to a `bottleneck`-d output, L2-normalised, then the weight-normalised `last_layer` to `out_dim`
    prototypes (65536 in the paper). The MLP's weights are truncated-normal (std 0.02), biases 0."""

    def __init__(
        self, in_dim: int, out_dim: int, hidden_dim: int = 2048, bottleneck_dim: int = 256, num_layers: int = 3
    ):
        super().__init__()
        dims = [in_dim] + [hidden_dim] * (num_layers - 1) + [bottleneck_dim]
        layers: list[nn.Module] = []
        for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
            layers.append(nn.Linear(a, b))
            if i < len(dims) - 2:
                layers.append(nn.GELU())
        self.mlp = nn.Sequential(*layers)
        for m in self.mlp:
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                nn.init.zeros_(m.bias)
        self.last_layer = NormedLinear(bottleneck_dim, out_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.last_layer(F.normalize(self.mlp(x), dim=1))
