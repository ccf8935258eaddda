"""`make gpu-check` (benchmarks/gpu_check.py): on this CPU the whole command, the way the README shows it, in under
4 minutes with the CUDA parts skipped and said so; its pieces (the junit reading, the summary's verdict, the time cap
that stops a whole process group) on their own."""

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import gpu_check  # noqa: E402

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


@pytest.mark.slow
def test_make_gpu_check_on_a_cpu(tmp_path):
    out = tmp_path / "gc"
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if ".venv" not in p)
    # The caps are the lent GPU's budget; here, beside the rest of the suite on two cores, they are hang guards only
    # (the epoch step once took 40 s on a loaded machine). A step stopped at its cap is tested on its own below.
    done = subprocess.run(
        ["make", "gpu-check", f"OUT={out}", "CAPS=600,600,600,600"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    names = {p.name for p in out.iterdir()}
    # with the GPU's e2e.log and e2e.json: 8 files, what the device tool brings back from its output folder
    assert names == {"tests.log", "bench.log", "bench.json", "epoch.log", "performance.md", "summary.txt"}

    summary = (out / "summary.txt").read_text()
    assert summary in done.stdout  # printed, not only written
    assert "NO CUDA HERE" in summary and "4 e2e    skipped: it trains with trainer.use_gpu=true" in summary
    assert re.search(
        r"3 epoch  benchmarks/epoch_rate.py, views by BatchedExecutor: project \d+ img/s, bare \d+", summary
    )
    assert re.search(r"views ahead: epoch project/bare +[0-9.]+  >= 1.0", summary)
    tests = re.search(r"1 tests  pytest -m gpu: (\d+) skipped", summary)
    assert tests and int(tests[1]) >= 58, summary  # every GPU test collected, each skipped on this machine
    for file in ("tests/train/test_device_step.py", "tests/augment/test_batched.py", "tests/test_gpu_e2e.py"):
        assert re.search(rf"^   {re.escape(file)} +\d+ skipped$", summary, re.M), file
    assert "2 bench  benchmarks/gpu, resnet18 64 px, batch 16: 10 of 10 rows" in summary
    assert "verdict: 0 problem(s)" in summary
    for row in ROWS:  # every ratio against its target, on the summary's screen
        assert re.search(rf"step {row} project/bare +[0-9.]+  >= 0.97", summary), row

    text = (out / "performance.md").read_text()  # docs/performance.md's new text
    assert "command: `make gpu-check: python benchmarks/gpu --quick --device cpu --threads 1 --json " in text
    assert "device: CPU (" in text and "torch " in text and "date: " in text
    for row, baseline in ROWS.items():
        (line,) = [ln for ln in text.splitlines() if ln.startswith(f"| {row} |")][:1]
        cells = [c.strip() for c in line.strip("|").split("|")]
        bare, project, ratio = float(cells[3]), float(cells[4]), float(cells[5])
        assert bare > 0 and project > 0 and ratio > 0, line
        # the table rounds rates to 0.1 img/s and ratios to 0.001: the ratio of the printed rates can differ by that
        assert abs(ratio - project / bare) <= ratio * (0.05 / project + 0.05 / bare) + 5e-4, line
        if baseline:  # plug-in rows: the cost against their framework's row
            cost = re.match(rf"([0-9.]+)x vs {baseline} \(([0-9.]+)x\)", cells[7])
            assert cost and float(cost[1]) > 0 and float(cost[2]) > 0, line
    assert "identical in both loops of every measured row" in text
    assert "| mocov2 | 2 |" in text or "batched executor: not available" in text
    assert "Not run: no CUDA here (make gpu-check skips it)." in text


JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.train.test_device_step" name="test_step[mocov2]" time="1.0"/>
<testcase classname="tests.train.test_device_step" name="test_step[simclr]" time="1.0">
  <failure message="AssertionError: loss is nan&#10;second line">trace</failure></testcase>
<testcase classname="tests.test_gpu_e2e" name="test_spirograph_on_one_gpu" time="0.0">
  <skipped message="needs CUDA"/></testcase>
<testcase classname="tests.augment.test_batched.TestParity" name="test_flip" time="0.1">
  <error message="RuntimeError: CUDA error"/></testcase>
<testcase classname="" name="tests.augment.test_dali_gpu" time="0.0">
  <error message="collection failure">ModuleNotFoundError</error></testcase>
</testsuite></testsuites>"""


def test_the_summary_counts_each_test_file_and_calls_failures_problems(tmp_path):
    (tmp_path / "tests.xml").write_text(JUNIT)
    junit = gpu_check.read_junit(tmp_path / "tests.xml")
    assert {f: dict(c) for f, c in junit["groups"].items()} == {
        "tests/train/test_device_step.py": {"passed": 1, "failed": 1},
        "tests/test_gpu_e2e.py": {"skipped": 1},
        "tests/augment/test_batched.py": {"failed": 1},
        "tests/augment/test_dali_gpu.py": {"failed": 1},  # a collection error, under its module
    }
    assert junit["failures"] == [
        "tests/train/test_device_step.py::test_step[simclr]: AssertionError: loss is nan",
        "tests/augment/test_batched.py::test_flip: RuntimeError: CUDA error",
        "tests/augment/test_dali_gpu.py::tests.augment.test_dali_gpu: collection failure",
    ]
    meta = {"date": "d", "device": "NVIDIA H100 80GB HBM3", "torch": "2.11.0", "python": "3.12.3", "commit": None}
    step = {"rc": 0, "seconds": 10.0, "cap": 200.0, "capped": False, "command": ["python", "-m", "pytest"]}
    bench = {
        "settings": {"backbone": "resnet50", "size": 224, "batch": 256},
        "steps": {
            "mocov2": {"bare": 1000.0, "project": 990.0, "error": None},
            "co2": {"bare": 960.0, "project": 950.0, "error": None},
            "byol": {"bare": 1000.0, "project": 900.0, "error": None},
        },
        "executor": {"mocov2": {"images_s": 2500.0, "views_s": 5000.0, "views": 2}},
    }
    e2e = {"images_s": 800.0, "step": 990.0}
    epoch = {
        "executor": "BatchedExecutor",
        "ratio": 0.95,
        "rows": {"project": {"images_per_s": 950.0}, "bare": {"images_per_s": 1000.0}},
    }
    steps = {"tests": step, "bench": step, "epoch": step, "e2e": step}
    text, problems = gpu_check.summary(meta, steps, junit, bench, e2e, True, epoch)
    assert problems == 3  # the three failed tests; targets missed are measurements, not problems
    assert "NO CUDA" not in text
    assert re.search(r"step mocov2 project/bare +0.990  >= 0.97  met", text)
    assert re.search(r"step byol project/bare +0.900  >= 0.97  NOT MET", text)
    assert re.search(r"cost co2 / mocov2 +1.042  <= 1.02  NOT MET", text)
    assert re.search(r"views mocov2 / its step +2.525  >= 2.0   met", text)
    assert re.search(r"end to end / tensor-fed step +0.808  >= 0.85  NOT MET", text)
    assert re.search(r"views ahead: epoch project/bare +0.950  >= 1.0   NOT MET", text)
    assert "3 epoch  benchmarks/epoch_rate.py, views by BatchedExecutor: project 950 img/s, bare 1000 img/s" in text
    assert "verdict: 3 problem(s)" in text and "4 target(s) not met" in text
    _, problems = gpu_check.summary(meta, steps, junit, bench, e2e, True, None)
    assert problems == 4  # the epoch step left no results
    nan_row = {"project": {"images_per_s": 950.0, "loss_finite": False}, "bare": {"images_per_s": 1000.0}}
    text, problems = gpu_check.summary(meta, steps, junit, bench, e2e, True, dict(epoch, rows=nan_row, partial=True))
    assert problems == 4 and "LOSS NOT FINITE in the epoch benchmark's rows: project" in text
    assert "bare 1000 img/s (10 s of 200); PARTIAL" in text
    assert "FAILED tests/augment/test_batched.py::test_flip: RuntimeError: CUDA error" in text
    capped = dict(step, capped=True)
    _, problems = gpu_check.summary(meta, {"tests": capped, "bench": step}, None, None, None, False)
    assert problems == 3  # stopped at its cap, no junit, no benchmark results
    partial = dict(bench, partial=True)  # benchmarks/gpu saves its JSON after each row: a cap loses one row
    text, problems = gpu_check.summary(meta, {"tests": step, "bench": capped}, junit, partial, None, False)
    assert "3 of 3 rows (10 s of 200, STOPPED AT ITS CAP); PARTIAL" in text
    assert problems == 4 and re.search(r"step mocov2 project/bare +0.990", text)


def test_a_step_past_its_cap_is_stopped_with_its_whole_process_group(tmp_path):
    marker = tmp_path / "grandchild.pid"
    script = (
        "import subprocess, sys, time; "
        f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); open({str(marker)!r}, 'w')"
        ".write(str(p.pid)); print('started', flush=True); time.sleep(60)"
    )
    t0 = time.perf_counter()
    step = gpu_check.run_step("sleepy", [sys.executable, "-c", script], 2.0, tmp_path / "sleepy.log")
    assert step["capped"] and step["rc"] != 0 and time.perf_counter() - t0 < 20
    log = (tmp_path / "sleepy.log").read_text()
    assert "started" in log and "stopped at its cap" in log
    pid = int(marker.read_text())
    for _ in range(50):  # the grandchild went with the group
        if not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]:
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"process {pid} outlived its step's cap")


def test_gpu_check_runs_the_unit_tests_before_the_end_to_end_ones(monkeypatch):
    """The suite's scheduler puts files with `slow` tests first (two xdist workers); in gpu-check's one capped
    process that let an end-to-end run use the cap before any unit test ran. AUGSSL_SLOW_LAST puts them last."""
    import conftest

    class Item:
        def __init__(self, nodeid: str, slow: bool):
            self.nodeid, self.slow = nodeid, slow

        def get_closest_marker(self, name: str):
            return object() if name == "slow" and self.slow else None

    def order(**env) -> list[str]:
        for k in ("AUGSSL_SLOW_LAST",):
            monkeypatch.delenv(k, raising=False)
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        items = [Item("tests/augment/test_batched.py::a", False), Item("tests/test_gpu_e2e.py::spiro", True)]
        items += [Item("tests/test_gpu_e2e.py::jpeg", True), Item("tests/train/test_device_step.py::b", False)]
        conftest.pytest_collection_modifyitems(None, items)
        return [i.nodeid.rsplit("::", 1)[1] for i in items]

    assert order() == ["spiro", "jpeg", "a", "b"]  # the xdist order: the unit with end-to-end tests first
    assert order(AUGSSL_SLOW_LAST="1") == ["a", "b", "spiro", "jpeg"]
