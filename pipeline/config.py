"""Config: Hydra composition of conf/ with `key=value` overrides, validated before any work starts."""
from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"


def _px(pixels_at_224, _root_) -> int:
    """`${px:96}` in a recipe: a view size given for 224-px ImageNet views, scaled to data.image_size
    (96 -> 96 on ImageNet, 14 on 32-px CIFAR), so multi-crop recipes work on every dataset."""
    return max(1, round(int(pixels_at_224) * int(_root_.data.image_size) / 224))


if not OmegaConf.has_resolver("px"):
    OmegaConf.register_new_resolver("px", _px)


class ConfigError(ValueError):
    """A bad override, an unknown group option, a missing path: reported as one line, before Ray starts."""


def compose_config(overrides: list[str] | None = None, config_name: str = "config") -> dict:
    """Compose conf/<config_name>.yaml with overrides into a plain, fully resolved dict."""
    overrides = list(overrides or [])
    for o in overrides:
        if "=" not in o or o.startswith("="):
            raise ConfigError(f"malformed override {o!r}: expected key=value")
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
            cfg = compose(config_name=config_name, overrides=overrides)
        OmegaConf.set_struct(cfg, False)
        _absolute_paths(cfg)
        out = OmegaConf.to_container(cfg, resolve=True)
    except (HydraException, OmegaConfBaseException) as e:
        raise ConfigError(_one_line(e)) from None
    return out


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


SPEED_KEYS = ("channels_last", "compile")  # train.* keys that change how fast, not what is trained


def config_hash(cfg: dict, ignore: tuple[str, ...] = ("trainer", "tracking", "run", "eval", "debug", "paths",
                                                          "gallery")) -> str:
    """A short hash of what determines the trained weights: same command, same run (and resume). Settings that
    change only speed (SPEED_KEYS) do not count, so a run can be resumed with torch.compile turned on."""
    kept = {k: v for k, v in cfg.items() if k not in ignore}
    if "train" in kept:
        kept["train"] = {k: v for k, v in kept["train"].items() if k not in SPEED_KEYS}
    return hashlib.sha1(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()[:10]


def to_yaml(cfg: dict) -> str:
    return OmegaConf.to_yaml(OmegaConf.create(cfg))


def cli(argv: list[str], description: str, config_name: str = "config") -> dict:
    """Parse a job's command line: `--help`, or key=value overrides. Exits with one line on bad input."""
    if any(a in ("-h", "--help") for a in argv):
        print(description.strip())
        print(f"\nusage: python {Path(sys.argv[0]).name} [key=value ...]\n")
        print("Config groups (pick with group=option):")
        for group in sorted(p for p in CONF_DIR.iterdir() if p.is_dir()):
            options = sorted(f.stem for f in group.glob("*.yaml"))
            print(f"  {group.name}: {', '.join(options)}")
        print("\nDefault config:\n")
        try:
            print(to_yaml(compose_config([], config_name)))
        except ConfigError:  # mandatory values (???) left for the command line
            print((CONF_DIR / f"{config_name}.yaml").read_text())
        raise SystemExit(0)
    try:
        return compose_config(argv, config_name)
    except ConfigError as e:
        fail(str(e))


def fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)
