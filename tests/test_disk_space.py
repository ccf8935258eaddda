"""Disk space: the checkpoint estimate against a real checkpoint, the preflight's refusal and warning, the one
line for a full disk, the failure recorded where a full disk can still take it, and a store that refuses to mark
the run. tests/test_interrupted_runs.py runs the job on a real, small tmpfs."""

from __future__ import annotations

import errno
import io
import sqlite3
from collections import namedtuple

import mlflow
import pytest
import torch

from pipeline import disk_space as ds
from pipeline import tracking
from pipeline.build import build_method, complete_method
from pipeline.config import ConfigError, compose_config
from pipeline.schema import validate
from pipeline.train import run_lock

Usage = namedtuple("Usage", "total used free")
MB = 2**20


def test_a_full_disk_is_seen_through_chains_and_text():
    assert ds.is_disk_full(OSError(errno.ENOSPC, "No space left on device"))
    try:
        try:
            raise OSError(errno.ENOSPC, "write")
        except OSError as inner:
            raise RuntimeError("copying the checkpoint failed") from inner
    except RuntimeError as outer:
        assert ds.is_disk_full(outer)
    assert ds.is_disk_full(sqlite3.OperationalError("database or disk is full"))
    assert ds.is_disk_full(RuntimeError("TrainingFailedError: ... OSError: [Errno 28] No space left on device"))
    assert not ds.is_disk_full(OSError(errno.EACCES, "Permission denied"))
    assert not ds.is_disk_full(ValueError("loss is nan"))


def test_the_checkpoint_estimate_is_a_checkpoint_s_size():
    cfg = compose_config(["data=photos", "trainer.num_workers=1"])
    cfg["method"].update(complete_method(validate(cfg)))
    estimate = ds.checkpoint_bytes(cfg)
    method = build_method(cfg)
    opt = torch.optim.SGD([p for p in method.parameters() if p.requires_grad], lr=0.1, momentum=0.9)
    for p in method.parameters():  # one step's momentum buffers: what every later checkpoint holds
        if p.requires_grad:
            p.grad = torch.zeros_like(p)
    opt.step()
    buf = io.BytesIO()
    torch.save({"method": method.state_dict(), "optimizer": opt.state_dict()}, buf)
    assert abs(estimate - len(buf.getvalue())) < 0.05 * len(buf.getvalue()), (estimate, len(buf.getvalue()))


def test_the_preflight_refuses_what_cannot_hold_two_checkpoints(tmp_path, monkeypatch):
    ckpt = 10 * MB
    free = {"v": 15 * MB}
    monkeypatch.setattr(ds.shutil, "disk_usage", lambda p: Usage(0, 0, free["v"]))
    with pytest.raises(ConfigError) as e:
        ds.check_space(str(tmp_path / "runs" / "ray"), str(tmp_path / "runs"), ckpt)
    line = str(e.value)
    assert "\n" not in line and f"disk full ahead: {tmp_path}" in line
    assert "15.0 MB free" in line and "need 20.0 MB (10.0 MB each" in line
    warned: list[str] = []
    free["v"] = 30 * MB  # two fit, the whole run (3 kept or written + 3 at the end, one disk) may not
    ds.check_space(str(tmp_path / "runs" / "ray"), str(tmp_path / "runs"), ckpt, warn=warned.append)
    assert len(warned) == 1 and "may write 60.0 MB" in warned[0]
    free["v"] = 100 * MB
    ds.check_space(str(tmp_path / "ray"), str(tmp_path / "runs"), ckpt, warn=warned.append)
    ds.check_space("s3://bucket/ray", str(tmp_path / "runs"), ckpt, warn=warned.append)  # remote: not asked
    assert len(warned) == 1


def test_the_full_disk_line_names_the_folder_what_and_how_much(tmp_path, monkeypatch):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.setattr(ds.shutil, "disk_usage", lambda p: Usage(0, 0, 3 * MB if str(p).endswith("b") else 900 * MB))
    err = RuntimeError("pyarrow copy of checkpoint_000002 failed: [Errno 28] No space left on device")
    line = ds.full_disk_line(err, {"trainer.storage": str(tmp_path / "b"), "tmp": str(tmp_path / "a")}, 12 * MB)
    assert line.startswith(f"disk full at {tmp_path / 'b'} (trainer.storage): 3.0 MB free while writing a checkpoint")
    assert "needed ~12.0 MB" in line and "rerun the same command" in line and "\n" not in line
    store = ds.full_disk_line(sqlite3.OperationalError("database or disk is full"), {"paths.runs": str(tmp_path)}, 1)
    assert "while writing the MLflow store" in store


def test_a_failure_is_kept_beside_the_lock_and_read_at_the_next_start(tmp_path):
    with run_lock.run_lock(tmp_path, "r1"):
        status = tmp_path / "locks" / "r1.status"
        assert status.stat().st_size == run_lock.STATUS_BYTES  # reserved as the job starts
        run_lock.record_end(tmp_path, "r1", "disk full at /x (paths.runs): 0.1 MB free")
    assert run_lock.last_end(tmp_path, "r1") == "disk full at /x (paths.runs): 0.1 MB free"
    assert status.stat().st_size == run_lock.STATUS_BYTES  # written in place
    run_lock.record_end(tmp_path, "r1", "")
    assert run_lock.last_end(tmp_path, "r1") == ""
    assert run_lock.last_end(tmp_path, "never-ran") == ""


def test_a_store_that_refuses_the_end_is_said_and_forgotten(tmp_path, monkeypatch):
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    try:
        mlflow.start_run()

        def refuse(*a, **kw):
            raise sqlite3.OperationalError("database or disk is full")

        monkeypatch.setattr(mlflow, "set_tag", refuse)
        monkeypatch.setattr(mlflow, "end_run", refuse)
        assert tracking.end_failed(RuntimeError("boom")) == "FAILED (not recorded)"
        assert mlflow.active_run() is None  # nothing left for MLflow's exit hook to write
    finally:
        monkeypatch.undo()
        mlflow.end_run()
        mlflow.set_tracking_uri(None)
