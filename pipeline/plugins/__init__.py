"""Plug-ins: add views and loss terms to a framework, composed by config (`plugin=[co2]`, `plugin=[clsa]`,
`plugin=[invclr]`, `plugin=[cocor]`); their constants live in conf/plugin/<name>.yaml. pipeline.build checks and
attaches them. The project's own are listed below, one line each; an installed package adds its own under the
`augssl.plugins` entry-point group, in the same form (pipeline.registry, docs/extending.md). Importing this package
imports no plug-in, nor torch."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Iterator, cast

from pipeline.fields import check_model
from pipeline.registry import Registry

if TYPE_CHECKING:
    from pipeline.plugins.base import Plugin

# name -> "module:Class", the form an installed package's entry points take: one line here per plug-in of the project's
PLUGINS: Registry[Plugin] = Registry(
    "augssl.plugins",
    {
        "clsa": "pipeline.plugins.clsa:CLSA",
        "co2": "pipeline.plugins.co2:CO2",
        "cocor": "pipeline.plugins.cocor:CoCor",
        "invclr": "pipeline.plugins.invclr:InvCLR",
    },
)


def own_settings(own: dict | None, method_name: str, method_kind: str) -> dict:
    """A plug-in's `plugin.<name>` keys with its `per_method` table applied (the table and `defined_on` left out): a
    key left null takes the table's value for the run's method name, else for its kind, else its `default` entry.
    The per-framework constants of a plug-in's paper live in its yaml this way, and its code names no method.

    Example: own_settings({"alpha": None, "per_method": {"mocov1": {"alpha": 10.0}, "default": {"alpha": 0.3}}},
    "mocov1", "moco") == {"alpha": 10.0}"""
    keys = dict(own or {})
    table = keys.pop("per_method", None) or {}
    keys.pop("defined_on", None)  # what its paper covers: pipeline.build.plugin_notes reads it
    for source in (table.get(method_name), table.get(method_kind), table.get("default")):
        for k, v in (source or {}).items():
            if keys.get(k) is None:
                keys[k] = v
    return keys


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
        keys = own_settings(own, run.method_name, run.method_kind)
        settings = check_model(cls.Settings, keys, root=f"plugin.{name}")
        # each plug-in's constructor takes its own settings, typed, and what it reads of the run
        yield cast("Callable[..., Plugin]", cls)(settings, run)
