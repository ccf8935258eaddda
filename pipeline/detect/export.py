"""Write a pretraining run's backbone in another library's format.

detectron2: the pickle its DetectionCheckpointer reads as a model-zoo file ({"model", "__author__",
"matching_heuristics"}), numpy arrays under detectron2's names, and under "augssl" what a detectron2 config needs
to rebuild the same trunk: MODEL.RESNETS (depth, widths, stem, STRIDE_IN_1X1), MODEL.PIXEL_MEAN/STD and
INPUT.FORMAT. torchvision: torch.save of the torchvision ResNet state dict (no classifier) with the same facts.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import torch

from pipeline.detect.convert import pixel_config, resnet_config, to_detectron2

FORMATS = {"detectron2": ".pkl", "torchvision": ".pt"}


def backbone_meta(src) -> dict:
    """What the exported weights are: their run, architecture, layout and pixel statistics (src: a Source)."""
    model = src.cfg["model"]
    return {
        "run_id": src.run_id,
        "source": src.ref,
        "backbone": model["backbone"],
        "cifar_stem": bool(model.get("cifar_stem", False)),
        "width": int(model.get("width", 64)),
        "image_size": src.cfg["data"].get("image_size"),
        "resnets": resnet_config(model),
        "pixel": pixel_config(src.cfg["augment"] if "mean" in src.cfg["augment"] else src.cfg["data"]),
    }


def export(src, fmt: str, out: Path) -> Path:
    """Write `src`'s backbone to `out` in `fmt` (detectron2 | torchvision); returns `out`."""
    if fmt not in FORMATS:
        raise ValueError(f"format={fmt}: expected one of {sorted(FORMATS)}")
    state = {k: v.detach().cpu() for k, v in src.backbone.items()}
    meta = backbone_meta(src)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".partial")  # a crash leaves no half-written file under the real name
    if fmt == "detectron2":
        model = {k: v.float().numpy() for k, v in to_detectron2(state).items()}
        with open(tmp, "wb") as f:
            pickle.dump({"model": model, "__author__": "augssl", "matching_heuristics": True, "augssl": meta}, f)
    else:
        torch.save({"state_dict": {k: v for k, v in state.items() if not k.startswith("fc.")}, "augssl": meta}, tmp)
    tmp.replace(out)
    return out
