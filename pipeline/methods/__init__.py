"""Method registry: `method.kind` in the config picks the class (pipeline.build makes it)."""

from __future__ import annotations

from pipeline.methods.base import Method
from pipeline.methods.byol import BYOL
from pipeline.methods.dino import DINO
from pipeline.methods.moco import MoCo
from pipeline.methods.mocov3 import MoCoV3
from pipeline.methods.simclr import SimCLR
from pipeline.methods.simsiam import SimSiam
from pipeline.methods.supcon import SupCon

METHODS: dict[str, type[Method]] = {
    "moco": MoCo,
    "mocov3": MoCoV3,
    "simclr": SimCLR,
    "byol": BYOL,
    "simsiam": SimSiam,
    "supcon": SupCon,
    "dino": DINO,
}
