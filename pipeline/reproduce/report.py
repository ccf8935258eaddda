"""docs/reproductions.md: one section per suite and one for the sweeps, each rewritten by the command that made it
(the others kept), the hand-written notes appended."""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from pipeline.reproduce.downstream import downstream_table
from pipeline.reproduce.suites import NO_BASELINE, PAPER_LINES, SUITES
from pipeline.reproduce.tables import baseline_deltas, fmt, invclr_section, probe_table
from pipeline.tune.space import short


def sweep_section(r: dict, docs: Path) -> list[str]:
    """One sweep in the report: command, paper's optimum beside ours, the plot, the table."""
    best, base = r["best"], r["baseline"]
    better = (lambda a, b: a < b) if r["mode"] == "min" else (lambda a, b: a > b)
    lines = [
        f"### {r['name']}",
        "",
        f"`python jobs/tune.py {' '.join(r['argv'])}` — MLflow run `{r['run_id']}` (its trials are child runs), "
        f"{r['minutes']:.1f} min.",
        "",
        f"| | optimum | {r['metric']} |",
        "| --- | --- | --- |",
        f"| paper | {short(r['paper']) or '—'} | {r['where']} |",
        f"| here | {short(best['params']) if best else 'no trial finished'} | {fmt(best['metric']) if best else '—'} |",
    ]
    if base is not None:
        lines.append(f"| random-init backbone | — | {fmt(base)} |")
    lines.append("")
    verdict = "the same optimum as the paper" if r["agree"] else "**a different optimum from the paper's**"
    if best and base is not None and not better(best["metric"], base):
        verdict += (
            "; **no trial beats a random-init backbone** under the same probe, so at this budget the sweep "
            "cannot speak for or against the paper"
        )
    lines += [f"Here: {verdict}.", ""]
    if r["plot"] and Path(r["plot"]).exists():
        img = docs / "img" / f"sweep-{r['name']}.png"
        img.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(r["plot"], img)
        lines += [f"![{r['name']}](img/{img.name})", ""]
    if r["text"]:
        lines += [r["text"].strip(), ""]
    return lines


def cocor_curves(runs: list[dict], docs: Path) -> list[str]:
    """The learned run's per-length targets and similarities over training, copied next to the report."""
    out = []
    for r in runs:
        if "learned" in r["label"] and Path(r["curves"]).exists():
            img = docs / "img" / "cocor_learned_targets.png"
            img.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(r["curves"], img)
            out += [
                f"Training curves of {r['label']} (MLflow run `{r['run_id']}`, artifact `curves/`): the "
                "learned target g(v) per composite length (solid) and the batch-mean latent similarity it "
                "constrains (dashed).",
                "",
                f"![CoCor learned targets](img/{img.name})",
            ]
    return out


def seeded_claims(suite: str, rows: list, seeds: int, report: Path, first: dict) -> list[str]:
    """The suite's judged claims and forest plot; the plot also goes to the baseline's seed-0 run in MLflow."""
    # scipy.stats and matplotlib: loaded when there are seeds to judge, not with the job
    from pipeline.reproduce.claims import seeded_section

    lines, png = seeded_section(suite, rows, seeds, report)
    if png is not None and first.get("run_id") and not first.get("from_ledger"):  # a ledger's run: another store
        from mlflow.tracking import MlflowClient  # mlflow: not with the module, which the job loads before its checks

        MlflowClient().log_artifact(first["run_id"], str(png), "reproductions")
    return [*lines, ""] if lines else []


def write_report(
    results: dict[str, list[dict]],
    scale: list[str],
    path: Path,
    sweeps: Sequence[dict] = (),
    downstream: dict | None = None,
    judged: dict[str, list] | None = None,
    claims: list[str] | None = None,
    seeds: int = 1,
    ladder: list[str] | None = None,
) -> None:
    """Rewrite the sections of `path` this command made (a suite's, the sweeps', the claims table); keep the others
    as they are. Each section's first line says the command and date that made it. `judged` (suite -> its
    verdict_table.ClaimRows, adjusted): each suite's claims over its seeds, with its forest plot. `claims`: the scale
    card and the table of every suite's claims (pipeline.reproduce.summary), the report's first section. `ladder`:
    the Ladder section (pipeline.reproduce.ladder), from a command that ran it."""
    command = " ".join(["python jobs/reproductions.py", *sys.argv[1:]])
    stamp = f"_Made by `{command}` on {time.strftime('%Y-%m-%d')}._"
    made: dict[str, list[str]] = {"Claims": [stamp, "", *claims]} if claims else {}
    for suite, runs in results.items():
        data = "Photos" if any("data=photos" in o for o in runs[0]["overrides"]) else "Spirograph"
        lines = [
            stamp,
            "",
            f"Scale: `{' '.join(scale)}` ({data}; ResNet-18 layout with CIFAR stem unless a run names a ViT).",
            "",
        ]
        lines += [
            f"- {r['label']}: `python jobs/pretrain.py {' '.join(r['overrides'] + scale + r['extra'])}` "
            f"— MLflow run "
            f"`{r['run_id']}`, {r['minutes']:.1f} min"
            for r in runs
        ]
        lines.append("")
        lines += probe_table(runs, fa="pretrained_fa" in runs[0]["probe"], own_random=suite in NO_BASELINE)
        lines.append("")
        lines += invclr_section(runs) if suite == "invclr" else baseline_deltas(runs, suite not in NO_BASELINE)
        if suite in PAPER_LINES:
            lines += ["", PAPER_LINES[suite]]
        lines.append("")
        table = downstream_table(suite, runs, downstream or {})
        if table:
            lines += [*table, ""]
        if suite == "cocor":
            lines += cocor_curves(runs, path.parent)
            lines.append("")
        if judged and judged.get(suite):
            lines += seeded_claims(suite, judged[suite], seeds, path, runs[0])
        made[suite] = lines
    if ladder:
        made["Ladder"] = [stamp, "", *ladder]
    if sweeps:
        lines = [
            stamp,
            "",
            "Each paper's own sweep of its constant (`conf/sweep/`, docs/tune.md) at its CPU size: Spirograph, "
            "a few thousand images, 4–5 epochs, ranked by the linear probe's mean test MSE over the four "
            "factors (lower is better). The papers sweep on ImageNet-scale data for hundreds of epochs.",
            "",
        ]
        for r in sweeps:
            lines += sweep_section(r, path.parent)
        made["Sweeps"] = lines
    notes = path.with_name(path.stem + "_notes.md")  # hand-written reading of the numbers, kept across reruns
    note_text = notes.read_text().strip() if notes.exists() else ""
    kept = report_sections(path.read_text() if path.exists() else "", skip=note_text.splitlines()[:1])
    sections = {**kept, **made}
    ordered = ["Claims", *SUITES, "Ladder", "Sweeps"]
    order = [s for s in ordered if s in sections] + [s for s in sections if s not in ordered]
    out = [
        "# Reproductions at CPU scale",
        "",
        "Each section below is made by `python jobs/reproductions.py` (its first line gives the command and the "
        "date); rerunning a suite or a sweep rewrites its section and keeps the others. Every number comes from "
        "the command that made its section, or from the runs it found recorded in `reproductions_runs/`; rerun it to "
        "check. The papers train on 100k images for 50 epochs "
        "(InvCLR) or on ImageNet for 200 epochs (CO2, CLSA, CoCor); this is a small fraction of that, so what "
        "matters is the direction of each change, not its size.",
        "",
    ]
    for name in order:
        body = list(sections[name])
        while body and not body[-1].strip():  # one blank line between sections, however often it is rewritten
            body.pop()
        out += [f"## {name}", "", *body, ""]
    if note_text:
        out += [note_text]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(out).rstrip() + "\n")
    print(f"[reproductions] wrote {path}", flush=True)


def report_sections(text: str, skip: Sequence[str] = ()) -> dict[str, list[str]]:
    """The `## name` sections of a report: name -> its lines (heading and blank line after it left out); the
    text before the first section and the sections headed by a line in `skip` (the notes) are dropped."""
    out: dict[str, list[str]] = {}
    name = None
    for line in text.splitlines():
        if line.startswith("## "):
            name = None if line in skip else line[3:].strip()
            if name is not None:
                out[name] = []
        elif name is not None:
            if out[name] or line.strip():
                out[name].append(line)
    return out
