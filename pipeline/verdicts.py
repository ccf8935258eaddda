"""Richer verdicts on seeded comparisons (the referee's review, issue #51), as pure functions over per-seed results
{seed: value}: a paired p-value, Holm and Benjamini–Hochberg adjustment, an equivalence test (TOST), log-ratio
intervals for positive "lower is better" metrics, seeds needed for a stated effect, a health gate on each arm's
seeds, and a verdict that can say more than stats.verdict's three words. stats.judge() is left as it was.

Multiple comparisons. Every row of the report is a paired t-test at 1 − level, so a report of many rows would call
some claims decided by chance alone. The caller groups the rows into families and adjusts their p-values here:

- Primary claims (one per paper) form one family, adjusted with Holm. Holm controls the family-wise error rate
  under any dependence between the tests (it rests on the union bound only), and is never less powerful than
  Bonferroni. A primary claim stands as reproduced / contradicted only when its Holm-adjusted p < 1 − level
  (apply_adjustment).
- Exploratory rows (ablations, sweeps) carry Benjamini–Hochberg q-values, which control the false discovery rate:
  the expected share of wrong calls among the rows called, a fairer price when there are many rows and no single
  one is the paper's headline.
- Many-to-one comparisons: the ten MoCo v2 variants share one baseline, so every difference v_k − b carries the
  same per-seed baseline noise with the same sign, and the differences are positively correlated. Holm stays valid
  (any dependence). BH is proven (Benjamini & Yekutieli 2001) under positive regression dependence (PRDS), which
  one-sided tests on jointly normal statistics with non-negative correlations satisfy; the shared baseline gives
  that correlation (our t statistics are normal only approximately, at 5–8 seeds). Our p-values are two-sided,
  for which PRDS is not guaranteed in general: BH is widely found to hold there in simulation, but it is not
  proven, which is one more reason the q-values are labelled exploratory and only Holm decides a primary claim.
  (Benjamini–Yekutieli would be valid under any dependence, at a price of a factor Σ1/i, about 2.9 for ten rows.)
- Not Dunnett: its many-to-one critical values come from the joint law of independent arms' means with one common
  variance. Seed pairing makes the arms dependent (seed s shares data order and initialisation across arms), and
  the arms' spreads differ, so neither the variance nor the correlations Dunnett's table assumes hold.
- Not a mixed model (seed as a random effect): 5–8 seeds estimate its variance components poorly (few levels,
  estimates often at the zero boundary) and its test then leans on approximate degrees of freedom; the paired t on
  each comparison's own per-seed differences has exact n − 1 degrees of freedom for normal seed noise.

Precedence of decide()'s verdicts, first that applies: unhealthy (the arm failed its health gate: never judged,
so never "contradicted"); inconclusive where the seeds cannot decide (fewer than 2, a non-finite difference, or no
spread: identical differences give a zero-width interval that would decide on nothing); reproduced (qualified
"smaller than the paper's gain" where the interval's paper-side bound falls short of it); contradicted (also
over equivalent: a significant effect against the paper is reported as such, however small); equivalent (TOST,
said over "excludes the paper's gain" since a negligible effect is the stronger statement; the shortfall is still
recorded in Verdict.short_of_gain); excludes the paper's gain; inconclusive."""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
from scipy import stats
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.power import TTestPower
from statsmodels.stats.weightstats import ttost_paired

from pipeline.stats import LEVEL, MOST_SEEDS, POWER, Interval, differences, mean_interval

SPREAD_RTOL = 1e-9  # differences equal to this relative tolerance have no spread: v − b leaves rounding noise


def _no_spread(d: np.ndarray) -> bool:
    """All values equal, up to the rounding a subtraction leaves (0.6 + 0.5 − 0.6 is not exactly 0.5)."""
    return bool(np.ptp(d) <= SPREAD_RTOL * np.max(np.abs(d)))


def paired_p(diffs: Sequence[float]) -> float:
    """Two-sided paired t p-value of the per-seed differences against 0. nan with fewer than 2 values or no
    spread: identical differences make t infinite, and a zero-spread difference never decides alone."""
    d = np.asarray(diffs, dtype=float)
    if len(d) < 2 or _no_spread(d):
        return math.nan
    return float(stats.ttest_1samp(d, 0.0).pvalue)


def _adjust(pvalues: Sequence[float], method: str) -> list[float]:
    """multipletests over the non-nan entries only: a row that has no p-value is not part of the family."""
    p = np.asarray(pvalues, dtype=float)
    out = np.full(p.shape, math.nan)
    have = ~np.isnan(p)
    if have.any():
        out[have] = multipletests(p[have], method=method)[1]
    return out.tolist()


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm step-down adjusted p-values (family-wise error, any dependence); nan entries stay nan."""
    return _adjust(pvalues, "holm")


def bh(pvalues: Sequence[float]) -> list[float]:
    """Benjamini–Hochberg q-values (false discovery rate); nan entries stay nan."""
    return _adjust(pvalues, "fdr_bh")


def tost(diffs: Sequence[float], margin: float) -> float:
    """Paired two one-sided tests: the p-value against |mean difference| ≥ margin; below 1 − level the effect is
    shown to lie within ±margin. nan with fewer than 2 values or no spread (as paired_p)."""
    if not margin > 0:
        raise ValueError(f"an equivalence margin must be positive, not {margin}")
    d = np.asarray(diffs, dtype=float)
    if len(d) < 2 or _no_spread(d):
        return math.nan
    return float(ttost_paired(d, np.zeros_like(d), -margin, margin)[0])


def log_ratios(variant: Mapping[int, float], baseline: Mapping[int, float]) -> list[float]:
    seeds = sorted(set(variant) & set(baseline))
    bad = [s for s in seeds if variant[s] <= 0 or baseline[s] <= 0]
    if bad:
        raise ValueError(f"a log ratio needs positive values; seeds {bad} are not")
    return [math.log(variant[s] / baseline[s]) for s in seeds]


def log_ratio(variant: Mapping[int, float], baseline: Mapping[int, float], level: float = LEVEL) -> Interval:
    """The mean of the per-seed log(variant / baseline) over the shared seeds, with its paired t interval. For
    positive metrics where lower is better (MSE, conditional variance) a ratio is the natural scale: a 10 % gain
    reads the same whatever the metric's size, and seed-to-seed noise is closer to multiplicative."""
    return mean_interval(log_ratios(variant, baseline), level)


def as_ratio(log_interval: Interval) -> Interval:
    """A log-ratio interval back on the ratio scale: its mean becomes the geometric mean ratio."""
    return Interval(
        math.exp(log_interval.mean), math.exp(log_interval.low), math.exp(log_interval.high), log_interval.n
    )


def pooled_sd(groups: Sequence[Sequence[float]]) -> float:
    """Pooled standard deviation of several sets of per-seed differences, sqrt(Σ(n_i−1)s_i² / Σ(n_i−1)); sets of
    fewer than 2 values carry no spread and add nothing. nan where no set has 2 values."""
    num = dof = 0.0
    for g in groups:
        x = np.asarray(g, dtype=float)
        if len(x) >= 2:
            num += (len(x) - 1) * x.var(ddof=1)
            dof += len(x) - 1
    return math.sqrt(num / dof) if dof else math.nan


def _power(es: float, n: int, alpha: float) -> float:
    """Two-sided paired t power. statsmodels' special function returns nan at large noncentrality and few seeds
    (d_z = 10 at n = 3); there scipy's noncentral t gives it, whose far tail P(T < −c) ≤ Φ(−nc) can itself be nan
    where it is negligible."""
    p = float(TTestPower().power(es, n, alpha))
    if math.isnan(p):
        c, nc = stats.t.isf(alpha / 2, n - 1), es * math.sqrt(n)
        far = float(stats.nct.cdf(-c, n - 1, nc))
        if math.isnan(far) and stats.norm.cdf(-nc) < 1e-12:
            far = 0.0
        p = float(stats.nct.sf(c, n - 1, nc)) + far
    return p


def seeds_for_effect(effect: float, sd: float, level: float = LEVEL, power: float = POWER) -> int | None:
    """Seeds a two-sided paired t-test at 1 − level needs to detect a *stated* effect (the paper's gain in our
    units) with `power`, given the per-seed spread sd (e.g. pooled_sd): the smallest n whose power reaches it,
    at Cohen's d_z = |effect| / sd. Unlike stats.seeds_needed this does not take our noisy observed mean as the
    truth. None where the effect is 0, a number is not finite, or it needs more than MOST_SEEDS."""
    if not (math.isfinite(effect) and math.isfinite(sd)) or effect == 0 or sd <= 0:
        return None
    es, alpha = abs(effect) / sd, 1 - level
    with warnings.catch_warnings():  # tiny or huge effects: the solver warns where it cannot converge
        warnings.simplefilter("ignore")
        try:
            solved = TTestPower().solve_power(effect_size=es, alpha=alpha, power=power)
            solved = float(np.asarray(solved).reshape(-1)[0])
        except (ValueError, RuntimeError):
            solved = math.nan
        if math.isnan(solved):  # it gives up at both ends: a huge d_z (2 or 3 seeds) or a tiny one (thousands)
            if not _power(es, MOST_SEEDS, alpha) >= power:
                return None
            solved = 2
        # the root finder can stop short (2 seeds at d_z = 10, where 2 give power 0.73): step up to the least n.
        n = max(2, math.ceil(solved))
        while n <= MOST_SEEDS and not _power(es, n, alpha) >= power:
            n += 1
    return n if n <= MOST_SEEDS else None


def _seeds(seeds: Sequence[int]) -> str:
    return f"seed {seeds[0]}" if len(seeds) == 1 else "seeds " + ", ".join(str(s) for s in seeds)


@dataclass(frozen=True)
class Health:
    """An arm's seeds that cannot stand for the method: diverged (a non-finite probe value) or below random init
    (the probe does no better than the same seed's random-init encoder, in the metric's direction)."""

    seeds: int
    diverged: tuple[int, ...]
    below_random: tuple[int, ...]

    @property
    def unhealthy(self) -> tuple[int, ...]:
        return tuple(sorted(set(self.diverged) | set(self.below_random)))

    @property
    def rate(self) -> float:
        return len(self.unhealthy) / self.seeds if self.seeds else math.nan

    @property
    def ok(self) -> bool:
        return not self.unhealthy

    def words(self) -> str:
        if not self.seeds:
            return "no seeds"
        below = f"{len(self.below_random)}/{self.seeds} seeds below random init"
        below += f" ({_seeds(self.below_random)})" if self.below_random else ""
        div = f"{len(self.diverged)} diverged" + (f" ({_seeds(self.diverged)})" if self.diverged else "")
        return f"{below}; {div}"


def health(per_seed: Mapping[int, Mapping]) -> Health:
    """The health gate over {seed: {"value": probe metric, "random": the same seed's random-init probe or None,
    "direction": +1 higher is better / −1 lower is better}}. A tie with random init counts as not beating it (the
    pretraining taught the probe nothing); a missing or non-finite random value cannot be compared, so only
    divergence is checked for that seed."""
    diverged, below = [], []
    for seed in sorted(per_seed):
        rec = per_seed[seed]
        value, rand, direction = float(rec["value"]), rec.get("random"), rec["direction"]
        if direction not in (1, -1):
            raise ValueError(f"seed {seed}: direction must be +1 or -1, not {direction}")
        if not math.isfinite(value):
            diverged.append(seed)
        elif rand is not None and math.isfinite(rand) and not direction * (value - rand) > 0:
            below.append(seed)
    return Health(len(per_seed), tuple(diverged), tuple(below))


UNHEALTHY = "unhealthy"
REPRODUCED = "reproduced"
REPRODUCED_SMALLER = "reproduced, smaller than the paper's gain"
CONTRADICTED = "contradicted"
EQUIVALENT = "equivalent"
EXCLUDES_GAIN = "excludes the paper's gain"
INCONCLUSIVE = "inconclusive"
DECIDED = (REPRODUCED, REPRODUCED_SMALLER, CONTRADICTED)  # the verdicts a test against 0 decides


def _p(p: float, name: str = "p") -> str:
    return f"{name} < 0.001" if p < 0.001 else f"{name} = {p:.2g}"


@dataclass(frozen=True)
class Verdict:
    """One claim judged: the paired difference variant − baseline (of log values when `log`), its p-value, the
    TOST p against ±sesoi, the verdict with its reason where it is inconclusive, whether the interval's
    paper-side bound falls short of the paper's gain (None where no gain was given or there is no interval),
    and, once the caller has adjusted a family's p-values, the adjusted p and how (e.g. "Holm", "BH")."""

    diff: Interval
    p: float
    tost_p: float | None
    verdict: str
    reason: str | None
    short_of_gain: bool | None
    log: bool
    level: float
    sesoi: float | None = None
    adjusted: float | None = None
    adjusted_kind: str | None = None

    @property
    def decided(self) -> bool:
        return self.verdict in DECIDED

    def with_adjusted(self, adjusted: float, kind: str) -> Verdict:
        """A copy carrying the family-adjusted p-value; the verdict is left as it is (see apply_adjustment)."""
        return replace(self, adjusted=adjusted, adjusted_kind=kind)

    def short(self) -> str:
        """The verdict in a few words, for a plot."""
        return f"{self.verdict.split(' (')[0]}, n={self.diff.n}"

    def words(self) -> str:
        """The verdict in a few words, for a table cell."""
        said = [f"{self.diff.n} seeds"]
        if self.verdict == UNHEALTHY:  # not judged: a p-value here would read as a finding
            return f"{self.verdict} ({self.reason}; {said[0]})"
        if not math.isnan(self.p):
            said.append(_p(self.p))
        if self.adjusted is not None:  # Benjamini–Hochberg's adjusted p is a q-value
            said.append(_p(self.adjusted, "BH q" if self.adjusted_kind == "BH" else f"{self.adjusted_kind} p"))
        if self.verdict == EQUIVALENT and self.tost_p is not None:
            said.append(f"TOST {_p(self.tost_p)} within ±{self.sesoi:g}{' log ratio' if self.log else ''}")
        if self.reason:
            said.insert(0, self.reason)
        if self.short_of_gain and self.verdict not in (REPRODUCED_SMALLER, EXCLUDES_GAIN, CONTRADICTED):
            said.append("short of the paper's gain")
        if self.verdict.endswith(")"):  # "inconclusive (after Holm)": one pair of brackets, not two
            return f"{self.verdict[:-1]}; {'; '.join(said)})"
        return f"{self.verdict} ({'; '.join(said)})"


def decide(
    variant: Mapping[int, float],
    baseline: Mapping[int, float],
    direction: int,
    *,
    paper_gain: float | None,
    sesoi: float | None,
    log: bool,
    health_ok: bool = True,
    level: float = LEVEL,
) -> Verdict:
    """A claim on per-seed results {seed: value} of its two arms, paired over their shared seeds. `direction`
    +1: the paper says the variant scores higher; −1: lower (as MSE). With `log` the differences are
    log(variant / baseline), for positive lower-is-better metrics, and then `paper_gain` and `sesoi` are on
    that log-ratio scale too (a 20 % lower MSE is log 0.8). `paper_gain` is the paper's variant − baseline,
    signed like the claim; `sesoi` (smallest effect size of interest) is the positive equivalence margin.
    Precedence: see the module docstring."""
    if direction not in (1, -1):
        raise ValueError(f"direction must be +1 or -1, not {direction}")
    if paper_gain is not None and not paper_gain * direction > 0:
        raise ValueError(f"the paper's gain {paper_gain} does not lie on the claim's side (direction {direction})")
    diffs = log_ratios(variant, baseline) if log else differences(variant, baseline)
    finite = len(diffs) >= 2 and all(math.isfinite(d) for d in diffs)
    spread = finite and not _no_spread(np.asarray(diffs))
    if finite and not spread:  # the point, as stats.mean_interval gives it, without t on rounding noise
        diff = Interval(float(np.mean(diffs)), float(np.mean(diffs)), float(np.mean(diffs)), len(diffs))
    else:
        diff = mean_interval(diffs, level)
    p = paired_p(diffs)
    tost_p = tost(diffs, sesoi) if sesoi is not None else None
    alpha = 1 - level

    short = None
    if paper_gain is not None and spread:  # the bound nearest the paper's claim, in the claim's direction
        paper_side = diff.high if direction > 0 else diff.low
        short = direction * paper_side < direction * paper_gain

    def made(verdict: str, reason: str | None = None) -> Verdict:
        return Verdict(diff, p, tost_p, verdict, reason, short, log, level, sesoi)

    if not health_ok:
        return made(UNHEALTHY, "the arm failed its health gate")
    if len(diffs) < 2:
        return made(INCONCLUSIVE, "fewer than 2 seeds")
    if not finite:
        return made(INCONCLUSIVE, "a non-finite difference")
    if not spread:
        return made(INCONCLUSIVE, "no spread")
    if diff.low > 0 or diff.high < 0:  # the interval excludes 0: on the paper's side or the other
        if (diff.mean > 0) == (direction > 0):
            return made(REPRODUCED_SMALLER if short else REPRODUCED)
        return made(CONTRADICTED)
    if tost_p is not None and tost_p < alpha:
        return made(EQUIVALENT)
    if short:
        return made(EXCLUDES_GAIN)
    return made(INCONCLUSIVE)


def apply_adjustment(verdicts: Sequence[Verdict], adjusted: Sequence[float], kind: str) -> list[Verdict]:
    """Copies of a family's verdicts carrying their adjusted p-values (holm() or bh() of their p, in order). A
    decided verdict (reproduced / contradicted) stands only where its adjusted p < 1 − level; otherwise it is
    judged as decide() judges a difference that does not exclude 0 (equivalent, excludes the paper's gain), else
    "inconclusive (after <kind>)", keeping its raw interval. Equivalence and "excludes the paper's gain" are not
    tests against 0 and are not adjusted: they are decided at the unadjusted level, and the report says so."""
    if len(verdicts) != len(adjusted):
        raise ValueError(f"{len(verdicts)} verdicts but {len(adjusted)} adjusted p-values")
    out = []
    for v, a in zip(verdicts, adjusted):
        v = v.with_adjusted(a, kind)
        if v.decided and not a < 1 - v.level:  # a nan adjusted p does not let a verdict stand either
            if v.tost_p is not None and v.tost_p < 1 - v.level:
                v = replace(v, verdict=EQUIVALENT)
            elif v.short_of_gain:
                v = replace(v, verdict=EXCLUDES_GAIN)
            else:
                v = replace(v, verdict=f"{INCONCLUSIVE} (after {kind})")
        out.append(v)
    return out
