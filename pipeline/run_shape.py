"""What a method's or plug-in's own checks may read of the run beyond their own settings: the workers, the batch,
the recipe, torch.compile. Typed, made once from the config where the components are checked (pipeline.build), so
that a component's `check` and `complete` see this and their `Settings`, never the config. Imports no torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:
    from pipeline.fields import Checked
    from pipeline.sections import Config


@dataclass(frozen=True)
class RunShape:
    workers: int  # trainer.num_workers
    batch_size: int  # train.batch_size, the global batch
    compile: bool  # train.compile
    augment: Mapping[str, Any]  # the recipe as the config has it (its keys are its own)

    @property
    def local_batch(self) -> int:
        """Each worker's share of the batch (the schema has checked that it splits evenly)."""
        return self.batch_size // self.workers

    @classmethod
    def of(cls, c: Checked[Config]) -> RunShape:
        return cls(
            workers=c.typed.trainer.num_workers,
            batch_size=c.typed.train.batch_size,
            compile=c.typed.train.compile,
            augment=c.raw["augment"],
        )
