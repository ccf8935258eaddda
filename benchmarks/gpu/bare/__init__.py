"""Bare tuned loops: torch + torchvision, one module per framework family; `bare_runner` picks a row's. Nothing from
`pipeline` builds them: each class writes its method's step by hand (MoCo v3 takes only its fixed sine-cosine
position embedding, from pipeline.models.backbones)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from .dino import BareDINO
from .moco import BareCoCor, BareMoCo
from .predictor import BareBYOL, BareMoCoV3, BareSimSiam
from .simclr import BareSimCLR


def bare_runner(row: str, cfg: dict, device, precision, fmt, total_steps: int, s: dict) -> Callable:
    kind = cfg["method"]["kind"]
    if kind == "mocov3":
        return BareMoCoV3(cfg, device, precision, fmt, total_steps)
    if kind == "dino":
        return BareDINO(cfg, device, precision, fmt, total_steps)
    if row == "cocor":
        n_classes = len(json.loads((Path(cfg["data"]["train"]) / "manifest.json").read_text())["class_names"])
        return BareCoCor(cfg, device, precision, fmt, n_classes, s["cocor_labelled_batch"])
    if kind == "moco":
        return BareMoCo(cfg, device, precision, fmt)
    if kind == "simclr":
        return BareSimCLR(cfg, device, precision, fmt)
    if kind == "byol":
        return BareBYOL(cfg, device, precision, fmt, total_steps)
    if kind == "simsiam":
        return BareSimSiam(cfg, device, precision, fmt)
    raise ValueError(f"no bare loop for {row} ({kind})")
