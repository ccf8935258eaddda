"""What a method's or plug-in's own checks may read of the run beyond their own settings: the workers, the batch,
the recipe, torch.compile. Typed, made once from the config where the components are checked (pipeline.build), so
that a component's `check` and `complete` see this and their `Settings`, never the config. Imports no torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping


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
    def of(cls, cfg: dict) -> RunShape:
        return cls(
            workers=int(cfg["trainer"]["num_workers"]),
            batch_size=int(cfg["train"]["batch_size"]),
            compile=bool(cfg["train"].get("compile")),
            augment=cfg.get("augment") or {},
        )
