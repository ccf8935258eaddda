"""Method registry: `method.name` in the config picks the class."""
from __future__ import annotations

from pipeline.methods.base import Method
from pipeline.methods.byol import BYOL
from pipeline.methods.moco import MoCo
from pipeline.methods.simclr import SimCLR
from pipeline.methods.simsiam import SimSiam
from pipeline.methods.supcon import SupCon

METHODS: dict[str, type[Method]] = {"moco": MoCo, "simclr": SimCLR, "byol": BYOL, "simsiam": SimSiam,
                                    "supcon": SupCon}


def build_method(cfg: dict) -> Method:
    kind = cfg["method"]["kind"]
    if kind not in METHODS:
        raise ValueError(f"unknown method kind {kind!r}; known: {sorted(METHODS)}")
    method = METHODS[kind](cfg)
    aug = cfg.get("augment") or {}
    if aug.get("kind", "views") == "views" and aug:
        from pipeline.augment.colour import ModelColourStage
        from pipeline.augment.view_maker import image_recipe

        stage = ModelColourStage(image_recipe(aug))
        method.colour_stage = stage if stage else None
    from pipeline.plugins import build_plugin

    for name in (cfg.get("plugin") or {}):
        plugin = build_plugin(name, cfg)
        method.plugins.append(plugin)
        plugin.attach(method)
    return method
