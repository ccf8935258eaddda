"""What a generated dataset is: made on first use into the managed data folder (<paths.data>/<name>-<digest of
data.generate>/{train,val}) from its `data.generate` settings, which its manifests record, so that data made with
other settings is refused, never reused. The project's own (Spirograph, Photos) are registered in
pipeline/data/__init__.py; an installed package adds its own under the `augssl.datasets` entry-point group
(docs/extending.md). Shards of files (CIFAR, ImageFolder) come from jobs/make_shards.py and need no entry."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from pydantic import ConfigDict

from pipeline.fields import Int, Section


class Generate(Section):
    """data.generate: how many samples each split has, their size and seed, and samples per shard. No other keys:
    each one goes to the generator (a misspelt one would be dropped or break it)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    n_train: Int(1)
    n_val: Int(1)
    size: Int(8)
    seed: Int(0)
    maxcount: Int(1)


class GeneratedDataset:
    """A dataset its generator makes. Its module must load without torch: the schema checks `data.generate`
    against its Settings before torch is imported (a generator imports torch when it draws samples)."""

    Settings: ClassVar[type[Section]] = Generate  # data.generate's keys; a subclass may add its own

    def make_splits(self, root: Path, generate: dict, progress: bool = True) -> dict[str, dict]:
        """Write root/train and root/val as shards whose manifests record `generate` (n_<split> and the other
        keys, extra={"generate": ...} to write_split); returns the manifests."""
        raise NotImplementedError

    def generated_with(self, manifest: dict, split: str) -> dict | None:
        """The data.generate settings that made a split, from its manifest; None when this version of the
        generator did not make it (its data must not be taken for this dataset's)."""
        made = manifest.get("generate")
        return made if isinstance(made, dict) else None
