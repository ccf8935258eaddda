"""One process at a time per run: an exclusive lock beside the run's checkpoints, held for the job's lifetime and
taken before Ray or MLflow is touched, so two identical commands never share a run by accident."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import sys
import time
from pathlib import Path


class RunBusy(RuntimeError):
    """Another live process holds the run's lock: reported as one line, before Ray or MLflow is touched."""


def lock_path(runs: str | Path, name: str) -> Path | None:
    """<paths.runs>/locks/<run name>.lock, beside the run's checkpoints; None where paths.runs is remote."""
    return None if "://" in str(runs) else Path(runs) / "locks" / f"{name}.lock"


@contextlib.contextmanager
def run_lock(runs: str | Path, name: str):
    """Hold the run's lock for the job's lifetime, or raise RunBusy naming the holder (pid, host, since when).

    An exclusive flock on the lock file: the kernel drops it when the holder exits however it exits, so a
    lock left by a killed job never blocks. The file records the holder for the message and stays behind.
    `runs`: paths.runs; `name`: run.name."""
    path = lock_path(runs, name)
    if path is None:
        yield None
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by Ray's processes (O_CLOEXEC)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunBusy(_holder_message(name, path)) from None
        holder = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time(), "command": " ".join(sys.argv)}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(holder).encode(), 0)
        _reserve(path.with_suffix(".status"))
        yield path
    finally:
        os.close(fd)  # releases the lock


STATUS_BYTES = 4096  # a job's last words, written over space reserved when it started


def _reserve(path: Path) -> None:
    """Make the run's status file STATUS_BYTES long, so that a failure can be written into it on a full disk."""
    try:
        if not path.exists() or path.stat().st_size < STATUS_BYTES:
            path.write_bytes(b" " * STATUS_BYTES)
    except OSError:  # a disk already full: nothing reserved, the failure will be said on the console only
        pass


def record_end(runs: str | Path, name: str, text: str) -> None:
    """Write how the job ended into the space reserved for it (in place: no new block is needed on a full disk);
    "" clears it. The MLflow store may be the thing that cannot be written: the next start reads this."""
    path = lock_path(runs, name)
    if path is None:
        return
    try:
        with path.with_suffix(".status").open("r+b") as f:
            f.write(text.encode()[: STATUS_BYTES - 1].ljust(STATUS_BYTES, b" "))
    except OSError:
        pass


def last_end(runs: str | Path, name: str) -> str:
    """What record_end last wrote for the run ("" if nothing)."""
    path = lock_path(runs, name)
    try:
        return path.with_suffix(".status").read_text().strip() if path else ""
    except OSError:
        return ""


def _holder_message(name: str, path: Path) -> str:
    holder: dict = {}
    for _ in range(20):  # the holder writes its details just after it takes the lock
        try:
            holder = json.loads(path.read_text() or "{}")
        except (OSError, ValueError):
            holder = {}
        if holder:
            break
        time.sleep(0.05)
    if not holder:
        return f"run {name} is already running (lock {path}); wait for it to finish or stop it, then rerun"
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder["since"]))
    ago = time.time() - holder["since"]
    ago_text = f"{ago / 60:.0f} min ago" if ago >= 60 else f"{ago:.0f} s ago"
    return (
        f"run {name} is already running: pid {holder['pid']} on {holder['host']} since {since} ({ago_text}); "
        f"wait for it to finish, or stop it (kill {holder['pid']}) and rerun the same command to resume"
    )
