"""Projection and prediction heads."""
from __future__ import annotations

from torch import nn


def mlp_head(in_dim: int, hidden_dim: int, out_dim: int, num_layers: int = 2, bn: bool = False) -> nn.Module:
    """Linear(-BN)-ReLU blocks then a final Linear; `num_layers=1` is a plain linear projection (MoCo v1)."""
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
    layers.append(nn.Linear(dim, out_dim))
    return nn.Sequential(*layers)
