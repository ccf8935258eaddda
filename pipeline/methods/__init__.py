"""Method registry: `method.kind` in the config picks the class (pipeline.build makes it). The project's own are
listed here; an installed package adds its own under the `augssl.methods` entry-point group (pipeline.registry,
docs/extending.md). Importing this package imports no method, nor torch."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.registry import Registry

if TYPE_CHECKING:
    from pipeline.methods.base import Method

METHODS: Registry[Method] = Registry(
    "augssl.methods",
    {
        "moco": "pipeline.methods.moco:MoCo",
        "mocov3": "pipeline.methods.mocov3:MoCoV3",
        "simclr": "pipeline.methods.simclr:SimCLR",
        "byol": "pipeline.methods.byol:BYOL",
        "simsiam": "pipeline.methods.simsiam:SimSiam",
        "supcon": "pipeline.methods.supcon:SupCon",
        "dino": "pipeline.methods.dino:DINO",
    },
)
