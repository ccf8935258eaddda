"""Split BatchNorm: BN statistics over G interleaved sub-batches, as if the batch were spread over G devices.

MoCo's shuffle-BN stops a query and its positive key from sharing batch statistics. On N workers the key
batch is shuffled across workers; on one worker there is no other device, so both encoders normalise in
G groups and the key batch is shuffled across groups instead (the same trick as MoCo's CIFAR demo).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class SplitBatchNorm2d(nn.BatchNorm2d):
    def __init__(self, num_features: int, splits: int, **kw):
        super().__init__(num_features, **kw)
        self.splits = splits

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, c, h, w = x.shape
        if not self.training or self.splits == 1:
            return super().forward(x)
        if n % self.splits:
            raise ValueError(f"batch of {n} does not split into {self.splits} BN groups")
        g = self.splits
        # running statistics and a momentum: convert_split_bn builds it tracking, with the BN's momentum
        assert self.running_mean is not None and self.running_var is not None and self.num_batches_tracked is not None
        assert self.momentum is not None
        # sample i goes to group i % g: a [n/g, g*c] view puts each group's channels side by side
        mean = self.running_mean.repeat(g)
        var = self.running_var.repeat(g)
        # reshape, not view: a channels_last batch (the CUDA default) cannot be viewed this way; hand the next
        # convolution the layout it came in
        fmt = (
            torch.channels_last
            if x.is_contiguous(memory_format=torch.channels_last) and c > 1
            else torch.contiguous_format
        )
        out = (
            F.batch_norm(
                x.reshape(-1, c * g, h, w),
                mean,
                var,
                self.weight.repeat(g),
                self.bias.repeat(g),
                True,
                self.momentum,
                self.eps,
            )
            .reshape(n, c, h, w)
            .contiguous(memory_format=fmt)
        )
        self.running_mean.copy_(mean.view(g, c).mean(0))
        self.running_var.copy_(var.view(g, c).mean(0))
        self.num_batches_tracked.add_(1)
        return out


def convert_split_bn(module: nn.Module, splits: int) -> nn.Module:
    """Replace every BatchNorm2d in `module` (in place) by a SplitBatchNorm2d sharing its state."""
    if splits <= 1:
        return module
    for name, child in module.named_children():
        if isinstance(child, nn.BatchNorm2d) and not isinstance(child, SplitBatchNorm2d):
            new = SplitBatchNorm2d(child.num_features, splits, eps=child.eps, momentum=child.momentum)
            new.load_state_dict(child.state_dict())
            setattr(module, name, new)
        else:
            convert_split_bn(child, splits)
    return module
