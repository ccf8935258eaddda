"""Backbones: torchvision ResNets, optionally with the CIFAR stem, returning pooled features."""
from __future__ import annotations

from torch import nn
from torchvision.models.resnet import BasicBlock, Bottleneck, ResNet

# name -> (block, layers)
_ARCHS = {
    "resnet18": (BasicBlock, [2, 2, 2, 2]),
    "resnet34": (BasicBlock, [3, 4, 6, 3]),
    "resnet50": (Bottleneck, [3, 4, 6, 3]),
}


class _NarrowResNet(ResNet):
    """torchvision's ResNet with a configurable base width (64 is the standard)."""

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
        self.fc = nn.Linear(base_width * 8 * block.expansion, self.fc.out_features)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")


def build_backbone(name: str = "resnet18", cifar_stem: bool = False, width: int = 64) -> nn.Module:
    """A ResNet trunk with `fc = Identity`, so `forward` returns the pooled feature vector.

    `cifar_stem` swaps the 7x7/2 conv + max-pool for a 3x3/1 conv and no pool, as for 32-64 px input.
    The module carries `feat_dim` for the heads built on top of it.
    """
    if name not in _ARCHS:
        raise ValueError(f"unknown backbone {name!r}; choose one of {sorted(_ARCHS)}")
    block, layers = _ARCHS[name]
    net = _NarrowResNet(block, layers, width)
    if cifar_stem:
        net.conv1 = nn.Conv2d(3, width, kernel_size=3, stride=1, padding=1, bias=False)
        nn.init.kaiming_normal_(net.conv1.weight, mode="fan_out", nonlinearity="relu")
        net.maxpool = nn.Identity()
    net.feat_dim = net.fc.in_features
    net.fc = nn.Identity()
    return net
