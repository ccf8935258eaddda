"""The run plan: what a pretraining run derives from its config and its data once, before Ray starts, and every
consumer reads (the driver, each Train worker, the checkpoint, the reports). Frozen: nothing changes it after it is
made; the MLflow run it logs into is added by `opened`, which makes a new plan."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Mapping

from pipeline.schedules import scaled_lr


@dataclass(frozen=True)
class RunPlan:
    workers: int
    batch_size: int  # the global batch; each worker trains on `local_batch` of it
    num_train_samples: int  # after any bad shards left out (data.on_bad_shard=skip)
    epochs: int
    warmup_epochs: int
    lr: float  # optim.base_lr scaled to the global batch (schedules.scaled_lr)
    # known once the run's MLflow run is open (`opened`)
    mlflow_run_id: str | None = None
    tracking_uri: str | None = None
    trial: str | None = None  # a sweep trial's label; None for a job of its own
    console_is_tty: bool = True  # a terminal gets progress bars; a file (ray job logs, CI) plain lines

    @property
    def local_batch(self) -> int:
        return self.batch_size // self.workers

    @property
    def steps_per_epoch(self) -> int:
        """Each worker reads its 1/workers of the samples in whole local batches."""
        return (self.num_train_samples // self.workers) // self.local_batch

    @property
    def total_steps(self) -> int:
        return self.steps_per_epoch * self.epochs

    @property
    def warmup_steps(self) -> int:
        return self.steps_per_epoch * self.warmup_epochs

    @property
    def images_per_epoch(self) -> int:
        return self.steps_per_epoch * self.local_batch * self.workers

    def opened(self, mlflow_run_id: str, tracking_uri: str, trial: str | None, console_is_tty: bool) -> RunPlan:
        return replace(
            self, mlflow_run_id=mlflow_run_id, tracking_uri=tracking_uri, trial=trial, console_is_tty=console_is_tty
        )

    def as_dict(self) -> dict:
        """What a checkpoint records (plain types), derived values included for a reader's convenience."""
        return {**asdict(self), "local_batch": self.local_batch, "steps_per_epoch": self.steps_per_epoch}

    @classmethod
    def from_dict(cls, d: dict) -> RunPlan:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


def make_plan(train: Mapping[str, Any], optim: Mapping[str, Any], workers: int, num_train_samples: int) -> RunPlan:
    """The plan of a checked config's train and optim sections on `workers` Train workers."""
    return RunPlan(
        workers=workers,
        batch_size=train["batch_size"],
        num_train_samples=num_train_samples,
        epochs=train["epochs"],
        warmup_epochs=optim["warmup_epochs"],
        lr=scaled_lr(optim["base_lr"], train["batch_size"]),
    )


def run_id_of(state: dict) -> str | None:
    """The MLflow run a checkpoint's state was trained in: its plan's, or, in checkpoints written before the plan
    existed, the config's `runtime` entry."""
    plan = state.get("plan") or (state.get("cfg") or {}).get("runtime") or {}
    return plan.get("mlflow_run_id")
