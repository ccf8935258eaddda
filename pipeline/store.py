"""Where a job's MLflow runs go, typed: taken once from the config's tracking.* and paths.runs where a job starts.
pipeline.tracking and the downstream jobs' run helpers read nothing else of the config."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Store:
    runs: str  # paths.runs: the default SQLite store and its artifacts live there
    experiment: str  # tracking.experiment
    uri: str | None = None  # tracking.uri; None: $MLFLOW_TRACKING_URI, else <runs>/mlflow.db
    verbose: bool = False  # MLflow's own set-up lines and download bars are shown

    @classmethod
    def of(cls, cfg: dict) -> Store:
        """The store of a job's config (any job's: each has tracking.* and paths.runs)."""
        t = cfg["tracking"]
        return cls(str(cfg["paths"]["runs"]), t["experiment"], t.get("uri"), bool(cfg.get("verbose")))

    @property
    def given_uri(self) -> str | None:
        """tracking.uri, else $MLFLOW_TRACKING_URI: a store named outside the runs folder, or None."""
        return self.uri or os.environ.get("MLFLOW_TRACKING_URI") or None

    def server(self) -> str | None:
        """The tracking server the job will log to (http:// or https://), or None for a local store."""
        uri = self.given_uri or ""
        return uri if uri.startswith(("http://", "https://")) else None

    @property
    def local_db(self) -> Path:
        return Path(self.runs) / "mlflow.db"
