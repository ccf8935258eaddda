"""A scale ladder (issue #51): one declared claim's two arms trained at a few budgets (each budget's overrides on top
of the report's scale), at seeds 0..n-1 each, recorded in the ledger beside the report as every other run is; the
report's `## Ladder` section: a row per budget (its steps, the wall-clock minutes of its runs, the paired difference
with its 95 % interval and the verdict, each budget judged alone by verdict_table.judge_claim), the difference plotted
against compute, and one sentence computed from the numbers: does the gap open or close as the budget grows.

Pure planning and drawing: which runs a ladder asks for, and what its section says of their results; the runs are
trained (or read back from the ledger) by pipeline.reproduce.job's run path."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.config import compose_config
from pipeline.reproduce.claim_specs import Claim
from pipeline.reproduce.tables import fmt

if TYPE_CHECKING:  # scipy and statsmodels load when a ladder is judged, not when the job checks its command line
    from pipeline.reproduce.verdict_table import ClaimRow
    from pipeline.stats import Interval

KEYS = {"claim", "budgets", "seeds"}


@dataclass(frozen=True)
class Ladder:
    claim: Claim
    budgets: tuple[tuple[str, ...], ...]  # each budget's key=value overrides, on top of the scale
    seeds: int


@dataclass(frozen=True)
class LadderRun:
    budget: int  # its index in Ladder.budgets
    label: str  # the arm, as SUITES names it
    overrides: list[str]  # the arm's, with its seed
    scale: list[str]  # the report's scale with the budget's overrides on top
    seed: int
    extra: list[str] = field(default_factory=list)  # the suite's extra overrides but those the budget sets


@dataclass(frozen=True)
class Rung:
    """One budget's results: the claim judged on its runs."""

    budget: str  # its overrides, as written
    steps: int | None  # optimiser steps of one run (None where the data's size is not in the config)
    minutes: float  # the recorded minutes of its runs, summed (nan where none recorded any)
    runs: int  # the runs with recorded minutes
    row: ClaimRow | None  # None where the two arms share no seed with the metric

    @property
    def per_run(self) -> float:
        return self.minutes / self.runs if self.runs else math.nan


def parse_ladder(value: Any, claims: Mapping[str, Sequence[Claim]]) -> Ladder | None:
    """The `ladder` config key checked: None for none, else a Ladder of a declared claim (`claims`: suite -> its
    claims); ValueError with one line otherwise."""
    if value is None:
        return None
    if not isinstance(value, Mapping) or set(value) != KEYS:
        raise ValueError(f"ladder={value!r:.120}: expected null or a mapping of claim, budgets and seeds")
    known = {c.id: c for cs in claims.values() for c in cs}
    if value["claim"] not in known:
        raise ValueError(f"ladder.claim={value['claim']!r}: unknown claim id; known: {sorted(known)}")
    if known[value["claim"]].metric.startswith(("fine-tuning", "detection")):  # its runs take no downstream steps
        raise ValueError(f"ladder.claim={value['claim']}: a downstream metric; the ladder probes its runs only")
    budgets = value["budgets"]
    well_formed = isinstance(budgets, Sequence) and not isinstance(budgets, str) and len(budgets) > 0
    well_formed = well_formed and all(
        isinstance(b, Sequence) and not isinstance(b, str) and b and all(_override(o) for o in b) for b in budgets
    )
    if not well_formed:
        raise ValueError(f"ladder.budgets={budgets!r:.120}: expected a non-empty list of lists of key=value strings")
    seeds = value["seeds"]
    if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 2:
        raise ValueError(f"ladder.seeds={seeds!r}: expected an integer >= 2 (the paired interval needs two)")
    return Ladder(known[value["claim"]], tuple(tuple(b) for b in budgets), seeds)


def _override(o: Any) -> bool:
    return isinstance(o, str) and "=" in o and not o.startswith("=")


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def budget_scale(scale: Sequence[str], budget: Sequence[str]) -> list[str]:
    """The scale with the budget's overrides on top: a key both set takes the budget's value in the scale's place,
    the budget's other keys after the scale (so that a budget of the scale's own values is the scale itself, its
    runs the ones the suites recorded)."""
    values = {_key(o): o for o in budget}
    return [values.pop(_key(o), o) for o in scale] + list(values.values())


def budget_extra(extra: Sequence[str], budget: Sequence[str]) -> list[str]:
    """The suite's extra overrides less the keys the budget sets: they come after the scale, and the budget wins."""
    keys = {_key(o) for o in budget}
    return [o for o in extra if _key(o) not in keys]


def ladder_runs(
    ladder: Ladder, arms: Sequence[tuple[str, list[str]]], scale: Sequence[str], extra: Sequence[str] = ()
) -> list[LadderRun]:
    """Every run the ladder asks for, budget by budget and seed by seed (a seed's two arms together): the claim's
    baseline and variant (`arms`: its suite's (label, overrides)) at seeds 0..ladder.seeds-1."""
    overrides = dict(arms)
    labels = list(dict.fromkeys((ladder.claim.baseline, ladder.claim.variant)))  # one arm for an averaged claim
    return [
        LadderRun(
            i, label, [*overrides[label], f"seed={s}"], budget_scale(scale, budget), s, budget_extra(extra, budget)
        )
        for i, budget in enumerate(ladder.budgets)
        for s in range(ladder.seeds)
        for label in labels
    ]


def steps(overrides: Sequence[str], scale: Sequence[str]) -> int | None:
    """One run's optimiser steps: epochs × full batches of the embedded data (as the scale card counts them)."""
    cfg = compose_config([*overrides, *scale])
    images = int((cfg["data"].get("generate") or {}).get("n_train") or 0)
    return int(cfg["train"]["epochs"]) * (images // int(cfg["train"]["batch_size"])) if images else None


def _steps(baseline: list[str], run: LadderRun) -> int | None:
    """Steps of the baseline's run at `run`'s budget, with the extra keys that apply to the baseline (a plug-in's
    settings only where it uses that plug-in, as run_one composes them)."""
    from pipeline.reproduce.runs import applicable

    return steps(baseline, [*run.scale, *applicable(baseline, run.scale, run.extra)])


def rungs(
    ladder: Ladder, runs: Sequence[LadderRun], results: Sequence[Mapping], arms: Sequence[tuple[str, list[str]]]
) -> list[Rung]:
    """Each budget's rung from its runs' results (`results[i]`: run_one's result of `runs[i]`)."""
    from pipeline.reproduce.verdict_table import judge_claim

    out = []
    for i, budget in enumerate(ladder.budgets):
        mine = [(r, res) for r, res in zip(runs, results) if r.budget == i]
        by_arm: dict[str, dict[int, Mapping]] = {}
        for r, res in mine:
            by_arm.setdefault(r.label, {})[r.seed] = res
        minutes = [m for _, res in mine if (m := float(res.get("minutes") or math.nan)) == m]
        out.append(
            Rung(
                " ".join(budget),
                _steps(dict(arms)[ladder.claim.baseline], mine[0][0]) if mine else None,
                sum(minutes) if minutes else math.nan,
                len(minutes),
                judge_claim(ladder.claim, by_arm),
                # judged alone: no family to adjust it with
            )
        )
    return out


def _x(rs: Sequence[Rung]) -> tuple[list[float], str]:
    """The compute axis: optimiser steps per run (one architecture and batch: compute is proportional to them), or
    wall-clock minutes per run where a rung's steps are not known. Not minutes first: they are wall-clock time on
    whatever machine and beside whatever concurrent run made each one (the ledger's runs of one config vary 2x)."""
    if all(r.steps for r in rs):
        return [float(r.steps or 0) for r in rs], "steps per run"
    return [r.per_run if r.per_run > 0 else math.nan for r in rs], "wall-clock minutes per run"


def trend(rs: Sequence[Rung], direction: int) -> str:
    """One sentence from the numbers: does the gap (|variant − baseline|) open or close as the budget grows: the
    least-squares slope of |difference| against log2 of the compute, the side of 0 the largest budget's difference
    lies on, and whether the largest budget's difference differs from the smallest's beyond the seeds' noise."""
    judged = [r for r in rs if r.row is not None]
    xs, unit = _x(judged)
    points = sorted(((x, r) for x, r in zip(xs, judged) if x > 0), key=lambda p: p[0])
    if len(points) < 2 or len({x for x, _ in points}) < 2:
        return "Fewer than two budgets of different compute judged: no trend to read."
    lx = [math.log2(x) for x, _ in points]
    gap = [abs(r.row.verdict.diff.mean) for _, r in points]  # type: ignore[union-attr]
    mx, my = sum(lx) / len(lx), sum(gap) / len(gap)
    slope = sum((a - mx) * (b - my) for a, b in zip(lx, gap)) / sum((a - mx) ** 2 for a in lx)
    word = "opens" if slope > 0 else "closes" if slope < 0 else "neither opens nor closes"
    (_, lo), (_, hi) = points[0], points[-1]
    a, b = lo.row.verdict.diff, hi.row.verdict.diff  # type: ignore[union-attr]
    side = direction * b.mean
    where = "on the paper's side of 0" if side > 0 else "against the paper's direction" if side < 0 else "at 0"
    crossed = " (it changes sign)" if a.mean * b.mean < 0 else ""
    return (
        f"The gap {word} with the budget: |difference| {fmt(abs(a.mean))} at {lo.budget} and {fmt(abs(b.mean))} at "
        f"{hi.budget}{crossed} (least-squares slope {slope:+.3g} per doubling of {unit}), {where} at the largest "
        f"budget; {_ends(lo, hi)}."
    )


def _ends(lo: Rung, hi: Rung) -> str:
    """Whether the difference at the largest budget differs from the smallest's by more than the seeds' noise:
    Welch's t on the two rungs' per-seed differences (separate runs: not paired by seed), one test, unadjusted."""
    from pipeline.stats import LEVEL, welch_difference

    d_lo, d_hi = lo.row.diffs(), hi.row.diffs()  # type: ignore[union-attr]
    change, p = welch_difference(d_lo, d_hi)
    if p != p:
        return "an end has fewer than two seeds or no spread, so the change cannot be told from noise"
    said = "beyond the seeds' noise" if p < 1 - LEVEL else "within the seeds' noise"
    return (
        f"the difference changes by {fmt(change.mean)} [{fmt(change.low)}, {fmt(change.high)}] from the smallest "
        f"budget to the largest (Welch's t on the per-seed differences, {len(d_lo)} and {len(d_hi)} seeds: "
        f"p = {p:.2g}), {said}"
    )


def _interval(d: Interval) -> bool:
    return d.n >= 2 and d.low == d.low and d.low < d.high


def png_name(report: Path, claim: Claim) -> str:
    """The ladder's plot beside `report`, named for the report (another report's command never overwrites it)."""
    return f"{report.stem}-ladder-{claim.id}.png"


def ladder_png(rs: Sequence[Rung], claim: Claim, path: Path) -> Path:
    """The difference ± its 95 % interval against compute (log axis), 0 and the paper's gain marked."""
    import matplotlib  # the Agg backend chosen when a plot is drawn, not when this module loads

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from pipeline.reproduce.forest import COLOURS
    from pipeline.reproduce.verdict_table import paper_gain

    judged = [r for r in rs if r.row is not None]
    xs, unit = _x(judged)
    fig, ax = plt.subplots(figsize=(6.0, 3.6))
    for x, r in zip(xs, judged):
        d = r.row.verdict.diff  # type: ignore[union-attr]
        colour = COLOURS.get(r.row.verdict.verdict, "tab:gray")  # type: ignore[union-attr]
        if _interval(d):
            ax.errorbar(x, d.mean, yerr=[[d.mean - d.low], [d.high - d.mean]], fmt="o", color=colour, capsize=4)
        else:
            ax.plot(x, d.mean, "o", color=colour, mfc="none")
        ax.annotate(r.budget, (x, d.mean), textcoords="offset points", xytext=(6, 6), fontsize=7)
    ax.axhline(0, color="k", lw=0.8)
    gain = paper_gain(claim)
    if gain is not None:
        ax.axhline(gain, color="k", ls="--", lw=0.8, label="paper's gain")
        ax.legend(fontsize=7, loc="best")
    ax.set_xscale("log")
    if xs:  # each budget's compute as its tick, the labels right of the points kept inside
        ax.set_xticks(xs, [f"{x:.3g}" for x in xs])
        ax.minorticks_off()
        ax.set_xlim(min(xs) / 1.3, max(xs) * 1.6)
    log = judged[0].row.log if judged else False  # type: ignore[union-attr]
    ax.set_xlabel(f"{unit} (log scale)", fontsize=8)
    ax.set_ylabel(f"{claim.metric}{', log ratio' if log else ''}\nvariant − baseline (95 %)", fontsize=8)
    ax.set_title(f"{claim.id}: {claim.variant} vs {claim.baseline}", fontsize=9)
    ax.tick_params(labelsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _downstream(ladder: Ladder, scale: Sequence[str], extra: Sequence[str]) -> str:
    """What the section says of its runs' downstream steps: none were trained for the ladder, but a budget that
    changes neither the scale nor the suite's `extra` overrides is the suite's own runs, which may have run them
    (after the probe, the one metric the ladder reads)."""
    own = [
        " ".join(b)
        for b in ladder.budgets
        if budget_scale(scale, b) == list(scale) and budget_extra(extra, b) == list(extra)
    ]
    if not own:
        return "trained without downstream steps"
    return (
        f"trained without downstream steps, but for `{'`, `'.join(own)}`: the scale's own budget, whose runs are the "
        "suite's own (with the suite's downstream steps where it ran any, after the probe the ladder reads)"
    )


def ladder_section(
    ladder: Ladder, rs: Sequence[Rung], scale: Sequence[str], report: Path, extra: Sequence[str] = ()
) -> list[str]:
    """The report's `## Ladder` section (its plot written to img/ beside `report`; `extra`: the claim's suite's
    extra overrides)."""
    c = ladder.claim
    log = any(r.row is not None and r.row.log for r in rs)
    lines = [
        f"Scale ladder of `{c.id}` ({c.variant} vs {c.baseline}, {c.metric}{', log ratio' if log else ''}): both "
        f"arms at each budget (its overrides on top of the scale `{' '.join(scale)}`), seeds 0..{ladder.seeds - 1}, "
        f"{_downstream(ladder, scale, extra)}. Each budget is judged alone (verdict_table.judge_claim, without the "
        "Claims table's Holm adjustment). Compute is the optimiser steps per run (one architecture and batch size: "
        "compute is proportional to them); the wall-clock minutes are the runs' recorded `minutes`, which depend on "
        "what else the machine ran beside each run, so they are not the axis.",
        "",
        "| budget | steps per run | wall-clock minutes (runs; per run) | difference, variant − baseline (95 %) "
        "| verdict |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in rs:
        cpu = f"{r.minutes:.1f} ({r.runs}; {r.per_run:.2f})" if r.runs else "—"
        if r.row is None:
            diff, verdict = "—", "no shared seeds"
        else:
            d = r.row.verdict.diff
            diff = f"{fmt(d.mean)} [{fmt(d.low)}, {fmt(d.high)}]" if _interval(d) else fmt(d.mean)
            verdict = r.row.verdict.words()
        lines.append(f"| `{r.budget}` | {r.steps if r.steps is not None else '—'} | {cpu} | {diff} | {verdict} |")
    lines += ["", trend(rs, c.direction)]
    if any(r.row is not None for r in rs):
        png = ladder_png(rs, c, report.parent / "img" / png_name(report, c))
        lines += ["", f"![{c.id}: the difference against compute](img/{png.name})"]
    return lines
