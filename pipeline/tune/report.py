"""A sweep's results for people: the trials as a markdown table sorted by the metric, and a PNG with the metric
against each searched key (log axis where the space is log) beside each trial's per-epoch curve.

Pure: rows in, text or a file out. A row is {"trial", "params", "status", "metric", "curve", "run_id"} where
status is "done", "stopped at epoch k/E" (the scheduler) or "failed: <error>", metric is None unless done, and
curve is [(epoch, value), ...] of the per-epoch metric the plot follows.
"""

from __future__ import annotations

import math
from pathlib import Path

from pipeline.tune.space import SEED, Dim, _fmt, _is_number


def sort_rows(rows: list[dict], mode: str) -> list[dict]:
    """Best first; trials without the metric (stopped, failed) after the others, in trial order."""
    sign = 1 if mode == "min" else -1
    return sorted(
        rows,
        key=lambda r: (
            r["metric"] is None or _nan(r["metric"]),
            sign * r["metric"] if r["metric"] is not None and not _nan(r["metric"]) else 0.0,
            r["trial"],
        ),
    )


def best(rows: list[dict], mode: str) -> dict | None:
    ranked = [r for r in sort_rows(rows, mode) if r["metric"] is not None and not _nan(r["metric"])]
    return ranked[0] if ranked else None


def table(rows: list[dict], dims: list[Dim], metric: str, mode: str, baseline: float | None = None) -> str:
    """The trials as a markdown table, best first."""
    head = ["trial", *[d.key for d in dims], f"{metric} ({mode})", "status"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in sort_rows(rows, mode):
        value = "—" if r["metric"] is None else f"{r['metric']:.4g}"
        cells = [r["trial"], *[_fmt(r["params"].get(d.key)) for d in dims], value, r["status"]]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    if baseline is not None:
        lines.append(f"\nRandom-init backbone, same probe: {metric} = {baseline:.4g}")
    return "\n".join(lines) + "\n"


def by_config(rows: list[dict], dims: list[Dim], mode: str) -> list[dict]:
    """A seeded sweep's trials (sweep.seeds) grouped by configuration, the values of `dims` (the searched keys, not
    the seed): [{"params", "values": {seed: metric}, "interval": Interval over the seeds, "trials", "run_ids"}],
    those with every seed finished first, best mean first, then those missing a seed (a failed trial), then those
    no seed of which finished."""
    from pipeline.stats import mean_interval  # scipy: only for a seeded sweep's report

    groups: dict[str, dict] = {}
    for r in sorted(rows, key=lambda r: r["trial"]):
        params = {d.key: r["params"].get(d.key) for d in dims}
        g = groups.setdefault(repr(sorted(params.items(), key=lambda kv: kv[0])), _group(params))
        g["trials"].append(r["trial"])
        g["run_ids"].append(r.get("run_id"))
        if r["metric"] is not None and not _nan(r["metric"]):
            g["values"][int(r["params"].get(SEED, 0))] = float(r["metric"])
    out = list(groups.values())
    for g in out:
        g["interval"] = mean_interval([g["values"][k] for k in sorted(g["values"])])
    sign = 1 if mode == "min" else -1
    seeds = max((len(g["trials"]) for g in out), default=0)
    return sorted(
        out,
        key=lambda g: (not g["values"], len(g["values"]) < seeds, sign * g["interval"].mean if g["values"] else 0.0),
    )


def _group(params: dict) -> dict:
    return {"params": params, "values": {}, "trials": [], "run_ids": []}


def best_config(groups: list[dict]) -> dict | None:
    """The best of by_config's groups (its first), or None where no seed of any configuration finished."""
    return groups[0] if groups and groups[0]["values"] else None


def seeded_table(groups: list[dict], dims: list[Dim], metric: str) -> str:
    """One line per configuration of by_config's `groups`: the metric's mean over the seeds with its 95 % Student-t
    interval, and the paired difference to the best configuration (seed by seed, 95 % interval): where that interval
    holds 0 the seeds cannot tell the configuration from the best."""
    from pipeline.stats import paired_difference  # scipy: only for a seeded sweep's report

    top = best_config(groups)
    head = [*[d.key for d in dims], f"{metric} mean [95 % interval]", "seeds", "minus the best, paired [95 %]", "tied"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for g in groups:
        iv = g["interval"]
        mean = "—" if not g["values"] else f"{iv.mean:.4g}" + ("" if iv.n < 2 else f" [{iv.low:.4g}, {iv.high:.4g}]")
        gap = None if top is None or g is top else paired_difference(g["values"], top["values"])
        if gap is None or gap.n == 0:  # the best itself, or no seed finished in both
            diff, tied = ("best" if g is top else "—"), ""
        else:
            diff = f"{gap.mean:+.4g}" + ("" if gap.n < 2 else f" [{gap.low:+.4g}, {gap.high:+.4g}]")
            tied = "—" if gap.n < 2 else ("yes" if gap.low <= 0 <= gap.high else "no")
        cells = [*[_fmt(g["params"][d.key]) for d in dims], mean, str(iv.n), diff, tied]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(
    rows: list[dict],
    dims: list[Dim],
    metric: str,
    mode: str,
    path: Path,
    title: str,
    curve_metric: str | None = None,
    baseline: float | None = None,
    configs: list[dict] | None = None,
) -> Path:
    """One panel per searched key (the metric against its values; the best trial ringed; with `configs`, a seeded
    sweep's by_config, each configuration's mean and 95 % interval beside its seeds), and, when the trials report a
    per-epoch curve, one panel of those curves (where the scheduler stopped a trial, its curve ends)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = curve_metric is not None and any(r["curve"] for r in rows)
    n = len(dims) + int(curves)
    fig, axes = plt.subplots(1, n, figsize=(4.2 * n, 3.6), squeeze=False)
    done = [r for r in rows if r["metric"] is not None and not _nan(r["metric"])]
    # the best trial ringed; in a seeded sweep the best configuration's mean instead
    top = best(rows, mode) if not configs else None
    top_config = best_config(configs or [])
    for ax, d in zip(axes[0], dims):
        xs, labels = _positions(d, [r["params"].get(d.key) for r in done])
        ax.scatter(xs, [r["metric"] for r in done], color="tab:blue", zorder=3, label="trials")
        if top is not None:
            x_top = xs[done.index(top)]
            ax.scatter([x_top], [top["metric"]], s=160, facecolors="none", edgecolors="tab:red", zorder=4, label="best")
        unscored = [r for r in rows if r not in done]
        if unscored:  # where the stopped and failed trials were, along the bottom
            xu, _ = _positions(d, [r["params"].get(d.key) for r in unscored])
            ax.scatter(
                xu,
                [0.02] * len(xu),
                marker="x",
                color="grey",
                transform=ax.get_xaxis_transform(),
                label="stopped / failed",
                zorder=3,
            )
        scored = [g for g in configs or [] if g["values"]]
        if scored:
            gx, _ = _positions(d, [g["params"].get(d.key) for g in scored])
            iv = [g["interval"] for g in scored]
            low = [0.0 if math.isnan(i.low) else i.mean - i.low for i in iv]
            high = [0.0 if math.isnan(i.high) else i.high - i.mean for i in iv]
            ax.errorbar(
                gx,
                [i.mean for i in iv],
                yerr=[low, high],
                fmt="s",
                color="black",
                ms=5,
                capsize=4,
                zorder=5,
                label="mean, 95 % interval",
            )
            if top_config is not None:
                (bx,), _ = _positions(d, [top_config["params"].get(d.key)])
                m = top_config["interval"].mean
                ax.scatter([bx], [m], s=160, facecolors="none", edgecolors="tab:red", zorder=6, label="best mean")
        if baseline is not None:
            ax.axhline(baseline, color="grey", ls="--", lw=1, label="random init")
        _axis(ax, d, xs, labels)
        ax.set_xlabel(d.key)
        ax.set_ylabel(f"{metric} ({'lower' if mode == 'min' else 'higher'} is better)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=9)
    if curves:
        ax = axes[0][-1]
        for r in rows:
            if r["curve"]:
                ep, val = zip(*r["curve"])
                ax.plot(
                    ep,
                    val,
                    marker="o",
                    ms=3,
                    label=f"{r['trial']} {_short_params(r['params'])}"[:40],
                    ls="-" if r["status"] == "done" else ":",
                )
        ax.set_xlabel("epoch")
        ax.set_ylabel(curve_metric)
        ax.set_title("per epoch (dotted: stopped early)", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    stopped = sum(r["status"].startswith("stopped") for r in rows)
    failed = sum(r["status"].startswith("failed") for r in rows)
    extra = ", ".join(
        s for s in (f"{stopped} stopped early" if stopped else "", f"{failed} failed" if failed else "") if s
    )
    fig.suptitle(f"{title}: {len(done)} of {len(rows)} trials scored" + (f" ({extra})" if extra else ""), fontsize=11)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _positions(d: Dim, values: list) -> tuple[list[float], list[str] | None]:
    """x positions of the values: the numbers themselves, or for other values (lists, names) their index in the
    space with the values as tick labels."""
    if d.is_range or all(_is_number(v) for v in d.values):
        return [float(v) for v in values], None
    order = [_fmt(v) for v in d.values]
    return [float(order.index(_fmt(v))) for v in values], order


def _axis(ax, d: Dim, xs: list[float], labels: list[str] | None) -> None:
    """Tick labels for non-numeric values; otherwise the whole searched range in view, on a log axis where the
    space is log (symlog when it holds 0, e.g. a penalty weight of 0 = off)."""
    if labels is not None:
        ax.set_xticks(range(len(labels)), labels, rotation=20, fontsize=9)
        ax.set_xlim(-0.5, len(labels) - 0.5)
        return
    lo, hi = min((*xs, *map(float, d.values))), max((*xs, *map(float, d.values)))
    if d.log:
        positive = [float(v) for v in (*xs, *d.values) if float(v) > 0]
        if lo <= 0:
            ax.set_xscale("symlog", linthresh=min(positive) if positive else 1.0)
            ax.set_xlim(lo - 0.1 * (hi - lo) if lo < 0 else -0.5 * min(positive, default=1.0), hi * 1.5)
        else:
            ax.set_xscale("log")
            ax.set_xlim(lo / 1.5, hi * 1.5)
    elif hi > lo:
        pad = 0.05 * (hi - lo)
        ax.set_xlim(lo - pad, hi + pad)


def _short_params(params: dict) -> str:
    return ", ".join(f"{k.split('.')[-1]}={_fmt(v)}" for k, v in params.items())


def _nan(v) -> bool:
    return isinstance(v, float) and math.isnan(v)
