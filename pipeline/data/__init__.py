"""Dataset registry: the datasets generated on first use, which `data.name` picks (pipeline.train.prepare makes them
into the managed data folder). The project's own are listed below; an installed package adds its own under the
`augssl.datasets` entry-point group, in the same form (pipeline.registry, docs/extending.md). Importing this package
imports none."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.registry import Registry

if TYPE_CHECKING:
    from pipeline.data.generated import GeneratedDataset

# name -> "module:Class", the form an installed package's entry points take
DATASETS: Registry[GeneratedDataset] = Registry(
    "augssl.datasets",
    {"photos": "pipeline.data.photos:Photos", "spirograph": "pipeline.data.spirograph_shards:Spirograph"},
)
