"""Dataset registry: the datasets generated on first use, which `data.name` picks (pipeline.train.prepare makes them
into the managed data folder). The project's own are the classes here that set `name`; an installed package adds its
own under the `augssl.datasets` entry-point group (pipeline.registry, docs/extending.md). Importing this package
imports none."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.registry import Registry, declared

if TYPE_CHECKING:
    from pipeline.data.generated import GeneratedDataset

DATASETS: Registry[GeneratedDataset] = Registry(
    "augssl.datasets", declared(("pipeline.data",), "name", "GeneratedDataset")
)
