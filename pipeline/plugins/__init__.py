"""Plug-ins: add views and loss terms to a framework, composed by config (`plugin=[co2]`, `plugin=[clsa]`,
`plugin=[invclr]`, `plugin=[cocor]`); their constants live in conf/plugin/<name>.yaml."""
from __future__ import annotations

from pipeline.plugins.base import Plugin
from pipeline.plugins.clsa import CLSA
from pipeline.plugins.co2 import CO2
from pipeline.plugins.cocor import CoCor
from pipeline.plugins.invclr import InvCLR

PLUGINS: dict[str, type[Plugin]] = {"co2": CO2, "clsa": CLSA, "invclr": InvCLR, "cocor": CoCor}


def check_plugins(cfg: dict) -> None:
    """ValueError with one line when a plug-in is unknown, does not fit the framework, or lacks its views."""
    kind = cfg["method"]["kind"]
    for name in (cfg.get("plugin") or {}):
        if name not in PLUGINS:
            raise ValueError(f"unknown plugin {name!r}; known: {sorted(PLUGINS)}")
        if kind not in PLUGINS[name].frameworks:
            raise ValueError(f"plugin {name} does not plug into method kind {kind!r} "
                             f"(it supports {', '.join(PLUGINS[name].frameworks)})")
    if "clsa" in (cfg.get("plugin") or {}):
        from pipeline.augment.view_maker import image_recipe

        aug = cfg["augment"]
        if aug.get("kind", "views") != "views" or not any(v.strong_ops for v in image_recipe(aug).views[2:]):
            raise ValueError("plugin clsa needs strong views after the two weak ones: augment=clsa or clsa_multi")
    for name in (cfg.get("plugin") or {}):
        build_plugin(name, cfg)  # constructors check their own settings


def build_plugin(name: str, cfg: dict) -> Plugin:
    return PLUGINS[name](dict(cfg["plugin"][name] or {}), cfg)
