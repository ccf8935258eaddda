"""Smoke run of benchmarks/augment.py: every path produces two [B, 3, 224, 224] views and a finite rate."""

import importlib.util
import math
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "augment.py"


@pytest.mark.slow
def test_augment_benchmark_smoke(capsys):
    pytest.importorskip("skimage", reason="needs the bench extra: pip install -e '.[bench]'")
    pytest.importorskip("nvidia.dali")
    spec = importlib.util.spec_from_file_location("bench_augment", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)

    result = bench.main(["--images", "64", "--batch", "32"])

    (row,) = result["rows"]
    assert row["threads"] == 1
    for path in ("dali", "torch", "batched", "torchvision"):
        rate = row["rates"][path]
        assert math.isfinite(rate) and rate > 0, (path, rate)
        assert row["clocks"][path].images == 64
        assert row["shapes"][path] == {(32, 3, 224, 224)}, path  # every batch, both views
    for name, ratio in row["ratios"].items():
        assert math.isfinite(ratio) and ratio > 0, name
    out = capsys.readouterr().out
    assert "DALI/torchvision" in out and "target DALI >= 1.5x" in out
