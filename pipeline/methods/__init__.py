"""Method registry: `method.name` in the config picks the class."""
from __future__ import annotations

from pipeline.methods.base import Method
from pipeline.methods.moco import MoCo
from pipeline.methods.simclr import SimCLR

METHODS: dict[str, type[Method]] = {"moco": MoCo, "simclr": SimCLR}


def build_method(cfg: dict) -> Method:
    kind = cfg["method"]["kind"]
    if kind not in METHODS:
        raise ValueError(f"unknown method kind {kind!r}; known: {sorted(METHODS)}")
    return METHODS[kind](cfg)
