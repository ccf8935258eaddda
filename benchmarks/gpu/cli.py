"""The command line: `python benchmarks/gpu [flags]` (the package's docstring is its --help), sections (a), (b)
and (c) in that order, the JSON saved after each row, the report written at the end."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import platform
import shlex
import sys
import tempfile
from pathlib import Path

import torch

from . import ROOT
from . import __doc__ as OVERVIEW
from .data import make_jpegs
from .measure import Deadline, device_name, measure_e2e, measure_executor, measure_rows
from .report import report
from .rows import ROWS, settings


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=OVERVIEW, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default=None, help="cuda | cpu | cuda:N (default: cuda if available, else cpu)")
    ap.add_argument(
        "--out", default=str(ROOT / "docs" / "performance.md"), help="report path (default docs/performance.md)"
    )
    ap.add_argument("--quick", action="store_true", help="tiny sizes for a CPU smoke run")
    ap.add_argument("--e2e", action="store_true", help="also run jobs/pretrain.py end to end (section c)")
    ap.add_argument("--rows", nargs="+", choices=ROWS, default=list(ROWS), help="step rows (default: all)")
    ap.add_argument("--skip-executor", action="store_true", help="leave out section (a)")
    ap.add_argument("--workdir", default=None, help="generated data and the e2e run (default: a temporary folder)")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    ap.add_argument("--deadline", type=float, default=None, help="seconds: start no row or recipe likely to end later")
    ap.add_argument("--json", default=None, help="also write the measurements as JSON here (make gpu-check reads it)")
    for k, t in (
        ("backbone", str),
        ("width", int),
        ("size", int),
        ("batch", int),
        ("warmup", int),
        ("iters", int),
        ("rounds", int),
        ("queue", int),
        ("exec_images", int),
        ("e2e_images", int),
        ("e2e_epochs", int),
    ):
        ap.add_argument(f"--{k.replace('_', '-')}", type=t, default=None, help=f"override the {k} of the chosen mode")
    args = ap.parse_args(argv)
    argv_used = list(sys.argv[1:] if argv is None else argv)
    command = "python benchmarks/gpu" + (" " + shlex.join(argv_used) if argv_used else "")

    import torchvision

    from pipeline.train.precision import resolve_precision

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if args.threads:
        torch.set_num_threads(args.threads)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    s = settings(args)
    precision = resolve_precision("auto", device)
    fmt = torch.channels_last if device.type == "cuda" else torch.contiguous_format
    meta = {
        "command": command,
        "device": device_name(device),
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "python": platform.python_version(),
        "date": dt.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "precision": precision,
        "channels_last": fmt == torch.channels_last,
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "exec_images": s["exec_images"],
        "threads": torch.get_num_threads(),
    }
    print(
        f"command: {command}\ndevice: {meta['device']}; torch {meta['torch']}; {meta['date']}\nsettings: {s}",
        flush=True,
    )
    rows = [r for r in ROWS if r in args.rows]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    result = {"meta": meta, "settings": s, "steps": {}, "executor": None, "e2e": None, "partial": True}

    def save() -> None:
        """The JSON as measured so far: a caller's time cap (make gpu-check) loses only what was still running."""
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=1, default=str) + "\n")

    with tempfile.TemporaryDirectory(prefix="gpu-bench-") as tmp:
        workdir = Path(args.workdir or tmp).resolve()
        workdir.mkdir(parents=True, exist_ok=True)
        deadline = Deadline(args.deadline)
        if not args.skip_executor:  # first: the views were never measured on a GPU before a cap cut them off
            print("(a) gpu view executor", flush=True)
            jpegs, meta["jpeg_source"] = make_jpegs(s["exec_images"])
            result["executor"] = measure_executor(s, device, jpegs, deadline)
            if "unavailable" in result["executor"]:
                print(f"batched executor: not available ({result['executor']['unavailable']})", flush=True)
            save()
        print("(b) training step, bare vs project", flush=True)

        def after_row(steps: dict) -> None:
            result["steps"] = steps
            save()

        result["steps"] = measure_rows(rows, s, device, precision, fmt, workdir, deadline, after_row)
        if args.e2e:
            print("(c) end to end", flush=True)
            e2e = measure_e2e(s, device, workdir, deadline)
            e2e["step"] = result["steps"].get("mocov2", {}).get("project", math.nan)
            print(f"  {e2e['error']}" if "error" in e2e else f"  {e2e['images_s']:.1f} img/s", flush=True)
            result["e2e"] = e2e
    result["partial"] = False
    save()
    text = report(meta, s, result["steps"], result["executor"], result["e2e"])
    out.write_text(text)
    print("\n" + text + f"\nwritten to {out}", flush=True)
    return result
