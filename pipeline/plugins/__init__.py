"""Plug-ins: add views and loss terms to a framework, composed by config (`plugin=[co2]`, `plugin=[clsa]`,
`plugin=[invclr]`, `plugin=[cocor]`); their constants live in conf/plugin/<name>.yaml. pipeline.build checks and
attaches them. The project's own are the classes here that set `name`; an installed package adds its own under the
`augssl.plugins` entry-point group (pipeline.registry, docs/extending.md). Importing this package imports no plug-in,
nor torch."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.registry import Registry, declared

if TYPE_CHECKING:
    from pipeline.plugins.base import Plugin

PLUGINS: Registry[Plugin] = Registry("augssl.plugins", declared(("pipeline.plugins",), "name", "Plugin"))


def build_plugin(name: str, cfg: dict) -> Plugin:
    return PLUGINS[name](dict(cfg["plugin"][name] or {}), cfg)
