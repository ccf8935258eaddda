"""A probe's results as a run keeps them (its probe/* metrics) and as a table: no torch, so a job that only shows
a finished run's results starts in seconds."""

from __future__ import annotations


def probe_results(metrics: dict[str, float]) -> dict[str, dict[str, float]]:
    """compare_with_random's results read back from a run's metrics (probe/<backbone>_<metric>,
    probe/invariance_*); {} when the run was never probed."""
    out: dict[str, dict[str, float]] = {}
    kinds = ("pretrained_fa", "random_fa", "pretrained", "random")
    for key, value in sorted(metrics.items()):
        group, _, rest = key.partition("/")
        if group != "probe":
            continue
        if rest.startswith("invariance_"):
            out.setdefault("invariance", {})[rest] = value
        else:
            kind = next((k for k in kinds if rest.startswith(k + "_")), None)
            if kind:
                out.setdefault(kind, {})[rest[len(kind) + 1 :]] = value
    if "pretrained" not in out:
        return {}
    order = ["pretrained", "pretrained_fa", "random", "random_fa", "invariance"]
    return {k: out[k] for k in order if k in out}


def format_table(results: dict[str, dict[str, float]]) -> str:
    """Rows: metrics; columns: backbones (e.g. pretrained, random)."""
    cols = list(results)
    keys = list(next(iter(results.values())))
    w = max(len(k) for k in keys) + 2
    cw = {c: max(12, len(c) + 2) for c in cols}
    lines = ["metric".ljust(w) + "".join(c.rjust(cw[c]) for c in cols)]
    for k in keys:
        lines.append(k.ljust(w) + "".join(f"{results[c][k]:{cw[c]}.4f}" for c in cols))
    return "\n".join(lines)
