"""jobs/evaluate.py's run of a checked suite (pipeline.eval.suite): every step in order, each a child run of the
pretraining run, then the summary, printed, written under runs/evaluate/ and logged on the pretraining run."""

from __future__ import annotations

import time
from pathlib import Path

from mlflow.tracking import MlflowClient

from pipeline import tracking
from pipeline.eval.source import load_source
from pipeline.eval.suite import SuiteError, SuiteRun, load_suite, pick, run_step, steps, summary


def run(s: SuiteRun) -> list[dict]:
    """Every step in order; returns [{"step", "job", "minutes", "results"}]."""
    tracking.setup(s.store)
    try:
        src = load_source(s.source)
    except FileNotFoundError as e:
        raise SuiteError(str(e)) from None
    asked = s.suite["name"]
    name = pick(asked, src.cfg.get("plugin") or {}, src.cfg.get("augment") or {})
    suite = load_suite(name) if name != asked or "steps" not in s.suite else dict(s.suite)
    todo = steps(s, suite)
    print(
        f"[evaluate] suite {suite['name']} ({suite.get('paper', '')}) at size {s.size}: "
        f"{', '.join(n for n, _, _ in todo)}",
        flush=True,
    )
    for i, (step, job, argv) in enumerate(todo, 1):  # every step's settings before the first one runs
        try:
            run_step(job, argv, dry=True)
        except SuiteError as e:
            raise SuiteError(f"step {i}/{len(todo)} ({step}): {e}") from None
    done = []
    for i, (step, job, argv) in enumerate(todo, 1):
        print(f"[evaluate] {i}/{len(todo)} {step}: python jobs/{job}.py {' '.join(argv)}", flush=True)
        t0 = time.monotonic()
        try:
            results = run_step(job, argv)
        except SuiteError as e:
            raise SuiteError(
                f"step {i}/{len(todo)} ({step}) failed: {e}; rerun the same command to resume there"
            ) from None
        done.append({"step": step, "job": job, "minutes": (time.monotonic() - t0) / 60, "results": results})
    text = summary(suite, done)
    print(text, flush=True)
    out = Path(s.store.runs) / "evaluate" / f"{src.cfg.get('run', {}).get('name') or 'run'}-{suite['name']}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text + "\n")
    where = str(out)
    if src.run_id is not None:  # beside the evaluations, on the pretraining run itself
        MlflowClient().log_text(src.run_id, text + "\n", f"evaluate/{suite['name']}.md")
        where += f" and the run's evaluate/{suite['name']}.md"
    print(f"[evaluate] summary: {where}", flush=True)
    return done
