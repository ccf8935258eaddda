"""A suite's claims judged on its seeds: every variant against the suite's baseline (and CoCor's learned targets
against its fixed ones) on each metric the runs report (the probe, InvCLR's conditional variance, fine-tuning,
detection), each arm's mean ± 95 % interval over the seeds, the paired difference, the verdict in the paper's
direction (every seed paper claims its variant does better), and the suite's forest plot."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.reproduce.forest import ForestRow, forest_png
from pipeline.reproduce.suites import PAPER_DOWNSTREAM, PAPER_INVCLR, PAPER_TABLE5, TARGETS
from pipeline.reproduce.tables import fmt
from pipeline.stats import Judged, judge

# the papers' ImageNet linear top-1 of each variant against its baseline (docs/methods/), and the gain in the
# probe's units (a fraction), marked on the forest plot: another dataset and scale, so a mark of direction and
# rough size, not a number to match
PAPER_PROBE = {
    ("co2", "MoCo v2 + CO2"): ("67.5 → 68.0 (CO2 Table 1)", 0.005),
    ("clsa", "MoCo v2 + CLSA"): ("67.5 → 69.4 (CLSA Table 2)", 0.019),
    ("clsa", "MoCo v2 + CLSA* (multi-crop)"): ("67.5 → 73.3 (CLSA Table 2)", 0.058),
    ("cocor", "MoCo v2 + CoCor, learned targets (1 % labels)"): ("67.04 → 71.66 (CoCor Tables 1, 7; IN-100)", 0.0462),
    ("cocor", "MoCo v2 + CoCor, fixed targets (Table 9)"): ("67.04 → 69.51 (CoCor Table 7; IN-100)", 0.0247),
    ("jointcrop", "MoCo v3 + JointCrop β=0"): ("68.9 → 69.47 (JointCrop Table 1)", 0.0057),
    **{
        ("jointcrop_table5", f"MoCo v2 + JointCrop β={b}"): (
            f"{PAPER_TABLE5[None]} → {PAPER_TABLE5[b]} (JointCrop Table 5)",
            (PAPER_TABLE5[b] - PAPER_TABLE5[None]) / 100,
        )
        for b in (2, 1, 0, -1, -2)
    },
}
# claims between two variants, beside each variant against the baseline
EXTRA_PAIRS = {
    "cocor": [
        ("MoCo v2 + CoCor, learned targets (1 % labels)", "MoCo v2 + CoCor, fixed targets (Table 9)", "71.66 vs 69.51")
    ],
    # Table 5's optimum against the other end of its range
    "jointcrop_table5": [("MoCo v2 + JointCrop β=-2", "MoCo v2 + JointCrop β=2", "48.78 vs 46.65 (Table 5)")],
}


@dataclass(frozen=True)
class Metric:
    name: str  # as the table and plot print it
    path: tuple[str, ...]  # where a run's results hold it
    direction: int  # +1: higher is better (top-1, R², AP); -1: lower (MSE, conditional variance)


def value(run: Mapping, path: Sequence[str]) -> float | None:
    """A run's result at `path`, or None where the run lacks it (a job that did not run)."""
    node: Any = run
    for key in path:
        if not isinstance(node, Mapping) or key not in node:
            return None
        node = node[key]
    return float(node)


def metrics_of(run: Mapping) -> list[Metric]:
    """What a suite's runs report: the probe (top-1, or MSE per Spirograph factor), InvCLR's conditional variance,
    the fine-tuning and the detection when they ran."""
    probe = run["probe"]["pretrained"]
    if "top1" in probe:
        out = [Metric("probe top-1", ("probe", "pretrained", "top1"), +1)]
    else:
        out = [Metric(f"probe MSE {t}", ("probe", "pretrained", f"mse_{t}"), -1) for t in TARGETS]
    if "invariance" in run["probe"]:
        v = ("probe", "invariance", "invariance_pretrained_conditional_variance")
        out.append(Metric("conditional variance V", v, -1))
    ft = (run.get("downstream") or {}).get("finetune", {}).get("pretrained", {})
    for key in ("top1", "r2"):
        if key in ft:
            out.append(
                Metric(
                    f"fine-tuning {'top-1' if key == 'top1' else 'R²'}",
                    ("downstream", "finetune", "pretrained", key),
                    +1,
                )
            )
    if "AP" in (run.get("downstream") or {}).get("detect", {}).get("pretrained", {}):
        out.append(Metric("detection AP", ("downstream", "detect", "pretrained", "AP"), +1))
    return out


@dataclass(frozen=True)
class Row:
    variant: str
    baseline: str
    metric: Metric
    paper: str  # the paper's numbers, in words ("" where it reports none for this metric)
    paper_gain: float | None  # in this metric's units, for the forest plot
    judged: Judged


PROBE_TOP1 = ("probe", "pretrained", "top1")


def _paper(suite: str, variant: str, metric: Metric, against_baseline: bool, words: str) -> tuple[str, float | None]:
    if suite == "invclr" and against_baseline:
        return _paper_invclr(metric), None
    if metric.path != PROBE_TOP1 and metric.name != "detection AP":
        return "", None
    if not against_baseline:  # two variants (CoCor's targets): the paper's numbers in words only
        return (words, None) if metric.path == PROBE_TOP1 else ("", None)
    if metric.path == PROBE_TOP1:
        return PAPER_PROBE.get((suite, variant), ("", None))
    detection = PAPER_DOWNSTREAM.get(suite, {}).get("detection")
    return (detection[0], None) if detection else ("", None)


def _paper_invclr(metric: Metric) -> str:
    """InvCLR's Spirograph numbers without and with the penalty (Tables 8, 9; λ = 0.01, 100k images, 50 epochs):
    in words only: ours are at another scale (the probe MSEs 2 to 500 times the paper's, V 40 times smaller)."""
    before, after = PAPER_INVCLR["no regularization"], PAPER_INVCLR["gradient regularization"]
    if metric.name == "conditional variance V":
        key, table = "conditional_variance", 8
    elif metric.name.startswith("probe MSE "):
        key, table = f"mse_{metric.name.removeprefix('probe MSE ')}", 9
    else:
        return ""
    return f"{before[key]:.3g} → {after[key]:.3g} (InvCLR Table {table}, λ = 0.01)"


def judge_suite(suite: str, arms: Mapping[str, Mapping[int, Mapping]]) -> list[Row]:
    """arms: label -> {seed: the run's results}, the baseline first. A row per claim and metric that both arms
    have at one seed or more."""
    labels = list(arms)
    pairs = [(v, labels[0], "") for v in labels[1:]] + [p for p in EXTRA_PAIRS.get(suite, []) if p[0] in arms]
    first = next(iter(arms[labels[0]].values()))
    rows = []
    for variant, baseline, words in pairs:
        for m in metrics_of(first):
            per = {
                label: {s: x for s, run in arms[label].items() if (x := value(run, m.path)) is not None}
                for label in (variant, baseline)
            }
            if not set(per[variant]) & set(per[baseline]):
                continue
            paper, gain = _paper(suite, variant, m, baseline == labels[0], words)
            rows.append(Row(variant, baseline, m, paper, gain, judge(per[variant], per[baseline], m.direction)))
    return rows + feature_averaging(arms)


def feature_averaging(arms: Mapping[str, Mapping[int, Mapping]]) -> list[Row]:
    """InvCLR's feature averaging (Fig. 5): within each arm that probed both, the averaged representation against
    the plain one, seed by seed, on every target's MSE (lower is better)."""
    rows = []
    for label, runs in arms.items():
        first = next(iter(runs.values()))
        if "pretrained_fa" not in first["probe"]:
            continue
        for t in TARGETS:
            plain, averaged = (("probe", k, f"mse_{t}") for k in ("pretrained", "pretrained_fa"))
            per = [
                {s: x for s, run in runs.items() if (x := value(run, path)) is not None} for path in (plain, averaged)
            ]
            if not per[0] or not per[1]:
                continue
            m = Metric(f"probe MSE {t}", averaged, -1)
            rows.append(
                Row(f"{label}, averaged", label, m, "lower MSE (InvCLR Fig. 5)", None, judge(per[1], per[0], -1))
            )
    return rows


def _pm(i) -> str:
    return fmt(i.mean) if i.n < 2 else f"{fmt(i.mean)} ± {fmt(i.half_width)}"


def seeded_section(suite: str, rows: Sequence[Row], seeds: int, docs: Path) -> tuple[list[str], Path | None]:
    """The suite's claims table and forest plot (written to docs/img/); returns the lines and the plot's path."""
    if not rows:
        return [], None
    lines = [
        f"Seeded comparison, {seeds} seeds (`seed=0..{seeds - 1}`, the same for every arm): each arm's mean ± the "
        "half-width of its 95 % Student-t interval over the seeds; the difference is taken seed by seed (paired t). "
        "Verdict: reproduced where the interval excludes 0 on the paper's side, contradicted on the other.",
        "",
        "| claim | metric | paper | baseline | variant | difference (95 %) | verdict |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        d = r.judged.diff
        ci = f"{fmt(d.mean)} [{fmt(d.low)}, {fmt(d.high)}]" if d.n >= 2 else fmt(d.mean)
        lines.append(
            f"| {r.variant} vs {r.baseline} | {r.metric.name} | {r.paper or '—'} | {_pm(r.judged.baseline)} | "
            f"{_pm(r.judged.variant)} | {ci} | {r.judged.words()} |"
        )
    png = docs / "img" / f"forest-{suite}.png"
    better = {+1: "higher is better", -1: "lower is better"}
    forest_png(
        [
            ForestRow(
                f"{r.variant} vs {r.baseline}",
                f"{r.metric.name} ({better[r.metric.direction]})",
                r.judged,
                r.paper_gain,
            )
            for r in rows
        ],
        png,
        f"{suite}: paired differences over {seeds} seeds",
    )
    lines += ["", f"![{suite}: paired differences](img/{png.name})"]
    return lines, png
