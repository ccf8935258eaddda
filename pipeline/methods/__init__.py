"""Method registry: `method.kind` in the config picks the class (pipeline.build makes it). The project's own are listed
below, one line each; an installed package adds its own under the `augssl.methods` entry-point group, in the same
name = "module:Class" form (docs/extending.md). Importing this package
imports no method, nor torch."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.registry import Registry

if TYPE_CHECKING:
    from pipeline.methods.base import Method

# name -> "module:Class", the form an installed package's entry points take: one line here per method of the project's
METHODS: Registry[Method] = Registry(
    "augssl.methods",
    {
        "barlowtwins": "pipeline.methods.barlowtwins:BarlowTwins",
        "byol": "pipeline.methods.byol:BYOL",
        "dino": "pipeline.methods.dino:DINO",
        "moco": "pipeline.methods.moco:MoCo",
        "mocov3": "pipeline.methods.mocov3:MoCoV3",
        "simclr": "pipeline.methods.simclr:SimCLR",
        "simsiam": "pipeline.methods.simsiam:SimSiam",
        "supcon": "pipeline.methods.supcon:SupCon",
        "vicreg": "pipeline.methods.vicreg:VICReg",
    },
)
