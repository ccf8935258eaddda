"""Disk space: what a run's checkpoints need, checked before it starts, and a full disk said in one line.

A pretraining run writes, on the filesystems of `trainer.storage` (Ray Train's checkpoints, `num_to_keep` = 2 of
them plus the one being written) and `paths.runs` (the MLflow store and artifacts, the final checkpoint's local
copy and its artifact, the exported backbone): about 6 checkpoints in all where both are one local disk. One
checkpoint is the method's state (online and momentum networks, queues) and the optimiser's, known from the model
before a step is taken. The preflight refuses a run whose first two checkpoints do not fit, and warns when the
whole run may not. When a write meets ENOSPC anyway (another process filled the disk), the job says which folder is
full, what it was writing and how much that needed, in one line.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path
from typing import Any, Callable, Mapping

from pipeline.config import ConfigError

KEPT = 2  # Ray Train's CheckpointConfig(num_to_keep=2): launch.build_trainer
FULL_TEXTS = ("No space left on device", "database or disk is full", "Disk quota exceeded", "[Errno 28]")
OPTIMISER_COPIES = {"sgd": 1, "lars": 1, "adamw": 2}  # per trainable parameter: momentum; Adam's two moments


class DiskFull(RuntimeError):
    """A write met a full disk: one line naming the folder, what was written and what it needed."""


def mb(n: float) -> str:
    return f"{n / 2**20:.1f} MB"


def is_disk_full(exc: BaseException) -> bool:
    """ENOSPC anywhere in the exception's chain, or its text (Ray Train passes a worker's error on as text)."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if any(t in str(e) for t in FULL_TEXTS):
            return True
        e = e.__cause__ or e.__context__
    return False


def local_folder(path: str | os.PathLike) -> Path | None:
    """The nearest existing folder of a local path (None for s3://, gs://, ...): what free space is asked of."""
    if "://" in str(path):
        return None
    p = Path(path).resolve()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def free_bytes(path: str | os.PathLike) -> int:
    folder = local_folder(path)
    return shutil.disk_usage(folder).free if folder else 2**62


def checkpoint_bytes(cfg: Mapping[str, Any], build: Callable[[dict], Any] | None = None) -> int:
    """One checkpoint's size, from the model the config builds: every tensor of the method's state (networks,
    momentum copies, BN statistics, queues) plus the optimiser's state per trainable parameter."""
    import torch

    from pipeline.build import build_method

    make = build or build_method
    try:
        with torch.device("meta"):  # shapes only: nothing allocated, nothing initialised
            method = make(dict(cfg))
    except (NotImplementedError, RuntimeError):  # a component that copies data while it builds: on the CPU
        method = make(dict(cfg))
    state = sum(t.numel() * t.element_size() for t in method.state_dict().values())
    trainable = sum(p.numel() * p.element_size() for p in method.parameters() if p.requires_grad)
    copies = OPTIMISER_COPIES.get(str((cfg.get("optim") or {}).get("name", "sgd")), 2)
    return int(state + copies * trainable)


def check_space(storage: str, runs: str, ckpt: int, warn: Callable[[str], None] = print) -> None:
    """ConfigError in one line where the first two checkpoints cannot fit; a warning where the whole run may not."""
    needs: dict[int, list] = {}  # device -> [folder, first, whole]
    for folder, first, whole in ((storage, KEPT * ckpt, (KEPT + 1) * ckpt), (runs, 0, 3 * ckpt)):
        local = local_folder(folder)
        if local is None:
            continue
        key = os.stat(local).st_dev
        entry = needs.setdefault(key, [local, 0, 0])
        entry[1] += first
        entry[2] += whole
    for local, first, whole in needs.values():
        free = shutil.disk_usage(local).free
        if free < first:
            raise ConfigError(
                f"disk full ahead: {local} has {mb(free)} free and this run's first two checkpoints need "
                f"{mb(first)} ({mb(ckpt)} each: model, momentum copies, queues and optimiser); free space, or set "
                "paths.runs / trainer.storage to a larger disk"
            )
        if free < whole:
            warn(
                f"[space] {local} has {mb(free)} free; the whole run may write {mb(whole)} (checkpoints of "
                f"{mb(ckpt)}, the final copy and its artifact): it may fill before the end"
            )


def full_disk_line(exc: BaseException, folders: Mapping[str, str], ckpt: int) -> str:
    """The one line for a write that met a full disk: the fullest of the run's local `folders` (name -> path),
    what was being written there (from the error) and what it needed."""
    text = str(exc)
    if "database or disk is full" in text:
        what = "the MLflow store"
        need = "a few kB"
    elif "checkpoint" in text.lower() or "pyarrow" in text.lower() or "state.pt" in text:
        what, need = "a checkpoint", f"~{mb(ckpt)}"
    else:
        what, need = "the run's files", f"~{mb(ckpt)} for the next checkpoint"
    local = {name: local_folder(path) for name, path in folders.items()}
    free = {name: shutil.disk_usage(p).free for name, p in local.items() if p is not None}
    name = min(free, key=lambda k: free[k]) if free else next(iter(folders))
    return (
        f"disk full at {local.get(name) or folders[name]} ({name}): {mb(free.get(name, 0))} free while writing "
        f"{what}, which needed {need}; free space and rerun the same command: it resumes from the last complete "
        "checkpoint"
    )
