"""Plug-ins: add views and loss terms to a framework, composed by config (`plugin=[co2]`, `plugin=[clsa]`,
`plugin=[invclr]`, `plugin=[cocor]`); their constants live in conf/plugin/<name>.yaml. pipeline.build checks and
attaches them. The project's own are the classes here that set `name`; an installed package adds its own under the
`augssl.plugins` entry-point group (pipeline.registry, docs/extending.md). Importing this package imports no plug-in,
nor torch."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Iterator, cast

from pipeline.fields import check_model
from pipeline.registry import Registry, declared

if TYPE_CHECKING:
    from pipeline.plugins.base import Plugin

PLUGINS: Registry[Plugin] = Registry("augssl.plugins", declared(("pipeline.plugins",), "name", "Plugin"))


def build_plugins(cfg: dict) -> Iterator[Plugin]:
    """The config's plug-ins, in its order, one at a time (the builder attaches each before the next is made):
    each one's `plugin.<name>` keys typed by its `Settings` (ConfigError with one line naming the first bad key) and
    what it reads of the rest of the config, a PluginRun. `cfg`: a checked config, or the config a checkpoint
    recorded (the keys a plug-in reads of the run have defaults)."""
    from pipeline.plugins.base import PluginRun  # torch

    data = cfg.get("data") or {}
    run = PluginRun(
        augment=cfg.get("augment") or {},
        method_kind=cfg["method"]["kind"],
        method_name=cfg["method"]["name"],
        seed=int(cfg.get("seed", 0)),
        epochs=int((cfg.get("train") or {}).get("epochs", 1)),
        data_train=data.get("train") or "",
        data_task=data.get("task", "classification"),
        data_targets=data.get("targets"),
    )
    for name, own in (cfg.get("plugin") or {}).items():
        cls = PLUGINS[name]
        settings = check_model(cls.Settings, dict(own or {}), root=f"plugin.{name}")
        # each plug-in's constructor takes its own settings, typed, and what it reads of the run
        yield cast("Callable[..., Plugin]", cls)(settings, run)
