"""Config: Hydra composition of conf/ with `key=value` overrides, validated before any work starts."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Mapping
from importlib.resources import files
from pathlib import Path
from typing import Any, NoReturn, cast

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from pipeline.cores import cores

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"


def _px(pixels_at_224, _root_) -> int:
    """`${px:96}` in a recipe: a view size given for 224-px ImageNet views, scaled to data.image_size
    (96 -> 96 on ImageNet, 14 on 32-px CIFAR), so multi-crop recipes work on every dataset."""
    return max(1, round(int(pixels_at_224) * int(_root_.data.image_size) / 224))


def _digest(node) -> str:
    """`${digest:${data.generate}}`: a short hash of a config node, so data made with other settings gets a
    folder of its own (conf/data/spirograph.yaml)."""
    value = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node
    return hashlib.sha1(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:8]


if not OmegaConf.has_resolver("px"):
    OmegaConf.register_new_resolver("px", _px)
if not OmegaConf.has_resolver("digest"):
    OmegaConf.register_new_resolver("digest", _digest)


class ConfigError(ValueError):
    """A bad override, an unknown group option, a missing path: reported as one line, before Ray starts."""


class JobError(Exception):
    """A downstream job's bad input, or a run it cannot use: one line for the user (each job has its subclass)."""


def compose_config(overrides: list[str] | None = None, config_name: str = "config") -> dict:
    """Compose conf/<config_name>.yaml with overrides into a plain, fully resolved dict."""
    overrides = list(overrides or [])
    try:
        cores()  # the environment's AUGSSL_CORES, which sizes the jobs' threads: a bad one stops every job here
    except ValueError as e:
        raise ConfigError(str(e)) from None
    for o in overrides:
        if "=" not in o or o.startswith("="):
            raise ConfigError(f"malformed override {o!r}: expected key=value")
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
            cfg = compose(config_name=config_name, overrides=overrides)
        OmegaConf.set_struct(cfg, False)
        _absolute_paths(cfg)
        out = cast(dict, OmegaConf.to_container(cfg, resolve=True))  # a composed config is a mapping
    except (HydraException, OmegaConfBaseException) as e:
        raise ConfigError(_one_line(e)) from None
    return out


def config_options(group: str) -> list[str]:
    """The options of a config group on Hydra's search path: conf/<group>/ and an installed package's (its
    SearchPathPlugin; docs/extending.md)."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return sorted(GlobalHydra.instance().config_loader().get_group_options(group))


def config_file(name: str) -> Path:
    """conf/<name>.yaml, or the first `<name>.yaml` on Hydra's search path (an installed package's conf/)."""
    here = CONF_DIR / f"{name}.yaml"
    if here.exists():
        return here
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        elements = GlobalHydra.instance().config_loader().get_search_path().get_path()
    for element in elements:
        scheme, _, where = str(element.path).partition("://")
        folder = Path(where) if scheme == "file" else Path(str(files(where))) if scheme == "pkg" else None
        if folder is not None and (folder / f"{name}.yaml").exists():
            return folder / f"{name}.yaml"
    return here  # missing: the caller's open names it


def _absolute_paths(cfg) -> None:
    # Resolve the root once so every derived path is absolute (Ray workers run elsewhere).
    if "paths" not in cfg:
        return
    root = cfg.paths.root
    if "://" not in str(root):
        cfg.paths.root = str(Path(os.path.expanduser(str(root))).resolve())


def _one_line(e: Exception) -> str:
    msg = str(e).strip().splitlines()
    return msg[0] if msg else type(e).__name__


# Keys that change how a run goes, not what it trains: they do not change its identity, so a run can be resumed
# with torch.compile turned on (the backbones' or the views'), or with bad shards skipped.
EXECUTION_KEYS = (("train", "channels_last"), ("train", "compile"), ("augment", "fuse"), ("data", "on_bad_shard"))
# A plug-in's notes about itself rather than settings: the frameworks its paper defines it on (a notice, never a
# change to what trains), so widening that list renames no run.
PLUGIN_NOTE_KEYS = ("defined_on",)


def config_hash(
    cfg: dict, ignore: tuple[str, ...] = ("trainer", "tracking", "run", "eval", "debug", "paths", "gallery", "verbose")
) -> str:
    """A short hash of what determines the trained weights: same command, same run (and resume). Top-level groups
    in `ignore`, the EXECUTION_KEYS and the plug-ins' PLUGIN_NOTE_KEYS do not count. A path under paths.root counts
    as the part below it, so that the place of a checkout or working folder does not rename its runs (the
    reproductions' ledger, committed with the report, names runs made in another folder); a path elsewhere, a
    paths.data set outside the root included, counts whole: other data there is another run."""
    kept = {k: dict(v) if isinstance(v, dict) else v for k, v in cfg.items() if k not in ignore}
    for group, key in EXECUTION_KEYS:
        if isinstance(kept.get(group), dict):
            kept[group].pop(key, None)
    if isinstance(kept.get("plugin"), dict):
        kept["plugin"] = {
            name: {k: v for k, v in s.items() if k not in PLUGIN_NOTE_KEYS} if isinstance(s, dict) else s
            for name, s in kept["plugin"].items()
        }
    paths = cfg.get("paths")
    root = paths.get("root") if isinstance(paths, Mapping) else None
    if root and os.path.isabs(str(root)) and os.path.normpath(str(root)) != "/":
        kept = _below(kept, os.path.normpath(str(root)))
    return hashlib.sha1(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()[:10]


def _below(value: Any, root: str) -> Any:
    """`value` with every string that is a path under `root` (absolute, normalised) written as ${paths.root} and the
    normalised part below it."""
    if isinstance(value, Mapping):
        return {k: _below(v, root) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_below(v, root) for v in value]
    if isinstance(value, str) and value.startswith(root):
        path = os.path.normpath(value)
        if path == root or path.startswith(root + "/"):
            return "${paths.root}" + path[len(root) :]
    return value


def to_yaml(data: dict) -> str:
    """A mapping (a config, a sweep's best values) as YAML."""
    return OmegaConf.to_yaml(OmegaConf.create(data))


def _default_groups(config_name: str) -> list[str]:
    """The groups conf/<config_name>.yaml's defaults list picks from."""
    conf = cast(DictConfig, OmegaConf.load(config_file(config_name)))  # a config file is a mapping
    defaults = conf.get("defaults") or []
    groups = []
    for entry in defaults:
        if OmegaConf.is_dict(entry):
            groups += [str(k).split("@")[0].removeprefix("override ").lstrip("/") for k in entry]
    return groups


def config_groups(config_name: str = "config") -> tuple[list[str], list[str]]:
    """(groups, presets) a config takes: the groups its defaults list picks from (`group=option`), and, for the
    training config, the other groups of conf/ whose options apply on top of the whole config (`+group=option`;
    a group another job's config picks from, like detect/, is that job's, not a preset).
    A config without a defaults list (conf/shards.yaml, conf/reproductions.yaml) takes neither."""
    groups = _default_groups(config_name)
    if not groups or config_name != "config":  # presets (+experiment=, +sweep=) apply to the training config only
        return groups, []
    others = {g for f in CONF_DIR.glob("*.yaml") if f.stem != config_name for g in _default_groups(f.stem)}
    presets = sorted(p.name for p in CONF_DIR.iterdir() if p.is_dir() and p.name not in groups + sorted(others))
    return groups, presets


def cli(argv: list[str], description: str, config_name: str = "config") -> dict:
    """Parse a job's command line: `--help`, or key=value overrides. Exits with one line on bad input."""
    if any(a in ("-h", "--help") for a in argv):
        print(description.strip())
        print(f"\nusage: python {Path(sys.argv[0]).name} [key=value ...]\n")
        groups, presets = config_groups(config_name)
        if groups:
            print("Config groups (pick with group=option):")
            for group in groups:
                print(f"  {group}: {', '.join(config_options(group))}")
        if presets:
            print("\nPresets (add with +group=option; each sets several keys, overridable after it):")
            for group in presets:
                print(f"  +{group}: {', '.join(config_options(group))}")
        if not groups:  # a job's own keys: the file itself, with its comments (??? = required)
            print("Keys (key=value; ??? = required) and their defaults:\n")
            print(config_file(config_name).read_text())
            raise SystemExit(0)
        print("\nDefault config:\n")
        try:
            print(to_yaml(compose_config([], config_name)))
        except ConfigError:  # mandatory values (???) left for the command line
            print(config_file(config_name).read_text())
        raise SystemExit(0)
    try:
        return compose_config(argv, config_name)
    except ConfigError as e:
        fail(str(e))


def fail(message: str) -> NoReturn:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)
