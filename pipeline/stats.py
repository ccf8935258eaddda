"""Seeded comparisons (the reproductions' suites, seeded sweeps): each arm's mean with its 95 % interval over the
seeds, each variant's paired difference to its baseline (seed s of every arm shares the data order and the
initialisation, so the differences are taken seed by seed), a verdict on the paper's claim, and how many seeds a
simple power estimate says would decide it.

Why Student t, on the seeds and on the per-seed differences, and not a bootstrap: the reproductions run 3 to 5
seeds. A bootstrap of 3 values has 10 distinct resamples, so its percentile interval is a coarse, too narrow
guess; the t interval is exact for normally distributed seed-to-seed noise and widens as it should when the seeds
are few. scipy computes the intervals (ttest_1samp's confidence_interval), statsmodels the power (TTestPower)."""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats
from statsmodels.stats.power import TTestPower

LEVEL = 0.95  # the intervals' confidence
POWER = 0.8  # the power the seeds-needed estimate asks for, at the two-sided level 1 - LEVEL
MOST_SEEDS = 1000  # beyond this the estimate says "more than" rather than a number


@dataclass(frozen=True)
class Interval:
    """A mean and its two-sided interval over n values (low = high = nan where n < 2)."""

    mean: float
    low: float
    high: float
    n: int

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2


def mean_interval(values: Sequence[float], level: float = LEVEL) -> Interval:
    """The mean of `values` and its Student-t interval: mean ± t(level, n-1) · s / √n."""
    x = np.asarray(values, dtype=float)
    if len(x) < 2:
        return Interval(float(x.mean()) if len(x) else math.nan, math.nan, math.nan, len(x))
    if np.ptp(x) == 0:  # no spread: scipy warns of precision loss; the interval is the point
        return Interval(float(x[0]), float(x[0]), float(x[0]), len(x))
    ci = stats.ttest_1samp(x, 0.0).confidence_interval(level)
    return Interval(float(x.mean()), float(ci.low), float(ci.high), len(x))


def differences(variant: Mapping[int, float], baseline: Mapping[int, float]) -> list[float]:
    """variant − baseline seed by seed, over the seeds both arms have, in seed order."""
    return [variant[s] - baseline[s] for s in sorted(set(variant) & set(baseline))]


def welch_difference(a: Sequence[float], b: Sequence[float], level: float = LEVEL) -> tuple[Interval, float]:
    """mean(b) − mean(a) of two independent samples, with Welch's t interval and two-sided p (nan where either has
    fewer than two values or neither any spread). Independent, not paired: for two separately trained sets of runs
    (a ladder's budgets), where seed s of one shares nothing with seed s of the other after the first step."""
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    mean = float(y.mean() - x.mean()) if len(x) and len(y) else math.nan
    if len(x) < 2 or len(y) < 2 or (np.ptp(x) == 0 and np.ptp(y) == 0):
        return Interval(mean, math.nan, math.nan, len(x) + len(y)), math.nan
    t = stats.ttest_ind(y, x, equal_var=False)
    ci = t.confidence_interval(level)
    return Interval(mean, float(ci.low), float(ci.high), len(x) + len(y)), float(t.pvalue)


def paired_difference(variant: Mapping[int, float], baseline: Mapping[int, float], level: float = LEVEL) -> Interval:
    """The mean per-seed difference variant − baseline and its paired t interval."""
    return mean_interval(differences(variant, baseline), level)


def seeds_needed(diffs: Sequence[float], level: float = LEVEL, power: float = POWER) -> int | None:
    """Seeds a two-sided paired t-test at 1 − level needs to tell this difference from 0 with `power`, were the
    true mean difference and its seed-to-seed spread what `diffs` show (Cohen's d_z = mean / sd). None where it
    cannot be estimated (fewer than 2 seeds, or a mean of 0) or exceeds MOST_SEEDS."""
    d = np.asarray(diffs, dtype=float)
    if len(d) < 2 or d.mean() == 0:
        return None
    sd = d.std(ddof=1)
    if sd == 0:
        return len(d)  # no spread: these seeds already decide it
    with warnings.catch_warnings():  # tiny effects: the solver warns on its way to a huge n
        warnings.simplefilter("ignore")
        try:
            n = TTestPower().solve_power(effect_size=abs(d.mean()) / sd, alpha=1 - level, power=power)
        except (ValueError, RuntimeError):
            return None
    n = float(np.asarray(n).reshape(-1)[0])
    if not math.isfinite(n) or n > MOST_SEEDS:
        return None
    return max(2, math.ceil(n))


REPRODUCED, CONTRADICTED, INCONCLUSIVE = "reproduced", "contradicted", "inconclusive"


def verdict(diff: Interval, direction: int) -> str:
    """The paper's claim (`direction` +1: the variant scores higher; −1: lower, as MSE) against the paired
    interval: reproduced where it excludes 0 on the paper's side, contradicted on the other, else inconclusive."""
    if diff.n < 2 or math.isnan(diff.low):
        return INCONCLUSIVE
    if diff.low > 0 or diff.high < 0:
        return REPRODUCED if (diff.mean > 0) == (direction > 0) else CONTRADICTED
    return INCONCLUSIVE


@dataclass(frozen=True)
class Judged:
    """One claim judged on the seeds: both arms' intervals, the paired difference, the verdict and, where it is
    inconclusive, the seeds the power estimate asks for."""

    baseline: Interval
    variant: Interval
    diff: Interval
    verdict: str
    needed: int | None
    agree: int  # seeds whose difference lies on the paper's side of 0 (a sign count; said where t cannot decide)

    def short(self) -> str:
        """The verdict in a few words, for a plot."""
        if self.verdict != INCONCLUSIVE:
            return f"{self.verdict}, n={self.diff.n}"
        said = f"inconclusive, n={self.diff.n}, {self.agree}/{self.diff.n} the paper's way"
        return said + (f" (~{self.needed} needed)" if self.needed else "")

    def words(self) -> str:
        if self.verdict != INCONCLUSIVE:
            return f"{self.verdict} ({self.diff.n} seeds)"
        more = f"~{self.needed} would decide it" if self.needed else "the seeds cannot estimate how many would"
        return f"inconclusive at {self.diff.n} seeds ({self.agree} of {self.diff.n} the paper's way; {more})"


def judge(variant: Mapping[int, float], baseline: Mapping[int, float], direction: int) -> Judged:
    """A claim on per-seed results {seed: value} of its two arms."""
    diffs = differences(variant, baseline)
    diff = mean_interval(diffs)
    v = verdict(diff, direction)
    needed = seeds_needed(diffs) if v == INCONCLUSIVE else None
    if needed is not None:  # these seeds did not decide it: more than them, whatever the noisy estimate says
        needed = max(needed, len(diffs) + 1)
    shared = sorted(set(variant) & set(baseline))  # the arms over the seeds their difference is taken on
    agree = sum(1 for d in diffs if d * direction > 0)
    return Judged(
        mean_interval([baseline[s] for s in shared]),
        mean_interval([variant[s] for s in shared]),
        diff,
        v,
        needed,
        agree,
    )
