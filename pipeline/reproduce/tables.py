"""A suite's probe tables: each run's linear probe beside random init, the change against the baseline, and
InvCLR's invariance metrics with the direction of each change here and in the paper."""

from __future__ import annotations

from pipeline.reproduce.suites import PAPER_INVCLR, TARGETS


def fmt(x: float) -> str:
    """A number as the report prints it: four significant digits, below 1e-3 in exponent form."""
    return f"{x:.4g}" if abs(x) >= 1e-3 else f"{x:.2e}"


def _metrics(probe: dict) -> list[tuple[str, str, bool]]:
    """(column name, probe key, lower is better) of a run's probe: top-1 on class labels (Photos), else MSE per
    Spirograph target."""
    if "top1" in probe["pretrained"]:
        return [("top-1", "top1", False)]
    return [(f"MSE {t}", f"mse_{t}", True) for t in TARGETS]


def probe_table(runs: list[dict], fa: bool, own_random: bool = False) -> list[str]:
    keys = [k for k in ("pretrained", "pretrained_fa") if fa or k == "pretrained"]
    metrics = _metrics(runs[0]["probe"])
    regression = metrics[0][1].startswith("mse")
    head = "| run | " + " | ".join(
        f"{'FA ' if k.endswith('_fa') else ''}{name}" for k in keys for name, _, _ in metrics
    )
    head += " | R² m / b / σ / f_r |" if regression else " |"
    lines = [head, "|" + " --- |" * (1 + len(keys) * len(metrics) + regression)]

    def row(label: str, p: dict, which: list[str]) -> str:
        cells = [fmt(p[k][key]) for k in which for _, key, _ in metrics]
        r2 = [" / ".join(f"{p[which[0]][f'r2_{t}']:.3f}" for t in TARGETS)] if regression else []
        return f"| {label} | " + " | ".join(cells + r2) + " |"

    random = [k.replace("pretrained", "random") for k in keys]
    for r in runs:
        lines.append(row(r["label"], r["probe"], keys))
        if own_random:  # suites of different architectures: each run's random-init twin
            lines.append(row(f"{r['label']}: random init", r["probe"], random))
    if not own_random:
        lines.append(row("random init", runs[0]["probe"], random))
    return lines


def invclr_section(runs: list[dict]) -> list[str]:
    out = invariance_table(runs)
    for reg in runs[1:]:
        out += ["", f"Direction of each change ({reg['label']} against {runs[0]['label']}), here and in the paper:", ""]
        out += direction_table(runs[0], reg)
    return out


def invariance_table(runs: list[dict]) -> list[str]:
    inv = {r["label"]: r["probe"]["invariance"] for r in runs}
    base = runs[0]
    ref = base["probe"]["invariance"]["invariance_alpha_reference"]
    out = ["| | conditional variance V | α-regression test MSE | reference |", "| --- | --- | --- | --- |"]
    for r in runs:
        i = inv[r["label"]]
        out.append(
            f"| {r['label']} | {fmt(i['invariance_pretrained_conditional_variance'])} | "
            f"{fmt(i['invariance_pretrained_alpha_mse'])} | {fmt(ref)} |"
        )
    for name, p in PAPER_INVCLR.items():
        out.append(f"| paper, {name} | {p['conditional_variance']} | {p['alpha_mse']} | 0.0806 |")
    return out


def direction_table(base: dict, reg: dict) -> list[str]:
    out = ["| quantity | here | paper | same direction |", "| --- | --- | --- | --- |"]
    b, g = base["probe"]["invariance"], reg["probe"]["invariance"]
    pb, pg = PAPER_INVCLR["no regularization"], PAPER_INVCLR["gradient regularization"]
    rows: list[tuple[str, float, float, float | None, float | None]] = [
        (
            "V",
            b["invariance_pretrained_conditional_variance"],
            g["invariance_pretrained_conditional_variance"],
            pb["conditional_variance"],
            pg["conditional_variance"],
        ),
        (
            "α-regression MSE",
            b["invariance_pretrained_alpha_mse"],
            g["invariance_pretrained_alpha_mse"],
            pb["alpha_mse"],
            pg["alpha_mse"],
        ),
    ]
    for t in TARGETS:
        rows.append(
            (
                f"probe MSE {t}",
                base["probe"]["pretrained"][f"mse_{t}"],
                reg["probe"]["pretrained"][f"mse_{t}"],
                pb[f"mse_{t}"],
                pg[f"mse_{t}"],
            )
        )
        if "pretrained_fa" in base["probe"]:
            rows.append(
                (
                    f"FA probe MSE {t} (vs single-sample, penalty run)",
                    reg["probe"]["pretrained"][f"mse_{t}"],
                    reg["probe"]["pretrained_fa"][f"mse_{t}"],
                    None,
                    None,
                )
            )
    for name, here0, here1, paper0, paper1 in rows:
        here = f"{fmt(here0)} → {fmt(here1)} ({(here1 / here0 - 1) * 100:+.0f} %)"
        if paper0 is None or paper1 is None:  # feature averaging: no paper column, lower is better
            out.append(f"| {name} | {here} | lower (Fig. 5) | {'yes' if here1 < here0 else 'no'} |")
            continue
        paper = f"{fmt(paper0)} → {fmt(paper1)} ({(paper1 / paper0 - 1) * 100:+.0f} %)"
        same = (here1 - here0) * (paper1 - paper0) > 0
        out.append(f"| {name} | {here} | {paper} | {'yes' if same else 'no'} |")
    return out


def baseline_deltas(runs: list[dict], baseline: bool = True) -> list[str]:
    """Each method's probe against the baseline's (the first run; without a baseline, every run against its own
    random init) and against its random-init twin: the papers claim improvement over the baseline, and every
    method should beat random init."""
    metrics = _metrics(runs[0]["probe"])
    better = lambda new, old, lower: new < old if lower else new > old  # noqa: E731
    against = runs[0]["label"] if baseline else "random init"
    out = [
        "Probe change against "
        + against
        + " ("
        + ", ".join(f"{name}: {'negative' if lower else 'positive'} = better" for name, _, lower in metrics[:1])
        + "):",
        "",
        "| run | " + " | ".join(name for name, _, _ in metrics) + " | improved | beats random init |",
        "|" + " --- |" * (len(metrics) + 3),
    ]
    for r in runs[1:] if baseline else runs:
        p, rnd = r["probe"]["pretrained"], r["probe"]["random"]
        base = runs[0]["probe"]["pretrained"] if baseline else rnd
        change = [(p[key] / base[key] - 1) * 100 for _, key, _ in metrics]
        improved = sum(better(p[key], base[key], lower) for _, key, lower in metrics)
        beats = sum(better(p[key], rnd[key], lower) for _, key, lower in metrics)
        out.append(
            f"| {r['label']} | "
            + " | ".join(f"{c:+.1f} %" for c in change)
            + f" | {improved} of {len(metrics)} | {beats} of {len(metrics)} |"
        )
    return out
