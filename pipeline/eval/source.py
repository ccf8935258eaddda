"""The pretraining run a downstream job starts from: an MLflow run id, or a checkpoint folder or state.pt file
written by jobs/pretrain.py, read once into its weights, the config it trained with and its MLflow run."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import torch

from pipeline import checkpoint as ck
from pipeline.plan import run_id_of


@dataclass
class Source:
    state: dict  # the checkpoint (backbone weights under the method's keys, the run's config)
    cfg: dict  # the config the run trained with
    run_id: str | None  # its MLflow run in this store (None: a checkpoint from elsewhere)
    ref: str  # where it came from: runs:/<id>/checkpoint/state.pt or an absolute path

    @property
    def backbone(self) -> dict:
        """The backbone's state dict in torchvision's ResNet names (no fc)."""
        return ck.backbone_state(self.state)


def load_source(ref: str) -> Source:
    """`ref` as a Source: FileNotFoundError with one line when it is neither a checkpoint nor a logged run.
    The caller has pointed MLflow at the store (tracking.setup)."""
    from mlflow.tracking import MlflowClient

    path = resolve_checkpoint(str(ref))
    if path is not None:
        state = torch.load(path, map_location="cpu", weights_only=False)
        run_id = run_id_of(state)
        try:
            MlflowClient().get_run(run_id) if run_id else None
        except Exception:  # noqa: BLE001 - a checkpoint logged to another MLflow store
            run_id = None
        return Source(state, state["cfg"], run_id, str(path.resolve()))
    with tempfile.TemporaryDirectory(prefix="source-") as tmp:  # the downloads go away with it
        state = download_state(str(ref), tmp)
        cfg = run_config(str(ref), tmp, state)
    return Source(state, cfg, str(ref), f"runs:/{ref}/checkpoint/{ck.STATE_FILE}")


def resolve_checkpoint(ref: str) -> Path | None:
    """A checkpoint folder or state.pt file as the state.pt path; None where `ref` is neither (a run id)."""
    p = Path(ref)
    if p.is_dir() and (p / ck.STATE_FILE).exists():
        return p / ck.STATE_FILE
    if p.is_file():
        return p
    return None


def download_state(run_id: str, dst: str | Path) -> dict:
    """The state.pt a run logged (checkpoint/state.pt), loaded, downloaded into `dst` (a temporary folder the
    caller removes). FileNotFoundError with one line when `run_id` is no run with a checkpoint."""
    import mlflow

    try:
        local = mlflow.artifacts.download_artifacts(
            run_id=run_id, artifact_path=f"checkpoint/{ck.STATE_FILE}", dst_path=str(dst)
        )
    except Exception as e:  # noqa: BLE001 - MLflow raises several types for an unknown id
        raise FileNotFoundError(
            f"checkpoint {run_id!r} is neither a path nor an MLflow run with a checkpoint ({type(e).__name__})"
        ) from None
    return torch.load(local, map_location="cpu", weights_only=False)


def run_config(run_id: str, dst: str | Path, state: dict | None = None) -> dict:
    """The config a run trained with: its config.yaml artifact, else the copy inside its checkpoint state."""
    import mlflow
    from omegaconf import OmegaConf

    try:
        local = mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path="config.yaml", dst_path=str(dst))
    except Exception:  # noqa: BLE001 - an older run without config.yaml
        if state is None:
            raise
        return state["cfg"]
    return cast(dict, OmegaConf.to_container(OmegaConf.load(local), resolve=True))  # config.yaml: a mapping
