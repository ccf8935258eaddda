"""The screenshots of docs/tracking.md: starts `mlflow ui` on a runs folder's store, opens each page in headless
Chromium (the distribution's `chromium` package) through the model-training links the project prints, and
writes docs/img/tracking/*.png. Run by hand, not in CI:

  .venv/bin/python docs/tracking_screenshots.py --runs runs [--port 5055] [--out docs/img/tracking]

It shoots what the store holds: the newest pretraining run (its page, metric charts, system metrics,
artifacts), the experiment's runs table, the newest sweep (job=tune) and the newest evaluation (a child run
of a pretraining run). Pages it cannot find are skipped with a line saying so.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.mlflow_ui import link, ui_command  # noqa: E402

EVALUATIONS = ("knn", "linear_probe", "finetune", "detect", "export")


def newest(client, exp_id: str, job: str | tuple[str, ...]):
    jobs = (job,) if isinstance(job, str) else job
    found = [r for j in jobs for r in client.search_runs([exp_id], f"tags.job = '{j}'", max_results=1)]
    return max(found, key=lambda r: r.info.start_time, default=None)  # search_runs returns the newest first


def pages(client, base: str) -> dict[str, str]:
    """{file name: URL} of every page to shoot."""
    exp = client.get_experiment_by_name("augssl")
    if exp is None:
        return {}
    e = exp.experiment_id
    out = {"experiment-runs": link(base, e)}
    run = newest(client, e, "pretrain")
    if run is not None:
        page = link(base, e, run.info.run_id)
        out["run-overview"] = page
        for tab in ("model-metrics", "system-metrics", "artifacts"):
            out[f"run-{tab}"] = page.replace("?", f"/{tab}?")
    for name, jobs in (("sweep", "tune"), ("evaluation", EVALUATIONS)):
        found = newest(client, e, jobs)
        if found is None:
            print(f"no {name} run in the store: {name}.png skipped", flush=True)
        else:
            out[name] = link(base, e, found.info.run_id)
    return out


def wait_for(url: str, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except OSError:
            time.sleep(0.5)
    raise SystemExit(f"error: the MLflow UI did not answer at {url} within {seconds:.0f} s")


def shoot(chromium: str, url: str, png: Path, size: str) -> None:
    # the UI is a single-page app: give its scripts virtual time to fetch and draw before the capture
    subprocess.run(
        [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            f"--window-size={size}",
            "--virtual-time-budget=20000",
            f"--screenshot={png}",
            url,
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    print(f"{png}  {url}", flush=True)


def main(argv: list[str]) -> int:
    from mlflow.tracking import MlflowClient

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", default="runs")
    p.add_argument("--port", type=int, default=5055)
    p.add_argument("--out", default=str(Path(__file__).parent / "img" / "tracking"))
    p.add_argument("--size", default="1600,1000")
    args = p.parse_args(argv)
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("error: no chromium here (apt-get install chromium)")
    store = f"sqlite:///{Path(args.runs).resolve() / 'mlflow.db'}"
    base = f"http://127.0.0.1:{args.port}"
    todo = pages(MlflowClient(store), base)
    if not todo:
        raise SystemExit(f"error: no augssl experiment in {store}: run a job first")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    server = subprocess.Popen(ui_command(store, args.port), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(base)
        for name, url in todo.items():
            shoot(chromium, url, out / f"{name}.png", args.size)
    finally:
        server.terminate()
        server.wait(timeout=30)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
