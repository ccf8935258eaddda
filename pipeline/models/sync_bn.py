"""BatchNorm whose training statistics cover every rank's batch, for modules that run without gradients (MoCo's key
encoder under method.key_bn=sync).

Each layer sends one all-reduce of 2C + 1 float64 values (per channel: count x mean, and the centred sum of squares
plus count x mean^2) instead of the key views themselves. Without a backward it needs none of torch.nn.SyncBatchNorm's
gradient exchange, and it runs on any device (torch's SyncBatchNorm refuses CPU tensors, so gloo could not test it).
The state-dict keys are BatchNorm's: checkpoints load either way.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pipeline import dist


def global_stats(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Per-channel mean and biased variance of `x` ([N, C, ...]) over every rank's batch, and the global count. Each
    rank's moments are taken in two passes locally (stable in float32), then merged exactly in float64."""
    dims = [0, *range(2, x.dim())]
    xf = x.float()
    n = xf.numel() // xf.shape[1]
    mean = xf.mean(dims)
    m2 = (xf - mean.view(1, -1, *[1] * (x.dim() - 2))).pow(2).sum(dims)
    mean64 = mean.double()
    stats = torch.cat(
        [n * mean64, m2.double() + n * mean64 * mean64, torch.tensor([float(n)], device=x.device, dtype=torch.float64)]
    )
    dist.all_reduce_(stats)
    c = x.shape[1]
    total = float(stats[-1])
    g_mean = stats[:c] / total
    g_var = stats[c : 2 * c] / total - g_mean * g_mean
    return g_mean, g_var.clamp_min(0), total


class _SyncStats:
    """The forward of BatchNorm1d/2d with global statistics in training mode; eval mode, or one process, is
    BatchNorm's own."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bn: nn.modules.batchnorm._BatchNorm = self  # type: ignore[assignment]
        if not bn.training or not dist.is_dist():
            return nn.modules.batchnorm._BatchNorm.forward(bn, x)
        if torch.is_grad_enabled() and x.requires_grad:
            raise RuntimeError("the key encoder's synced BatchNorm has no backward: run it under torch.no_grad()")
        with torch.no_grad():
            mean, var, total = global_stats(x)
            if bn.track_running_stats:
                assert bn.running_mean is not None and bn.running_var is not None
                assert bn.num_batches_tracked is not None and bn.momentum is not None
                m = bn.momentum
                bn.running_mean.mul_(1 - m).add_(mean.to(bn.running_mean.dtype), alpha=m)
                unbiased = var * total / max(total - 1, 1)
                bn.running_var.mul_(1 - m).add_(unbiased.to(bn.running_var.dtype), alpha=m)
                bn.num_batches_tracked.add_(1)
            return F.batch_norm(x, mean.float(), var.float(), bn.weight, bn.bias, False, 0.0, bn.eps)


class SyncStatsBatchNorm1d(_SyncStats, nn.BatchNorm1d):
    pass


class SyncStatsBatchNorm2d(_SyncStats, nn.BatchNorm2d):
    pass


def convert_sync_stats_bn(module: nn.Module) -> nn.Module:
    """Every BatchNorm1d/2d of `module` (in place) by its global-statistics twin, state and all."""
    twins: dict[type, type[nn.modules.batchnorm._BatchNorm]] = {
        nn.BatchNorm1d: SyncStatsBatchNorm1d,
        nn.BatchNorm2d: SyncStatsBatchNorm2d,
    }
    for name, child in module.named_children():
        kind = twins.get(type(child))
        if kind is not None and isinstance(child, nn.modules.batchnorm._BatchNorm):
            new = kind(
                child.num_features,
                eps=child.eps,
                momentum=child.momentum,
                affine=child.affine,
                track_running_stats=child.track_running_stats,
            )
            new.load_state_dict(child.state_dict())
            if child.weight is not None:
                new.to(child.weight.device)
            for p_new, p_old in zip(new.parameters(), child.parameters()):  # a frozen momentum copy stays frozen
                p_new.requires_grad_(p_old.requires_grad)
            new.train(child.training)
            setattr(module, name, new)
        else:
            convert_sync_stats_bn(child)
    return module
