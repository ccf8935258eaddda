"""The backbones a config can name, and what the checks need to know of each, without torch: the one place these
facts live (pipeline.models.backbones builds from them; pipeline.sections and pipeline.schema check against them)."""

from __future__ import annotations

# name -> (block, blocks per stage): torchvision's ResNets
RESNETS = {
    "resnet18": ("basic", (2, 2, 2, 2)),
    "resnet34": ("basic", (3, 4, 6, 3)),
    "resnet50": ("bottleneck", (3, 4, 6, 3)),
}
# name -> (patch size, layers, heads, width, MLP width): ViT-S/16 and ViT-B/16 as in DeiT / MoCo v3 / DINO; vit_tiny
# is DeiT-Tiny's width with 4 layers and 4-px patches, for 32-px images and CPU tests
VITS = {
    "vit_tiny": (4, 4, 3, 192, 768),
    "vit_s16": (16, 12, 6, 384, 1536),
    "vit_b16": (16, 12, 12, 768, 3072),
}
BACKBONES = (*RESNETS, *VITS)


def is_vit(name: str) -> bool:
    return name in VITS


def vit_patch(name: str) -> int:
    """The architecture's patch size (model.patch_size null takes it)."""
    return VITS[name][0]


def shortcut_widening(name: str) -> int:
    """How much wider than model.width a ResNet's stage outputs are: 4 for bottleneck blocks, else 1."""
    return 4 if RESNETS[name][0] == "bottleneck" else 1
