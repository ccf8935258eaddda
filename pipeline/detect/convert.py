"""A pretrained ResNet in detectron2's names and configuration. Pure: state dicts and config dicts in and out.

detectron2's ResNet names its parts stem / res2..res5 where torchvision has conv1+bn1 / layer1..layer4, folds
each BatchNorm into the conv before it (`<conv>.norm.*`) and calls the projection shortcut `shortcut`. The
checkpoint is written with `matching_heuristics`, so detectron2 places `res5.*` wherever its model keeps res5
(the backbone in FPN models, the box head in C4 models) by suffix matching.
"""

from __future__ import annotations

import re

# torchvision's block counts, for the depth detectron2 wants
DEPTHS = {"resnet18": 18, "resnet34": 34, "resnet50": 50}
EXPANSION = {18: 1, 34: 1, 50: 4}

_BLOCK = re.compile(r"layer([1-4])\.(\d+)\.(.+)")


def detectron2_name(name: str) -> str | None:
    """The detectron2 name of a torchvision ResNet parameter or buffer; None for what detectron2 has no place for
    (the classifier, BatchNorm's step counters). ValueError for a name that is no ResNet's."""
    if name.startswith("fc.") or name.endswith("num_batches_tracked"):
        return None
    if name == "conv1.weight":
        return "stem.conv1.weight"
    if name.startswith("bn1."):
        return "stem.conv1.norm." + name[len("bn1.") :]
    m = _BLOCK.fullmatch(name)
    if m is None:
        raise ValueError(f"{name!r} is not a torchvision ResNet key")
    stage, block, rest = int(m[1]) + 1, m[2], m[3]
    prefix = f"res{stage}.{block}."
    if c := re.fullmatch(r"conv(\d)\.weight", rest):
        return f"{prefix}conv{c[1]}.weight"
    if b := re.fullmatch(r"bn(\d)\.(.+)", rest):
        return f"{prefix}conv{b[1]}.norm.{b[2]}"
    if rest == "downsample.0.weight":
        return prefix + "shortcut.weight"
    if rest.startswith("downsample.1."):
        return prefix + "shortcut.norm." + rest[len("downsample.1.") :]
    raise ValueError(f"{name!r} is not a torchvision ResNet key")


def to_detectron2(state: dict) -> dict:
    """A torchvision ResNet state dict renamed for detectron2 (values untouched; classifier and counters left out)."""
    out = {}
    for k, v in state.items():
        new = detectron2_name(k)
        if new is not None:
            out[new] = v
    return out


def resnet_config(model: dict) -> dict:
    """MODEL.RESNETS (and the stem kind) for a backbone built by pipeline.models.backbones.build_backbone.

    torchvision's bottleneck strides in its 3x3 conv (STRIDE_IN_1X1 = False, as for every torchvision-trained
    ResNet); the trunk's base width sets the stem's and res2's channels."""
    if model["backbone"] not in DEPTHS:
        raise ValueError(f"model.backbone={model['backbone']}: detectron2 export supports {sorted(DEPTHS)}")
    depth, width = DEPTHS[model["backbone"]], int(model.get("width", 64))
    return {
        "DEPTH": depth,
        "STEM_OUT_CHANNELS": width,
        "RES2_OUT_CHANNELS": width * EXPANSION[depth],
        "WIDTH_PER_GROUP": width,
        "NUM_GROUPS": 1,
        "STRIDE_IN_1X1": False,
        "CIFAR_STEM": bool(model.get("cifar_stem", False)),
    }


def pixel_config(data: dict) -> dict:
    """MODEL.PIXEL_MEAN/STD and INPUT.FORMAT the backbone was trained with: RGB, on 0-255 pixel values
    (detectron2 normalises raw pixel values; the pipeline normalises 0-1 ones with data.mean/std)."""
    return {
        "PIXEL_MEAN": [round(float(m) * 255.0, 4) for m in data["mean"]],
        "PIXEL_STD": [round(float(s) * 255.0, 4) for s in data["std"]],
        "FORMAT": "RGB",
    }
