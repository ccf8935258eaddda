"""detectron2 configs for a backbone exported by jobs/export.py: one of detectron2's own model-zoo configs
(read by path from the installed package), with the backbone's layout, pixel statistics and input format put in.
"""

from __future__ import annotations

from pathlib import Path

import detectron2
from detectron2.config import get_cfg

from pipeline.detect.d2_backbone import add_augssl_config, fpn_levels

ARCHS = {  # arch -> (model-zoo config, backbone builder)
    "c4": ("COCO-Detection/faster_rcnn_R_50_C4_1x.yaml", "build_augssl_resnet_backbone"),
    "fpn": ("COCO-Detection/faster_rcnn_R_50_FPN_1x.yaml", "build_augssl_resnet_fpn_backbone"),
}


def zoo_config(name: str) -> str:
    """A config file of detectron2's model zoo, by path (model_zoo.get_config_file needs pkg_resources)."""
    path = Path(detectron2.__file__).parent / "model_zoo" / "configs" / name
    if not path.exists():
        raise FileNotFoundError(f"{name}: not among detectron2's model-zoo configs ({path.parent})")
    return str(path)


def model_config(meta: dict, arch: str, num_classes: int, base: str | None = None):
    """A detectron2 CfgNode for `arch` (c4 | fpn) on the exported backbone described by `meta` (the export's
    "augssl" entry: resnets, pixel). `base` replaces the arch's model-zoo config (a zoo name or a file)."""
    if arch not in ARCHS:
        raise ValueError(f"arch={arch}: expected one of {sorted(ARCHS)}")
    zoo, builder = ARCHS[arch]
    r = meta["resnets"]
    if arch == "c4" and r["DEPTH"] < 50:
        raise ValueError(
            f"arch=c4 needs a bottleneck ResNet (detectron2's Res5ROIHeads builds res5 from bottleneck "
            f"blocks); this backbone is ResNet-{r['DEPTH']}: use arch=fpn"
        )
    cfg = get_cfg()
    add_augssl_config(cfg)
    cfg.merge_from_file(base if base and Path(base).is_file() else zoo_config(base or zoo))
    for key, value in r.items():
        setattr(cfg.MODEL.RESNETS, key, value)
    cfg.MODEL.BACKBONE.NAME = builder
    cfg.MODEL.WEIGHTS = ""
    cfg.MODEL.PIXEL_MEAN, cfg.MODEL.PIXEL_STD = list(meta["pixel"]["PIXEL_MEAN"]), list(meta["pixel"]["PIXEL_STD"])
    cfg.INPUT.FORMAT = meta["pixel"]["FORMAT"]
    cfg.MODEL.ROI_HEADS.NUM_CLASSES = num_classes
    if arch == "fpn":
        levels = fpn_levels(r["CIFAR_STEM"])
        cfg.MODEL.RESNETS.OUT_FEATURES = cfg.MODEL.FPN.IN_FEATURES = ["res2", "res3", "res4", "res5"]
        cfg.MODEL.RPN.IN_FEATURES = levels
        cfg.MODEL.ROI_HEADS.IN_FEATURES = levels[:4]
    return cfg
