"""The declared claims (conf/claims, pipeline.reproduce.claim_specs) judged on a suite's seeded runs, as a referee
reads them: each claim's per-seed values from the runs, both arms' health gates, the richer verdict
(pipeline.verdicts.decide), the primary claims adjusted together with Holm and every other row with
Benjamini–Hochberg, the seeds the paper's own effect would need at the pooled spread, the table and the per-seed
CSV. Only the claims a paper makes are judged: a metric the runs log but no paper claims is not a row."""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pipeline.reproduce.claim_specs import LOG_METRICS, Claim
from pipeline.reproduce.suites import TARGETS
from pipeline.reproduce.tables import fmt
from pipeline.stats import MOST_SEEDS, differences
from pipeline.verdicts import (
    UNHEALTHY,
    Health,
    Verdict,
    apply_adjustment,
    bh,
    decide,
    health,
    holm,
    log_ratios,
    pooled_sd,
    seeds_for_effect,
)

# where a run's results hold each metric a claim may name (pipeline.reproduce.ledger.as_result's layout)
PATHS: dict[str, tuple[str, ...]] = {
    "probe top-1": ("probe", "pretrained", "top1"),
    **{f"probe MSE {t}": ("probe", "pretrained", f"mse_{t}") for t in TARGETS},
    "probe mean MSE": ("probe", "pretrained", "mse"),
    "conditional variance V": ("probe", "invariance", "invariance_pretrained_conditional_variance"),
    "alpha regression MSE": ("probe", "invariance", "invariance_pretrained_alpha_mse"),
    "fine-tuning top-1": ("downstream", "finetune", "pretrained", "top1"),
    "fine-tuning top-5": ("downstream", "finetune", "pretrained", "top5"),
    "fine-tuning R²": ("downstream", "finetune", "pretrained", "r2"),
    "detection AP": ("downstream", "detect", "pretrained", "AP"),
    "detection AP50": ("downstream", "detect", "pretrained", "AP50"),
}
PRIMARY, EXPLORATORY = "primary", "exploratory"


def value(run: Mapping, path: Sequence[str]) -> float | None:
    """A run's result at `path`, or None where the run lacks it (a job that did not run)."""
    node: Any = run
    for key in path:
        if not isinstance(node, Mapping) or key not in node:
            return None
        node = node[key]
    return float(node)


def per_seed(runs: Mapping[int, Mapping], metric: str, representation: str = "plain") -> dict[int, float]:
    """{seed: the metric}; `averaged`: the probe on the arm's feature-averaged representation (probe.pretrained_fa)."""
    path = PATHS[metric]
    if representation == "averaged":
        path = tuple("pretrained_fa" if k == "pretrained" else k for k in path)
    return {s: x for s, run in runs.items() if (x := value(run, path)) is not None}


def arm_health(runs: Mapping[int, Mapping]) -> Health:
    """The arm's probe against the same seed's random-init encoder: top-1 (higher is better) or, on Spirograph,
    the mean MSE over the factors (lower); a non-finite probe is a diverged seed."""
    records = {}
    for s, run in runs.items():
        probe = run["probe"]
        if "top1" in probe["pretrained"]:
            mine, rand, direction = probe["pretrained"]["top1"], (probe.get("random") or {}).get("top1"), 1
        else:
            mine = sum(probe["pretrained"][f"mse_{t}"] for t in TARGETS) / len(TARGETS)
            r = probe.get("random") or {}
            rand = sum(r[f"mse_{t}"] for t in TARGETS) / len(TARGETS) if all(f"mse_{t}" in r for t in TARGETS) else None
            direction = -1
        records[s] = {"value": float(mine), "random": None if rand is None else float(rand), "direction": direction}
    return health(records)


@dataclass(frozen=True)
class ClaimRow:
    claim: Claim
    variant: dict[int, float]  # seed -> the metric, over the seeds both arms have
    baseline: dict[int, float]
    variant_health: Health
    baseline_health: Health
    verdict: Verdict
    paper_gain: float | None  # on the verdict's scale (a log ratio for LOG_METRICS)
    needed: int | None = None  # seeds the paper's gain needs at the pooled spread

    @property
    def family(self) -> str:
        return PRIMARY if self.claim.primary else EXPLORATORY

    @property
    def log(self) -> bool:
        return self.claim.metric in LOG_METRICS

    def diffs(self) -> list[float]:
        return log_ratios(self.variant, self.baseline) if self.log else differences(self.variant, self.baseline)


def paper_gain(claim: Claim) -> float | None:
    """The paper's variant − baseline on the verdict's scale: log(variant / baseline) for LOG_METRICS, else the
    claim's `gain` in our units (None where the units do not carry over or the figure prints no number)."""
    p = claim.paper
    if claim.metric in LOG_METRICS:
        return math.log(p.variant / p.baseline) if p.baseline and p.variant else None
    return claim.gain


def judge_claim(claim: Claim, arms: Mapping[str, Mapping[int, Mapping]]) -> ClaimRow | None:
    """One declared claim on the suite's arms (label -> {seed: results}); None where either arm lacks the metric."""
    v_runs, b_runs = arms.get(claim.variant, {}), arms.get(claim.baseline, {})
    v, b = per_seed(v_runs, claim.metric, claim.representation), per_seed(b_runs, claim.metric)
    shared = sorted(set(v) & set(b))
    if not shared:
        return None
    v, b = {s: v[s] for s in shared}, {s: b[s] for s in shared}
    hv, hb = arm_health({s: v_runs[s] for s in shared}), arm_health({s: b_runs[s] for s in shared})
    log = claim.metric in LOG_METRICS
    gain = paper_gain(claim)
    # the smallest effect of interest: the claim's own, in our units; for log metrics a relative change, whose
    # log ratio in the claim's direction is the margin
    sesoi = abs(math.log1p(claim.direction * claim.sesoi)) if log else claim.sesoi
    verdict = decide(v, b, claim.direction, paper_gain=gain, sesoi=sesoi, log=log, health_ok=hv.ok and hb.ok)
    return ClaimRow(claim, v, b, hv, hb, verdict, gain)


def adjusted(rows: Sequence[ClaimRow]) -> list[ClaimRow]:
    """The rows with their family's adjustment: Holm over the primary claims, BH over the rest (a decided verdict
    whose adjusted p does not pass becomes inconclusive; pipeline.verdicts.apply_adjustment), and the seeds the
    paper's gain needs at the spread pooled over the rows of the same suite and metric."""
    out = list(rows)
    for family, adjust, kind in ((PRIMARY, holm, "Holm"), (EXPLORATORY, bh, "BH")):
        # an unhealthy row is not judged, so its p joins no family
        idx = [i for i, r in enumerate(out) if r.family == family and r.verdict.verdict != UNHEALTHY]
        judged = [out[i].verdict for i in idx]
        for i, v in zip(idx, apply_adjustment(judged, adjust([v.p for v in judged]), kind)):
            out[i] = replace(out[i], verdict=v)
    for i, r in enumerate(out):
        same = [q.diffs() for q in out if (q.claim.suite, q.claim.metric) == (r.claim.suite, r.claim.metric)]
        sd = pooled_sd([d for d in same if len(d) >= 2])
        gain = r.paper_gain
        needed = seeds_for_effect(gain, sd) if gain is not None and math.isfinite(sd) and sd > 0 else None
        out[i] = replace(r, needed=needed)
    return out


def _paper_cell(c: Claim) -> str:
    p = c.paper
    numbers = f"{p.baseline:g} → {p.variant:g}" if p.baseline is not None and p.variant is not None else p.shape
    return f"{numbers} ({c.source}; {p.units})"


def _ours_cell(r: ClaimRow) -> str:
    d = r.verdict.diff
    scale = "log ratio " if r.log else ""
    if d.n < 2 or d.low != d.low:
        return f"{scale}{fmt(d.mean)}"
    return f"{scale}{fmt(d.mean)} [{fmt(d.low)}, {fmt(d.high)}]"


def _health_cell(r: ClaimRow) -> str:
    if r.variant_health.ok and r.baseline_health.ok:
        return "ok"
    said = [f"{who}: {h.words()}" for who, h in (("variant", r.variant_health), ("baseline", r.baseline_health))]
    return "; ".join(s for s, h in zip(said, (r.variant_health, r.baseline_health)) if not h.ok)


def _needed_cell(r: ClaimRow) -> str:
    if r.needed is not None:
        return str(r.needed)
    # a gain the paper states, too small against our spread for any reasonable count
    return f"> {MOST_SEEDS:,}" if r.paper_gain is not None else "—"


def table(rows: Sequence[ClaimRow], commands: Mapping[str, str]) -> list[str]:
    """The claims table: primary claims first, then the exploratory rows, each naming its table or figure, how
    our row differs from the paper's, the health gate and the command that makes it."""
    lines = [
        "| claim | family | metric | paper | how ours differs | ours: difference (95 %) | health | verdict | "
        "seeds the paper's gain needs | command |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in sorted(rows, key=lambda r: (r.family != PRIMARY, r.claim.suite)):
        c = r.claim
        lines.append(
            f"| `{c.id}`: {c.variant} vs {c.baseline} | {r.family} | {c.metric} | {_paper_cell(c)} | {c.differs} | "
            f"{_ours_cell(r)} | {_health_cell(r)} | {r.verdict.words()} | {_needed_cell(r)} | "
            f"{commands.get(c.suite, '')} |"
        )
    return lines


def counts(rows: Sequence[ClaimRow]) -> dict[str, dict[str, int]]:
    """paper (seed file) -> verdict (its first words) -> rows."""
    out: dict[str, dict[str, int]] = {}
    for r in rows:
        word = r.verdict.verdict.split(" (")[0]
        per = out.setdefault(r.claim.seed_file, {})
        per[word] = per.get(word, 0) + 1
    return out


def write_csv(rows: Sequence[ClaimRow], path: Path) -> None:
    """Every row's per-seed values beside the report: the claim, its arm, the seed and the metric's value (a
    referee can recompute any interval from it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["suite", "claim", "family", "metric", "arm", "label", "seed", "value", "verdict"])
        for r in rows:
            c = r.claim
            for arm, label, values in (("variant", c.variant, r.variant), ("baseline", c.baseline, r.baseline)):
                for seed, x in sorted(values.items()):
                    w.writerow([c.suite, c.id, r.family, c.metric, arm, label, seed, repr(x), r.verdict.verdict])
