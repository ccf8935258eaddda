"""Plug-ins: add views and loss terms to a framework, composed by config (`plugin=[co2]`, `plugin=[clsa]`,
`plugin=[invclr]`, `plugin=[cocor]`); their constants live in conf/plugin/<name>.yaml. pipeline.build checks
and attaches them."""

from __future__ import annotations

from pipeline.plugins.base import Plugin
from pipeline.plugins.clsa import CLSA
from pipeline.plugins.co2 import CO2
from pipeline.plugins.cocor import CoCor
from pipeline.plugins.invclr import InvCLR

PLUGINS: dict[str, type[Plugin]] = {"co2": CO2, "clsa": CLSA, "invclr": InvCLR, "cocor": CoCor}


def build_plugin(name: str, cfg: dict) -> Plugin:
    return PLUGINS[name](dict(cfg["plugin"][name] or {}), cfg)
