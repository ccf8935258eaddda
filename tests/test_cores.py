"""AUGSSL_CORES: the cores a shared machine lends the jobs (pipeline/cores.py), read where torch's threads are
left to the machine; a bad value is one error line before a job starts anything."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.config import ConfigError, compose_config
from pipeline.cores import cores

ROOT = Path(__file__).resolve().parents[1]


def test_every_core_unless_the_environment_lends_fewer(monkeypatch):
    monkeypatch.delenv("AUGSSL_CORES", raising=False)
    assert cores() == os.cpu_count()
    monkeypatch.setenv("AUGSSL_CORES", "3")
    assert cores() == 3
    monkeypatch.setenv("AUGSSL_CORES", " ")  # set but empty: as unset
    assert cores() == os.cpu_count()


@pytest.mark.parametrize("value", ["0", "-1", "two", "1.5"])
def test_a_bad_value_is_refused_where_the_config_is_composed(monkeypatch, value):
    monkeypatch.setenv("AUGSSL_CORES", value)
    with pytest.raises(ValueError, match="expected an integer >= 1"):
        cores()
    with pytest.raises(ConfigError) as e:
        compose_config([])
    assert str(e.value) == f"AUGSSL_CORES={value}: expected an integer >= 1 (the cores this machine lends the jobs)"


def test_a_job_with_a_bad_value_says_so_in_one_line_and_makes_nothing(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "RAY_ADDRESS")}
    r = subprocess.run(
        [sys.executable, str(ROOT / "jobs" / "pretrain.py"), f"paths.root={tmp_path}"],
        env={**env, "AUGSSL_CORES": "all"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "error: AUGSSL_CORES=all: expected an integer >= 1 (the cores this machine lends the jobs)"
    ], r.stderr[-2000:]
    assert list(tmp_path.iterdir()) == []


def test_a_process_takes_its_share_of_the_lent_cores_and_torchs_default_where_none_are_lent(monkeypatch):
    import torch

    from pipeline.cores import limit_torch_threads

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        monkeypatch.delenv("AUGSSL_CORES", raising=False)
        limit_torch_threads()
        assert torch.get_num_threads() == 2  # unset: left as it was
        monkeypatch.setenv("AUGSSL_CORES", "3")
        limit_torch_threads()
        assert torch.get_num_threads() == 3
        limit_torch_threads(processes=2)
        assert torch.get_num_threads() == 1  # 3 cores over 2 processes, never below one thread
        limit_torch_threads(processes=8)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
