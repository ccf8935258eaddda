"""A suite's forest plot: each claim's paired difference (variant − baseline, seed by seed) with its 95 % interval,
zero marked, the paper's reported gain beside it where the units compare, coloured by the verdict. One panel per
metric, since top-1 and MSE do not share an axis."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pipeline.stats import Judged
from pipeline.verdicts import (
    CONTRADICTED,
    EQUIVALENT,
    EXCLUDES_GAIN,
    REPRODUCED,
    REPRODUCED_SMALLER,
    UNHEALTHY,
    Verdict,
)

COLOURS = {  # inconclusive: grey
    REPRODUCED: "tab:green",
    REPRODUCED_SMALLER: "tab:olive",
    CONTRADICTED: "tab:red",
    EXCLUDES_GAIN: "tab:orange",
    EQUIVALENT: "tab:blue",
    UNHEALTHY: "tab:purple",
}


@dataclass(frozen=True)
class ForestRow:
    label: str  # the variant against its baseline
    metric: str  # the panel it goes in, with its direction ("top-1 (higher is better)")
    judged: Judged | Verdict  # what it draws: .diff, .verdict and .short()
    paper_gain: float | None  # the paper's variant − baseline in this metric's units, None where it has none


def forest_png(rows: Sequence[ForestRow], path: Path, title: str) -> Path:
    """Draw `rows` into `path` (PNG); returns the path."""
    import matplotlib  # matplotlib: its Agg backend chosen when a plot is drawn, not when this module loads

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    metrics = list(dict.fromkeys(r.metric for r in rows))
    heights = [sum(r.metric == m for r in rows) for m in metrics]
    # inches: the labels left of the panels and the verdicts right of them take their own width, the panels 4
    labels = 0.08 * max((len(r.label) for r in rows), default=0)
    verdicts = 0.3 + 0.065 * max((len(r.judged.short()) for r in rows), default=0)
    width = labels + 4.0 + verdicts
    fig, axes = plt.subplots(
        len(metrics),
        1,
        figsize=(width, 1.2 + 0.45 * sum(heights) + 0.6 * len(metrics)),
        gridspec_kw={"height_ratios": heights},
        squeeze=False,
    )
    for ax, metric in zip(axes[:, 0], metrics):
        mine, marked = [r for r in rows if r.metric == metric], False
        for y, r in enumerate(reversed(mine)):
            d = r.judged.diff
            colour = COLOURS.get(r.judged.verdict, "tab:gray")
            if d.n >= 2 and d.low == d.low:  # an interval (not nan)
                ax.errorbar(d.mean, y, xerr=[[d.mean - d.low], [d.high - d.mean]], fmt="o", color=colour, capsize=4)
            else:
                ax.plot(d.mean, y, "o", color=colour, mfc="none")
            if r.paper_gain is not None:
                ax.plot(r.paper_gain, y, "D", color="k", mfc="none", ms=7, label=None if marked else "paper's gain")
                marked = True
        ax.axvline(0, color="k", lw=0.8)
        ax.xaxis.set_major_locator(MaxNLocator(4))  # a narrow panel's tick labels otherwise run together
        ax.tick_params(axis="x", labelsize=7)
        ax.set_yticks(range(len(mine)), [r.label for r in reversed(mine)], fontsize=8)
        for y, r in enumerate(reversed(mine)):  # the verdict right of the panel
            colour = COLOURS.get(r.judged.verdict, "tab:gray")
            ax.text(
                1.02, y, r.judged.short(), transform=ax.get_yaxis_transform(), va="center", fontsize=8, color=colour
            )
        ax.set_ylim(-0.6, len(mine) - 0.4)
        ax.set_xlabel(f"{metric}: variant − baseline, 95 % paired interval", fontsize=8)
        if marked:
            ax.legend(fontsize=7, loc="lower right")
    axes[0, 0].set_title(title, fontsize=10)
    fig.tight_layout()  # the labels and the verdicts (texts of the axes) get their room from it
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
