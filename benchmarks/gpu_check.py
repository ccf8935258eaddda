"""Everything a GPU machine should run, in one call: `make gpu-check OUT=<dir>` (python benchmarks/gpu_check.py).

Four steps in this order, each a process group of its own, stopped at its time cap (the caps add up to 9
minutes, so that the whole fits one 10-minute call on one H100 with the bundle's unpacking):

  1. tests  `pytest -m gpu` with --durations and a junit XML: the GPU unit tests first, then the Spirograph
            end-to-end run (the JPEG one is deselected on a GPU: step 4 runs that job and times it)
  2. bench  `benchmarks/gpu` at the sizes of docs/performance.md, told to start nothing it cannot finish in time
  3. epoch  `benchmarks/epoch_rate.py`: the loop's views made ahead on a CUDA stream against a bare PyTorch loop of the
            same recipe (torchvision transforms on the host), epochs side by side
  4. e2e    `benchmarks/gpu --rows mocov2 --e2e`: jobs/pretrain.py with trainer.use_gpu=true from JPEG shards,
            against the project's MoCo v2 step fed tensors in the same process

OUT receives tests.log, bench.log, bench.json, epoch.log, e2e.log, e2e.json, performance.md (docs/performance.md's
new text, steps 2 and 4 together) and summary.txt, the one screen printed at the end: pass/fail per test file and
every ratio against its target (8 files: what a lent machine sends back; the junit XML and epoch.json are read into
the summary and not kept). Without CUDA, step 1 runs (each test skips, saying why),
steps 2 and 3 run at their CPU smoke sizes (ratios that say nothing of the GPU targets), step 4 is skipped, and the
summary says so.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import shlex
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from capped import run_capped  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# seconds, 540 in all. From the GPU runs (H200 2026-11-26, H100 2026-11-28, docs/gpu.md): collecting and the GPU
# unit tests take about 55 s, the Spirograph e2e test over 110 s on the H100; the executor and six step rows 92 s;
# the epoch benchmark about 45 s; step 4's jobs/pretrain.py ran its 2 epochs in 109 s and needed a few more to end
CAPS = {"tests": 200, "bench": 100, "epoch": 50, "e2e": 190}
E2E_TEST_TIMEOUT = 130  # seconds per jobs/pretrain.py in tests/test_gpu_e2e.py: a slow one fails with its output
# step 4 runs this job, timed, and the whole of step 1 could not hold both end-to-end runs
DESELECT = "tests/test_gpu_e2e.py::test_resnet50_on_jpeg_shards_on_one_gpu"
BENCH_GPU = ["--warmup", "5", "--iters", "8", "--rounds", "2", "--exec-images", "512"]
BENCH_CPU = ["--quick", "--device", "cpu", "--threads", "1"]
EPOCH_GPU = ["--images", "4096", "--epochs", "2"]
EPOCH_CPU = ["--images", "64", "--batch", "32", "--epochs", "1", "model.width=8"]
E2E_GPU = [
    "--rows",
    "mocov2",
    "--skip-executor",
    "--e2e",
    "--warmup",
    "5",
    "--iters",
    "8",
    "--rounds",
    "2",
    "--e2e-images",
    "3072",
    "--e2e-epochs",
    "2",
]


def run_step(name: str, cmd: list[str], cap: float, log: Path) -> dict:
    """One of the steps, from the project's root, under its cap; its output's text is in its log."""
    print(flush=True)
    step = run_capped(name, cmd, cap, log, cwd=ROOT)
    del step["text"]
    return step


def test_file(classname: str, name: str = "") -> str:
    """tests.train.test_device_step[.TestX] -> tests/train/test_device_step.py; a collection error has no class
    name and names its module in `name` instead."""
    for dotted in (classname, name):
        parts = dotted.split(".")
        found = [i for i, p in enumerate(parts) if p.startswith("test_") or p == "conftest"]
        if found:
            return "/".join(parts[: found[-1] + 1]) + ".py"
    return classname or name or "?"


def read_junit(path: Path) -> dict:
    """{file: Counter(passed/failed/skipped)} and the failures' first lines, from pytest's junit XML."""
    groups: dict[str, Counter] = defaultdict(Counter)
    failures = []
    for case in ET.parse(path).getroot().iter("testcase"):
        file = test_file(case.get("classname", ""), case.get("name", ""))
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        if bad is not None:
            groups[file]["failed"] += 1
            why = (bad.get("message") or bad.text or "").strip().splitlines()
            failures.append(f"{file}::{case.get('name')}: {why[0][:150] if why else '?'}")
        elif case.find("skipped") is not None:
            groups[file]["skipped"] += 1
        else:
            groups[file]["passed"] += 1
    return {"groups": dict(groups), "failures": failures}


def _counts(c: Counter) -> str:
    return ", ".join(f"{c[k]} {k}" for k in ("passed", "failed", "skipped") if c[k]) or "none"


def _took(step: dict) -> str:
    return f"{step['seconds']:.0f} s of {step['cap']:.0f}" + (", STOPPED AT ITS CAP" if step["capped"] else "")


def ratio_lines(bench: dict, e2e: dict | None, epoch: dict | None = None) -> tuple[list[str], int]:
    """Every measured ratio against its target, and how many targets are not met."""
    from gpu import rows  # benchmarks/gpu/rows.py: the targets live there

    lines, missed = [], 0

    def judge(label: str, value: float, op: str, target: float) -> None:
        nonlocal missed
        if value is None or math.isnan(value):
            lines.append(f"   {label:34s} –")
            return
        ok = value >= target if op == ">=" else value <= target
        missed += not ok
        lines.append(f"   {label:34s} {value:6.3f}  {op} {target:<5} {'met' if ok else 'NOT MET'}")

    steps = bench.get("steps", {})
    for row, r in steps.items():
        if r.get("error"):
            lines.append(f"   step {row:29s} {r['error'][:60]}")
            continue
        judge(f"step {row} project/bare", r["project"] / r["bare"], ">=", rows.PROJECT_TARGET)
    for row, target in rows.COST_TARGET.items():
        base = rows.BASELINE[row]
        if row in steps and base in steps and not steps[row].get("error") and not steps[base].get("error"):
            judge(f"cost {row} / {base}", steps[base]["project"] / steps[row]["project"], "<=", target)
    executor = bench.get("executor") or {}
    for recipe, r in executor.items():
        if isinstance(r, dict):
            step = steps.get(rows.EXECUTOR_RECIPES[recipe], {}).get("project", math.nan)
            target = rows.EXECUTOR_TARGET[recipe]
            judge(f"views {recipe} / its step", r["images_s"] / step if step else math.nan, ">=", target)
    if "unavailable" in executor:
        lines.append(f"   views: batched executor not available ({executor['unavailable'][:80]})")
    if epoch:
        import epoch_rate

        judge("views ahead: epoch project/bare", epoch["ratio"], ">=", epoch_rate.TARGET)
    if e2e and "images_s" in e2e:
        judge("end to end / tensor-fed step", e2e["images_s"] / e2e["step"], ">=", rows.E2E_TARGET)
    elif e2e and "error" in e2e:
        lines.append(f"   end to end: {e2e['error'][:100]}")
    return lines, missed


def summary(
    meta: dict,
    steps: dict,
    junit: dict | None,
    bench: dict | None,
    e2e: dict | None,
    cuda: bool,
    epoch: dict | None = None,
) -> tuple:
    lines = [
        f"gpu-check · {meta['date']} · {meta['device']} · torch {meta['torch']} · Python {meta['python']}"
        + (f" · commit {meta['commit']}" if meta["commit"] else "")
    ]
    if not cuda:
        lines.append(
            "NO CUDA HERE: the GPU tests skip, the two benchmarks run at their CPU smoke sizes (their ratios say "
            "nothing of the GPU targets), the end-to-end step is skipped."
        )
    problems = sum(st["capped"] for st in steps.values())
    t = steps["tests"]
    if junit is None:
        lines.append(f"1 tests  pytest -m gpu: no junit XML (exit {t['rc']}; {_took(t)}): see tests.log")
        problems += 1
    else:
        total = sum((c for c in junit["groups"].values()), Counter())
        lines.append(f"1 tests  pytest -m gpu: {_counts(total)}  ({_took(t)})")
        for file, c in sorted(junit["groups"].items()):
            lines.append(f"   {file:48s} {_counts(c)}")
        lines += [f"   FAILED {f}" for f in junit["failures"]]
        problems += total["failed"]
    b = steps["bench"]
    if bench is None:
        lines.append(f"2 bench  benchmarks/gpu: no results (exit {b['rc']}; {_took(b)}): see bench.log")
        problems += 1
    else:
        s = bench["settings"]
        lines.append(
            f"2 bench  benchmarks/gpu, {s['backbone']} {s['size']} px, batch {s['batch']}: "
            f"{sum(not r.get('error') for r in bench['steps'].values())} of {len(bench['steps'])} rows ({_took(b)})"
            + ("; PARTIAL: what it had finished when it stopped" if bench.get("partial") else "")
        )
    ep = steps.get("epoch")
    if ep is not None and epoch is None:
        lines.append(f"3 epoch  benchmarks/epoch_rate.py: no results (exit {ep['rc']}; {_took(ep)}): see epoch.log")
        problems += 1
    elif ep is not None:
        rows = epoch["rows"]
        lines.append(
            f"3 epoch  benchmarks/epoch_rate.py, views by {epoch['executor']}: project "
            f"{rows['project']['images_per_s']:.0f} img/s, bare {rows['bare']['images_per_s']:.0f} img/s ({_took(ep)})"
            + ("; PARTIAL: the passes it had finished" if epoch.get("partial") else "")
        )
        diverged = [name for name, r in rows.items() if not r.get("loss_finite", True)]
        if diverged:
            lines.append(f"   LOSS NOT FINITE in the epoch benchmark's rows: {', '.join(diverged)}")
            problems += 1
    e = steps.get("e2e")
    if e is None:
        lines.append("4 e2e    skipped: it trains with trainer.use_gpu=true, which needs CUDA")
    elif e2e is None:
        lines.append(f"4 e2e    no results (exit {e['rc']}; {_took(e)}): see e2e.log")
        problems += 1
    else:
        got = f"{e2e['images_s']:.0f} img/s" if "images_s" in e2e else "failed"
        lines.append(f"4 e2e    jobs/pretrain.py trainer.use_gpu=true from JPEG shards: {got} ({_took(e)})")
        problems += "error" in e2e
    ratios, missed = ratio_lines(bench or {}, e2e, epoch) if bench or e2e or epoch else ([], 0)
    if ratios:
        lines += ["ratios (measured in one run each)" + ("" if cuda else ": CPU smoke sizes, not the GPU targets")]
        lines += ratios
    lines.append(
        f"verdict: {problems} problem(s) (failed tests, steps without results or stopped at their cap)"
        + (f"; {missed} target(s) not met" if cuda else "")
    )
    return "\n".join(lines) + "\n", problems


def _json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _commit() -> str | None:
    done = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() or None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="the folder every file goes to (made if missing)")
    ap.add_argument(
        "--caps",
        default=",".join(str(c) for c in CAPS.values()),
        help="seconds for tests,bench,epoch,e2e (default %(default)s)",
    )
    args = ap.parse_args(argv)
    try:
        caps = dict(zip(CAPS, (float(c) for c in args.caps.split(",")), strict=True))
    except ValueError:
        print(f"error: --caps {args.caps}: give four numbers of seconds, e.g. 200,100,50,190", file=sys.stderr)
        return 2
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import torch

    cuda = torch.cuda.is_available()
    meta = {
        "date": dt.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "device": torch.cuda.get_device_name(0) if cuda else f"CPU ({os.cpu_count()} cores)",
        "torch": torch.__version__,
        "python": platform.python_version(),
        "commit": _commit(),
    }
    py = sys.executable
    os.environ.setdefault("AUGSSL_E2E_TIMEOUT", str(E2E_TEST_TIMEOUT))  # read by tests/test_e2e.py's pretrain()
    os.environ["AUGSSL_SLOW_LAST"] = "1"  # tests/conftest.py: the unit tests first, the end-to-end run after
    steps = {
        "tests": run_step(
            "tests",
            [
                py,
                "-m",
                "pytest",
                "-m",
                "gpu",
                "-v",
                "-p",
                "no:cacheprovider",
                "--durations=0",
                *(["--deselect", DESELECT] if cuda else []),
                f"--junitxml={out / 'tests.xml'}",
            ],
            caps["tests"],
            out / "tests.log",
        )
    }
    bench_args = BENCH_GPU + ["--deadline", str(max(10.0, caps["bench"] - 30))] if cuda else BENCH_CPU
    steps["bench"] = run_step(
        "bench",
        [py, "benchmarks/gpu", *bench_args, "--json", str(out / "bench.json"), "--out", str(out / "bench.md")],
        caps["bench"],
        out / "bench.log",
    )
    steps["epoch"] = run_step(
        "epoch",
        [py, "benchmarks/epoch_rate.py", *(EPOCH_GPU if cuda else EPOCH_CPU), "--json", str(out / "epoch.json")],
        caps["epoch"],
        out / "epoch.log",
    )
    if cuda:
        steps["e2e"] = run_step(
            "e2e",
            [py, "benchmarks/gpu", *E2E_GPU, "--deadline", str(max(10.0, caps["e2e"] - 15))]
            + ["--json", str(out / "e2e.json"), "--out", str(out / "e2e.md")],
            caps["e2e"],
            out / "e2e.log",
        )
    bench = _json(out / "bench.json")
    epoch = _json(out / "epoch.json")
    e2e_run = _json(out / "e2e.json")
    e2e = (e2e_run or {}).get("e2e")
    junit = read_junit(out / "tests.xml") if (out / "tests.xml").exists() else None
    # at most 8 files come back from a lent machine: what the summary holds is not sent twice
    for scratch in ("bench.md", "e2e.md", "tests.xml", "epoch.json"):  # in performance.md, or in summary.txt
        (out / scratch).unlink(missing_ok=True)
    if bench:
        from gpu.report import report

        meta_b = dict(bench["meta"])
        meta_b["command"] = "make gpu-check: " + " ; ".join(
            shlex.join(["python", *s["command"][1:]]) for s in steps.values() if s["command"][1] == "benchmarks/gpu"
        )
        text = report(meta_b, bench["settings"], bench["steps"], bench.get("executor"), e2e or _skipped(cuda))
        (out / "performance.md").write_text(text)
    text, problems = summary(meta, steps, junit, bench, e2e, cuda, epoch)
    (out / "summary.txt").write_text(text)
    print("\n" + text + f"files in {out}: {', '.join(sorted(p.name for p in out.iterdir()))}", flush=True)
    return 1 if problems else 0


def _skipped(cuda: bool) -> dict:
    return {"skipped": "step 3 of make gpu-check did not finish" if cuda else "no CUDA here (make gpu-check skips it)"}


if __name__ == "__main__":
    sys.exit(main())
