"""The reproductions' finished runs, kept beside the report: `<report>_runs/<run name>.json` (its probe and downstream
results, its label and MLflow run id) and `<run name>.png` (its training curves).

A full seeded reproduction takes longer than one sitting of a machine whose disk does not last (a CI runner, a
session's workspace, a spot node), and the MLflow store and checkpoints go with that disk. The ledger is committed with
the report, so the next machine goes on where the last one stopped: a run found in it complete (probed, and with every
downstream step asked for now, at the same arguments) is neither trained nor evaluated again, and the report reads its
numbers as recorded. A run is named by its config's hash, which leaves out the eval, trainer and paths sections (as
MLflow's reuse does): changing only eval.* settings (the probe's steps, InvCLR's invariance samples) reuses the
recorded numbers; delete the entries, or the folder, to evaluate them again."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

KEPT = ("label", "run_id", "minutes", "probe")  # as the run has them; downstream with its arguments


def folder_for(report: Path) -> Path:
    """Where the report's runs are kept: docs/reproductions.md -> docs/reproductions_runs/."""
    return report.with_name(report.stem + "_runs")


def find(folder: Path | None, name: str, downstream: dict[str, list[str]], baseline: bool) -> dict | None:
    """The recorded run `name` if it is complete for this reproduction: every downstream job in `downstream` done at
    the same arguments, and with its random-init result where this run carries the suite's `baseline`. None
    otherwise (not recorded, or recorded with other downstream steps: the run is made again)."""
    if folder is None or not (folder / f"{name}.json").is_file():
        return None
    entry = json.loads((folder / f"{name}.json").read_text())
    done = entry.get("downstream") or {}
    for job, args in downstream.items():
        step = done.get(job)
        # a step the run cannot take (detection of a ViT) is recorded with no results: done all the same
        missing_random = baseline and step is not None and step["results"] and "random" not in step["results"]
        if step is None or step["args"] != list(args) or missing_random:
            return None
    return entry


def as_result(folder: Path, entry: dict) -> dict:
    """A recorded run as pipeline.reproduce.runs.run_one returns one, downstream results included."""
    name = entry["run_name"]
    return {
        "run_id": entry["run_id"],
        "probe": entry["probe"],
        "minutes": entry["minutes"],
        "downstream": {
            job: step["results"] for job, step in (entry.get("downstream") or {}).items() if step["results"]
        },
        "curves": folder / f"{name}.png",
        "from_ledger": True,
    }


def record(folder: Path | None, run: dict, downstream: dict[str, list[str]]) -> None:
    """Keep `run` (pipeline.reproduce.runs.run_one's result, its downstream steps done) and its curves. Written to a
    temporary file first and renamed, so that a run killed while writing leaves the previous entry or none."""
    if folder is None or run.get("from_ledger"):
        return
    folder.mkdir(parents=True, exist_ok=True)
    name = run["run_name"]
    entry: dict[str, Any] = {
        "run_name": name,
        **{k: run.get(k) for k in KEPT},
        "overrides": run["overrides"],
        "scale": run["scale"],
        "extra": run["extra"],
        "downstream": {
            job: {"args": list(args), "results": (run.get("downstream") or {}).get(job) or {}}
            for job, args in downstream.items()
        },
        "recorded": time.strftime("%Y-%m-%d %H:%M"),
    }
    curves = Path(run.get("curves") or "")
    if curves.is_file():
        shutil.copyfile(curves, folder / f"{name}.png")
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder)  # one per writer
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(entry, indent=1, sort_keys=True, default=_plain) + "\n")
    os.chmod(tmp, 0o644)  # mkstemp's 0600 would keep the entry from the others who share the report's folder
    os.replace(tmp, folder / f"{name}.json")
    print(f"[reproductions] {run.get('label')}: recorded in {folder / name}.json", flush=True)


def _plain(value: Any) -> Any:
    """numpy scalars and arrays as JSON numbers and lists; anything else as its text."""
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)
