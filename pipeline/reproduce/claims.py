"""A suite's section of the seeded claims: each declared claim (conf/claims) of the suite as the Claims table judged
it (pipeline.reproduce.verdict_table), with both arms' means over the seeds, and the suite's forest plot."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from pipeline.reproduce.forest import ForestRow, forest_png
from pipeline.reproduce.tables import fmt
from pipeline.reproduce.verdict_table import ClaimRow
from pipeline.stats import mean_interval


def _pm(values: dict[int, float]) -> str:
    i = mean_interval(list(values.values()))
    return fmt(i.mean) if i.n < 2 else f"{fmt(i.mean)} ± {fmt(i.half_width)}"


def forest_name(report: Path, suite: str) -> str:
    """The suite's forest plot beside `report`: named for the report, so that another report's command (another
    scale, other seeds) never overwrites a plot this one links."""
    return f"{report.stem}-forest-{suite}.png"


def seeded_section(suite: str, rows: Sequence[ClaimRow], seeds: int, report: Path) -> tuple[list[str], Path | None]:
    """The suite's claims over its seeds and its forest plot (written to img/ beside `report`); returns the lines
    and the plot's path."""
    if not rows:
        return [], None
    seeds = max(r.verdict.diff.n for r in rows)  # primary claims' arms may have more than the command's seeds
    lines = [
        f"Seeded comparison, up to {seeds} seeds (`seed=0..`, the same for every arm), of the claims "
        "`conf/claims/` declares for this suite: each arm's mean ± the half-width of its 95 % Student-t interval; "
        "the difference is taken seed by seed (on log ratios for MSE and V). The verdicts are the Claims table's, "
        "after its adjustment for many comparisons.",
        "",
        "| claim | metric | paper | baseline | variant | difference (95 %) | verdict |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        c, d = r.claim, r.verdict.diff
        ci = f"{fmt(d.mean)} [{fmt(d.low)}, {fmt(d.high)}]" if d.n >= 2 and d.low == d.low else fmt(d.mean)
        variant = f"{c.variant}, averaged" if c.representation == "averaged" else c.variant
        lines.append(
            f"| `{c.id}`: {variant} vs {c.baseline} | {c.metric}{' (log ratio)' if r.log else ''} | {c.source} | "
            f"{_pm(r.baseline)} | {_pm(r.variant)} | {ci} | {r.verdict.words()} |"
        )
    png = report.parent / "img" / forest_name(report, suite)
    better = {+1: "higher is better", -1: "lower is better"}
    forest_png(
        [
            ForestRow(
                r.claim.id,
                f"{r.claim.metric}{', log ratio' if r.log else ''} ({better[r.claim.direction]})",
                r.verdict,
                r.paper_gain,
            )
            for r in rows
        ],
        png,
        f"{suite}: paired differences over up to {seeds} seeds",
    )
    lines += ["", f"![{suite}: paired differences](img/{png.name})"]
    return lines, png
