"""What a pretraining run reads of its config, typed, and taken once where the job hands it over (pipeline.train.launch
.pretrain, after the config is checked and completed): the driver's launch and artifacts and every Train worker's
loop (pipeline.train.loop) read nothing else."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from pipeline.eval.probe.spec import ProbeSpec
from pipeline.fields import Checked
from pipeline.methods.settings import MethodSettings
from pipeline.sections import Config, Data, Debug, Gallery, Knn, Model, Optim, Tracking, Train, Trainer
from pipeline.store import Store


@dataclass(frozen=True)
class PretrainSpec:
    name: str  # run.name: the run's MLflow name, its Ray Train folder and its checkpoint's
    seed: int
    verbose: bool
    runs: Path  # paths.runs: the checkpoint's local copy, the curves and the gallery
    store: Store
    model: Model
    train: Train
    trainer: Trainer
    tracking: Tracking
    knn: Knn  # eval.knn: the online kNN monitor (every=0: off)
    data: Data
    gallery: Gallery
    debug: Debug
    method: MethodSettings  # the keys every method shares (the method's own: its Settings, in build_method)
    optim: Optim
    # the recipe's section as the config has it: its keys are the recipe's own, checked by it (the view makers)
    augment: Mapping[str, Any]
    probe: ProbeSpec | None  # the probe after pretraining (eval.probe.after_pretrain), or None
    # The whole config: what the method and its plug-ins are built from (pipeline.build.build_method), and what
    # the checkpoint and the MLflow run record so that a reader rebuilds the same model.
    config: dict[str, Any]

    @classmethod
    def of(cls, c: Checked[Config]) -> PretrainSpec:
        """The spec of a checked and completed config (pipeline.train.prepare.resolve has run, and named the run)."""
        t, cfg = c.typed, c.raw
        return cls(
            name=str(t.run.name),
            seed=t.seed,
            verbose=t.verbose,
            runs=Path(t.paths.runs),
            store=Store.of(cfg),
            model=t.model,
            train=t.train,
            trainer=t.trainer,
            tracking=t.tracking,
            knn=t.eval.knn,
            data=t.data,
            gallery=t.gallery,
            debug=t.debug,
            method=t.method,
            optim=t.optim,
            augment=cfg["augment"],
            probe=ProbeSpec.of(c) if t.eval.probe.after_pretrain else None,
            config=cfg,
        )

    @property
    def gallery_path(self) -> Path:
        return gallery_path(self.gallery.out, self.runs, self.augment["name"], self.data.name)

    @property
    def checkpoint_dir(self) -> Path:
        """The local copy of the run's last checkpoint (and what a probe of the run loads)."""
        return self.runs / "checkpoints" / self.name


def gallery_path(out: str | None, runs: str | Path, recipe: str, data: str) -> Path:
    """Where the views gallery is written: gallery.out, else <paths.runs>/gallery/<recipe>-<data>.png."""
    return Path(out) if out else Path(runs) / "gallery" / f"{recipe}-{data}.png"
