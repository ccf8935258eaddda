"""A config into the objects a run trains, in one place: the method with its plug-ins and colour stage, and the
checks that the three fit together (a plug-in fed the fields it needs from the method's step).

The one module that imports both registries: methods and plug-ins never import each other (a plug-in reads the
method's StepContext, pipeline.methods.context)."""

from __future__ import annotations

from typing import Any, Callable, Mapping, cast

import yaml

from pipeline.augment.colour import ModelColourStage
from pipeline.augment.view_makers import image_recipe
from pipeline.config import CONF_DIR
from pipeline.curve_panels import Panel
from pipeline.fields import Checked, check_model
from pipeline.methods import METHODS
from pipeline.methods.base import Method
from pipeline.methods.context import check_contract, satisfied
from pipeline.methods.settings import MethodRun
from pipeline.plugins import PLUGINS, build_plugins, own_settings
from pipeline.run_shape import RunShape
from pipeline.sections import Config


def check_method(settings: dict[str, Any], shape: RunShape) -> None:
    """The method's own keys (`settings`: the method section) against its `Settings`, then its `check` of the run's
    shape: ConfigError with one line."""
    method = METHODS[settings["kind"]]
    method.check(check_model(method.Settings, settings, root="method"), shape)


def complete_method(c: Checked[Config]) -> dict[str, Any]:
    """The method's settled `auto` settings (its `complete`), which the job writes into its config: the checkpoint's
    config then rebuilds the same model."""
    method = METHODS[c.typed.method.kind]
    return method.complete(method.Settings.model_validate(c.raw["method"]), RunShape.of(c))


def check_plugins(c: Checked[Config]) -> None:
    """ValueError with one line when a plug-in is unknown, needs context the method does not provide, lacks its
    views or has bad settings. Nothing is built: each plug-in's `check` reads its settings and the run's shape."""
    m, shape, plugins = c.typed.method, RunShape.of(c), c.raw.get("plugin") or {}
    for name in plugins:
        if name not in PLUGINS:
            raise ValueError(f"unknown plugin {name!r}; known: {sorted(PLUGINS)}")
        check_contract(m.kind, METHODS[m.kind].provides, name, PLUGINS[name].needs)
        keys = own_settings(plugins[name], m.name, m.kind)
        typed = check_model(PLUGINS[name].Settings, keys, root=f"plugin.{name}")
        PLUGINS[name].check(typed, shape)  # what it asks of the run


def plugin_notes(kind: str, plugins: Mapping[str, Any]) -> list[str]:
    """One line per plug-in the run uses on a framework its paper did not define it on: it composes by the fields
    the method provides, and the run says so (pipeline.train.launch prints and records these)."""
    return [
        f"plugin {name} on method kind {kind!r}: its paper defines it on {', '.join(_defined_on(own)) or 'none'}; "
        f"here it works from what the method provides ({_fields(METHODS[kind].provides, PLUGINS[name].needs)})"
        for name, own in plugins.items()
        if kind not in _defined_on(own)
    ]


def drawn_curves(kind: str, plugins: Mapping[str, Any]) -> tuple[list[str], list[Panel]]:
    """The loss terms the method and its plug-ins declare, and the plug-ins' own panels (pipeline.train.curves)."""
    terms = [*METHODS[kind].loss_terms, *(t for name in plugins for t in PLUGINS[name].loss_terms)]
    return terms, [p for name in plugins for p in PLUGINS[name].panels]


def _defined_on(own: dict | None) -> list[str]:
    return list((own or {}).get("defined_on") or [])


def _fields(provides: frozenset[str], needs: tuple[frozenset[str], ...]) -> str:
    met = next((n for n in needs if n <= provides), frozenset())
    return "+".join(sorted(met)) or "nothing"


def build_method(cfg: dict) -> Method:
    """The method `method.kind` names, with the recipe's model-side colour stage and the config's plug-ins."""
    kind = cfg["method"]["kind"]
    if kind not in METHODS:
        raise ValueError(f"unknown method kind {kind!r}; known: {sorted(METHODS)}")
    cls = METHODS[kind]
    run = MethodRun(
        model=cfg["model"],
        seed=int(cfg.get("seed", 0)),
        epochs=int((cfg.get("train") or {}).get("epochs", 1)),
    )
    # each method's constructor takes its own settings, typed, and what it reads of the run
    method = cast(Callable[..., Method], cls)(cls.Settings.model_validate(cfg["method"]), run)
    aug = cfg.get("augment") or {}
    if aug.get("kind", "views") == "views" and aug:
        stage = ModelColourStage(image_recipe(aug))
        method.colour_stage = stage if stage else None
    for plugin in build_plugins(cfg):
        method.plugins.append(plugin)
        plugin.attach(method)
    return method


def plugin_matrix() -> str:
    """The framework x plug-in table (markdown) of what composes: each method config of conf/method/ against each
    plug-in, ✓ where its paper defines it on the framework, ○ where it composes by the fields the method provides
    alone (the run says so in a notice), blank where the method leaves none of the sets it needs; JointCrop/JointBlur
    is a sampler of any image recipe's first two views. README.md prints it; tests/train/test_device_step.py trains
    each marked cell."""
    kinds = {p.stem: yaml.safe_load(p.read_text())["kind"] for p in (CONF_DIR / "method").glob("*.yaml")}
    kinds = dict(sorted(kinds.items(), key=lambda nk: (list(METHODS).index(nk[1]), nk[0])))
    names = sorted(PLUGINS)
    lines = ["| framework | " + " | ".join(names) + " | jointcrop |", "| --- |" + " :-: |" * (len(names) + 1)]
    for name, kind in kinds.items():
        cells = [matrix_cell(kind, p) for p in names]
        lines.append(f"| {name} | " + " | ".join(cells) + " | ✓ |")
    return "\n".join(lines)


def matrix_cell(kind: str, plugin: str) -> str:
    """✓: the plug-in's paper defines it on the method kind; ○: it composes by contract alone; "": it cannot."""
    if not satisfied(METHODS[kind].provides, PLUGINS[plugin].needs):
        return ""
    own = CONF_DIR / "plugin" / f"{plugin}.yaml"
    return "✓" if own.exists() and kind in _defined_on(yaml.safe_load(own.read_text())) else "○"
