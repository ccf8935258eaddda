"""Smoke run of benchmarks/gpu.py on the CPU (--quick): every framework and plug-in row is measured in both loops,
with a positive project/bare ratio, and the report carries the command that made it."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ROWS = {
    "mocov2": None,
    "simclr": None,
    "byol": None,
    "simsiam": None,
    "mocov3_vit": None,
    "dino_vit": None,
    "co2": "mocov2",
    "clsa": "mocov2",
    "invclr": "simclr",
    "cocor": "mocov2",
}


def test_gpu_benchmark_quick_on_cpu(tmp_path):
    out = tmp_path / "perf.md"
    args = ["--quick", "--device", "cpu", "--threads", "1", "--out", str(out), "--workdir", str(tmp_path / "work")]
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu.py"), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    text = out.read_text()

    assert "command: `python benchmarks/gpu.py --quick --device cpu --threads 1 --out " in text
    assert "device: CPU (" in text and "torch " in text and "date: " in text
    for row, baseline in ROWS.items():
        (line,) = [ln for ln in text.splitlines() if ln.startswith(f"| {row} |")][:1]
        cells = [c.strip() for c in line.strip("|").split("|")]
        bare, project, ratio = float(cells[3]), float(cells[4]), float(cells[5])
        assert bare > 0 and project > 0 and ratio > 0, line
        assert abs(ratio - project / bare) < 0.01 * ratio + 1e-3, line
        if baseline:  # plug-in rows: the cost against their framework's row
            cost = re.match(rf"([0-9.]+)x vs {baseline} \(([0-9.]+)x\)", cells[7])
            assert cost and float(cost[1]) > 0 and float(cost[2]) > 0, line
    assert "identical in both loops of every measured row" in text
    # section (a): the gpu executor's table, or the line saying it is not there yet
    assert "| mocov2 | 2 |" in text or "gpu executor: not available" in text
    assert "Not run: add `--e2e`." in text
