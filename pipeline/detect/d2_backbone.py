"""detectron2 backbones for the project's ResNets, registered in detectron2's BACKBONE_REGISTRY.

detectron2's own builder has only the 7x7/2 stem with max-pool and asks ResNet-18/34 for width 64; the
project trains narrow ResNets and, for 32-64 px data, the CIFAR stem (a 3x3/1 conv, no pool). These builders
take any width and either stem (MODEL.RESNETS.CIFAR_STEM), with detectron2's own blocks, stages and FPN, so a
checkpoint from pipeline.detect.convert loads with every weight in place:

  build_augssl_resnet_backbone       the trunk up to MODEL.RESNETS.OUT_FEATURES (C4 models: res4)
  build_augssl_resnet_fpn_backbone   the trunk under detectron2's FPN with a max-pooled top level

C4 models take res5 from detectron2's Res5ROIHeads, which builds it from bottleneck blocks: C4 needs
ResNet-50; ResNet-18/34 go with FPN.
"""

from __future__ import annotations

import math

import torch.nn.functional as F
from detectron2.layers import CNNBlockBase, Conv2d, ShapeSpec, get_norm
from detectron2.modeling import BACKBONE_REGISTRY
from detectron2.modeling.backbone import FPN
from detectron2.modeling.backbone.fpn import LastLevelMaxPool
from detectron2.modeling.backbone.resnet import BasicBlock, BasicStem, BottleneckBlock, ResNet
from fvcore.nn import weight_init

BLOCKS = {18: [2, 2, 2, 2], 34: [3, 4, 6, 3], 50: [3, 4, 6, 3]}


def add_augssl_config(cfg) -> None:
    """The keys these builders read beyond detectron2's defaults."""
    cfg.MODEL.RESNETS.CIFAR_STEM = False


class CifarStem(CNNBlockBase):
    """A 3x3, stride-1 conv with its norm and ReLU, no pooling: the stem of ResNets trained on 32-64 px images.
    Named like BasicStem's conv (`conv1`, its norm `conv1.norm`), so checkpoints address both alike."""

    def __init__(self, in_channels: int = 3, out_channels: int = 64, norm: str = "BN"):
        super().__init__(in_channels, out_channels, 1)
        self.conv1 = Conv2d(
            in_channels, out_channels, kernel_size=3, stride=1, padding=1, bias=False, norm=get_norm(norm, out_channels)
        )
        weight_init.c2_msra_fill(self.conv1)

    def forward(self, x):
        return F.relu_(self.conv1(x))


@BACKBONE_REGISTRY.register()
def build_augssl_resnet_backbone(cfg, input_shape: ShapeSpec) -> ResNet:
    r = cfg.MODEL.RESNETS
    if r.DEPTH not in BLOCKS:
        raise ValueError(f"MODEL.RESNETS.DEPTH={r.DEPTH}: the project's ResNets are {sorted(BLOCKS)}")
    stem = (CifarStem if r.CIFAR_STEM else BasicStem)(input_shape.channels, r.STEM_OUT_CHANNELS, r.NORM)
    c_in, c_out, mid = r.STEM_OUT_CHANNELS, r.RES2_OUT_CHANNELS, r.NUM_GROUPS * r.WIDTH_PER_GROUP
    stages = []
    for i, n in enumerate(BLOCKS[r.DEPTH]):
        kw = {
            "num_blocks": n,
            "stride_per_block": [1 if i == 0 else 2] + [1] * (n - 1),
            "in_channels": c_in,
            "out_channels": c_out,
            "norm": r.NORM,
        }
        if r.DEPTH >= 50:
            kw.update(
                block_class=BottleneckBlock,
                bottleneck_channels=mid,
                stride_in_1x1=r.STRIDE_IN_1X1,
                num_groups=r.NUM_GROUPS,
            )
        else:
            kw.update(block_class=BasicBlock)
        stages.append(ResNet.make_stage(**kw))
        c_in, c_out, mid = c_out, c_out * 2, mid * 2
    return ResNet(stem, stages, out_features=r.OUT_FEATURES, freeze_at=cfg.MODEL.BACKBONE.FREEZE_AT)


@BACKBONE_REGISTRY.register()
def build_augssl_resnet_fpn_backbone(cfg, input_shape: ShapeSpec) -> FPN:
    bottom_up = build_augssl_resnet_backbone(cfg, input_shape)
    top = LastLevelMaxPool()  # it pools the FPN's last level, which is not p5 behind the CIFAR stem or without res5
    stride = bottom_up.output_shape()[cfg.MODEL.FPN.IN_FEATURES[-1]].stride
    top.in_feature = f"p{int(math.log2(stride))}"
    return FPN(
        bottom_up=bottom_up,
        in_features=cfg.MODEL.FPN.IN_FEATURES,
        out_channels=cfg.MODEL.FPN.OUT_CHANNELS,
        norm=cfg.MODEL.FPN.NORM,
        top_block=top,
        fuse_type=cfg.MODEL.FPN.FUSE_TYPE,
    )


def fpn_levels(cifar_stem: bool) -> list[str]:
    """The FPN's output names (p<log2 stride>): p2..p6 behind the standard stem, p0..p4 behind the CIFAR stem."""
    first = 0 if cifar_stem else 2
    return [f"p{first + i}" for i in range(5)]
