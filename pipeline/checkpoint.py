"""Checkpoint files: one `state.pt` with the method (DDP wrapper stripped), optimiser and progress.

Epochs: `state["epoch"]`, like the `epoch` metric the loop reports to Ray Train, is the 0-based index of the
last completed epoch (training resumes at index epoch + 1). MLflow's per-epoch metrics (train/epoch_loss, knn/*)
are logged at the optimiser step, not the epoch. Everything printed counts epochs from 1: the state of
index 0 is "epoch 1/N"."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import torch
from torch import nn

STATE_FILE = "state.pt"


def method_state(method: nn.Module) -> dict:
    """The method's state dict with DDP's `module.` level removed, so 1-worker and N-worker runs load alike."""
    return {k.replace("online.module.", "online."): v for k, v in method.state_dict().items()}


def load_method_state(method: nn.Module, state: dict) -> None:
    wrapped = any(k.startswith("online.module.") for k in method.state_dict())
    if wrapped:
        state = {
            (k.replace("online.", "online.module.", 1) if k.startswith("online.") else k): v for k, v in state.items()
        }
    method.load_state_dict(state)


def save(
    directory: str | Path,
    method: nn.Module,
    optimizer,
    epoch: int,
    step: int,
    config: Mapping[str, Any],
    plan: dict | None = None,
    plugin_optimizers: dict | None = None,
) -> Path:
    """Write to a temporary name and rename, so an interrupted save never leaves a truncated state.pt. `config`: the
    run's whole config, recorded as it is (a reader rebuilds the model from it: pipeline.eval.source); `plan`: the
    run's plan (pipeline.plan.RunPlan.as_dict), its MLflow run among it; `plugin_optimizers`: the state of the
    plug-ins' own optimisers (pipeline.train.plugin_optim)."""
    path = Path(directory) / STATE_FILE
    tmp = path.with_suffix(".tmp")
    state = {"method": method_state(method), "optimizer": optimizer.state_dict(), "epoch": epoch, "step": step}
    if plugin_optimizers:
        state["plugin_optimizers"] = plugin_optimizers
    torch.save({**state, "cfg": dict(config), "plan": plan}, tmp)
    tmp.replace(path)
    return path


def load(directory: str | Path) -> dict:
    return torch.load(Path(directory) / STATE_FILE, map_location="cpu", weights_only=False)


def state_to_resume(registered, run_dir: str | Path) -> dict | None:
    """The state a restarted worker resumes from: Ray Train's registered checkpoint (`registered`, a
    ray.train.Checkpoint or None), or a newer complete one on disk that Ray has not registered yet (newest_on_disk)."""
    state = None
    if registered:
        with registered.as_directory() as d:
            state = load(d)
    on_disk = newest_on_disk(run_dir, registered.path if registered else None)
    if on_disk and (state is None or on_disk["epoch"] > state["epoch"]):
        state = on_disk
    return state


def newest_on_disk(run_dir: str | Path, registered: str | None = None) -> dict | None:
    """The newest loadable state under a Ray run folder (checkpoint_*/state.pt), local or on a pyarrow URI
    (s3://, gs://, file://), or None; None too when the newest is `registered` (the folder of the checkpoint Ray
    restored, already loaded: it is not read twice).

    Ray registers a checkpoint only once the controller has processed the worker's report, so an interrupt
    (Ctrl-C, a killed driver) can leave newer, complete checkpoints in storage that Ray's own restore would
    skip. A file cut short by the interrupt fails to load and the next newest one is taken."""
    import io

    from pyarrow import fs as pafs

    if "://" in str(run_dir):
        filesystem, folder = pafs.FileSystem.from_uri(str(run_dir))
    else:
        filesystem, folder = pafs.LocalFileSystem(), str(Path(run_dir).resolve())
    if filesystem.get_file_info(folder).type != pafs.FileType.Directory:
        return None
    found = filesystem.get_file_info(pafs.FileSelector(folder, recursive=False))
    states = [f"{d.path}/{STATE_FILE}" for d in found if d.base_name.startswith("checkpoint_")]
    infos = [i for i in filesystem.get_file_info(states) if i.type == pafs.FileType.File]
    # newest first: by modification time where the store keeps one, else by name (Ray's names carry the time)
    if registered is not None and "://" not in str(run_dir):
        registered = str(Path(registered).resolve())
    for info in sorted(infos, key=lambda i: (i.mtime_ns or 0, i.path), reverse=True):
        if registered is not None and info.path.rsplit("/", 1)[0] == registered.rstrip("/"):
            return None  # Ray's own is the newest complete one
        try:
            with filesystem.open_input_stream(info.path) as f:
                return torch.load(io.BytesIO(f.read()), map_location="cpu", weights_only=False)
        except Exception:  # a truncated copy: fall back to the one before it
            continue
    return None


def backbone_state(state: dict) -> dict:
    """The online backbone's weights from a checkpoint state: what linear probes and detection load."""
    prefix = "online.backbone."
    return {k[len(prefix) :]: v for k, v in state["method"].items() if k.startswith(prefix)}
