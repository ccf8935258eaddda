"""The downstream steps of a suite: each run's fine-tuning and detection as child runs of it, and their table beside
the papers' direction."""

from __future__ import annotations

from collections.abc import Callable

from pipeline.config import fail
from pipeline.eval.suite import SuiteError, run_step


def run_downstream(
    runs: list[dict], downstream: dict, random_baseline: bool = True, done: Callable[[dict], None] | None = None
) -> None:
    """Each run's fine-tuning and detection (jobs/finetune.py, jobs/detect.py with `downstream`'s arguments), as child
    runs of it; the random-init baseline with the suite's first run only (and not at all without
    `random_baseline`: a further seed's). Finished ones are read back; a run read from the ledger has its results
    already. `done(run)` after each run's steps (the ledger records it)."""
    for i, r in enumerate(runs):
        if r.get("from_ledger"):
            continue
        r["downstream"] = {}
        for job, args in downstream.items():
            if job == "detect" and any("vit" in o for o in r["overrides"]):  # detection transfer takes ResNets
                print(
                    f"[reproductions] {r['label']}: no detection (the detectron2 export takes ResNet backbones)",
                    flush=True,
                )
                continue
            argv = [f"run={r['run_id']}", *r["store"], *args, f"baseline={str(i == 0 and random_baseline).lower()}"]
            print(f"[reproductions] {r['label']}: python jobs/{job}.py {' '.join(argv)}", flush=True)
            try:
                r["downstream"][job] = run_step(job, argv)
            except SuiteError as e:
                fail(f"{r['label']}, {job}: {e}")
        if done is not None:
            done(r)


def downstream_table(suite: str, runs: list[dict], downstream: dict) -> list[str]:
    """Fine-tuning (mean R² over Spirograph's four factors, or top-1 on Photos) and detection AP per run, the paper's
    direction beside ours."""
    fraction = next(
        (a.split("=", 1)[1] for a in downstream.get("finetune", []) if a.startswith("label_fraction=")), "0.1"
    )
    semi = f"semi-supervised {float(fraction) * 100:g} %"
    if not downstream or not all("downstream" in r for r in runs):
        return []
    ft = runs[0]["downstream"].get("finetune", {}).get("pretrained", {})
    ft_key = "r2" if "r2" in ft else "top1"  # Spirograph's factors, or Photos' classes
    cols = [
        (job, key, name)
        for job, key, name in (("finetune", ft_key, semi), ("detect", "AP", "detection"))
        if job in downstream
    ]
    args = {job: " ".join(a) for job, a in downstream.items()}
    lines = [
        "Downstream, each a child run of its pretraining run: "
        + "; ".join(f"`python jobs/{job}.py run=<id> {args[job]}`" for job, _, _ in cols)
        + ".",
        "",
        "| run | "
        + " | ".join(f"{name} ({ {'r2': 'R² mean', 'top1': 'top-1'}.get(key, 'shapes AP') })" for _, key, name in cols)
        + " |",
        "|" + " --- |" * (len(cols) + 1),
    ]

    def cell(results: dict | None, which: str, key: str) -> str:  # "—" where a job did not run (ViT detection)
        if not results or which not in results:
            return "—"
        return f"{results[which][key]:.3f}" if key != "AP" else f"{results[which][key]:.1f}"

    for r in runs:
        lines.append(
            f"| {r['label']} | "
            + " | ".join(cell(r["downstream"].get(job), "pretrained", key) for job, key, _ in cols)
            + " |"
        )
    base = runs[0]["downstream"]
    lines.append("| random init | " + " | ".join(cell(base.get(job), "random", key) for job, key, _ in cols) + " |")
    return lines + _paper_rows(suite, runs)


# the downstream metrics a claim may name, by the run's results: (job, key)
DOWNSTREAM = {
    "fine-tuning top-1": ("finetune", "top1"),
    "fine-tuning top-5": ("finetune", "top5"),
    "fine-tuning R²": ("finetune", "r2"),
    "detection AP": ("detect", "AP"),
    "detection AP50": ("detect", "AP50"),
}


def _paper_rows(suite: str, runs: list[dict]) -> list[str]:
    """The downstream claims conf/claims declares for the suite, each on its own arms and metric, seed 0 here beside
    the paper's numbers in its own setting (the Claims table judges them over the seeds)."""
    from pipeline.reproduce.claim_specs import load_claims

    by_label = {r["label"].split(", seed ")[0]: r for r in runs}
    rows = []
    for c in load_claims(suite):
        if c.metric not in DOWNSTREAM or c.variant not in by_label or c.baseline not in by_label:
            continue
        if c.paper.baseline is None or c.paper.variant is None:  # a figure's shape: no numbers to set beside ours
            continue
        job, key = DOWNSTREAM[c.metric]
        here = [
            (by_label[a]["downstream"].get(job) or {}).get("pretrained", {}).get(key) for a in (c.baseline, c.variant)
        ]
        if None in here:
            continue
        same = "yes" if (here[1] - here[0]) * c.direction > 0 else "no"
        rows.append(
            f"| `{c.id}`: {c.variant} vs {c.baseline} | {c.metric} | {c.paper.baseline:g} → {c.paper.variant:g} "
            f"({c.source}; {c.paper.units}) | {here[0]:.4g} → {here[1]:.4g} | {same} |"
        )
    if not rows:
        return []
    head = ["", "| claim | metric | paper, in its own setting | here (seed 0) | same direction |"]
    return head + ["| --- | --- | --- | --- | --- |", *rows]
