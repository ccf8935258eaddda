"""The seeded comparisons' statistics (pipeline/stats.py) against the t law computed here, on samples whose
interval must exclude 0 and samples whose interval must not; the seeds-needed estimate against the power of the
paired t-test computed from the noncentral t; the forest plot drawn."""

import math

import numpy as np
import pytest
from scipy import stats as st

from pipeline.reproduce.forest import ForestRow, forest_png
from pipeline.stats import (
    CONTRADICTED,
    INCONCLUSIVE,
    REPRODUCED,
    differences,
    judge,
    mean_interval,
    paired_difference,
    seeds_needed,
    verdict,
    welch_difference,
)


def _t_interval(x):
    """mean ± t_{0.975, n-1} · s / √n, from its definition."""
    x = np.asarray(x, dtype=float)
    n = len(x)
    half = st.t.ppf(0.975, n - 1) * x.std(ddof=1) / math.sqrt(n)
    return x.mean() - half, x.mean() + half


@pytest.mark.parametrize("x", [[0.61, 0.64, 0.58], [1.0, 2.0, 3.0, 4.0, 10.0], [-0.2, 0.1]])
def test_the_interval_is_the_student_t_interval(x):
    got = mean_interval(x)
    low, high = _t_interval(x)
    assert got.n == len(x) and got.mean == pytest.approx(np.mean(x))
    assert (got.low, got.high) == (pytest.approx(low, rel=1e-12), pytest.approx(high, rel=1e-12))


@pytest.mark.parametrize(
    "a,b", [([0.1, 0.3, 0.2], [0.5, 0.9, 0.6, 0.8]), ([-4.1, -1.0, -6.2, -3.3, -8.8], [-0.2, 0.4])]
)
def test_welchs_interval_and_p_from_their_definition(a, b):
    """mean(b) − mean(a) ± t(0.975, ν) · √(s_a²/n_a + s_b²/n_b), ν by Welch–Satterthwaite; p two-sided."""
    got, p = welch_difference(a, b)
    va, vb = np.var(a, ddof=1) / len(a), np.var(b, ddof=1) / len(b)
    nu = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    d = np.mean(b) - np.mean(a)
    half = st.t.ppf(0.975, nu) * math.sqrt(va + vb)
    assert got.mean == pytest.approx(d) and got.n == len(a) + len(b)
    assert (got.low, got.high) == (pytest.approx(d - half, rel=1e-9), pytest.approx(d + half, rel=1e-9))
    assert p == pytest.approx(2 * st.t.sf(abs(d) / math.sqrt(va + vb), nu), rel=1e-9)
    one, p1 = welch_difference([0.2], b)  # one value: no interval, no p
    flat, p2 = welch_difference([0.1, 0.1], [0.2, 0.2])  # no spread at all
    assert math.isnan(p1) and math.isnan(one.low) and math.isnan(p2) and flat.mean == pytest.approx(0.1)


def test_a_consistent_gain_excludes_zero_and_the_paper_direction_decides_the_verdict():
    base = {0: 0.50, 1: 0.60, 2: 0.55, 3: 0.52}  # seeds differ a lot between themselves ...
    gain = [0.030, 0.032, 0.029, 0.031]  # ... the variant gains about the same on each
    var = {s: base[s] + g for s, g in zip(base, gain)}
    d = paired_difference(var, base)
    assert d.mean == pytest.approx(0.0305) and d.low > 0
    assert (d.low, d.high) == tuple(pytest.approx(v) for v in _t_interval(gain))
    # unpaired, the arms' intervals overlap: pairing by seed is what separates them
    a, b = mean_interval(list(base.values())), mean_interval(list(var.values()))
    assert a.high > b.low
    assert verdict(d, +1) == REPRODUCED and verdict(d, -1) == CONTRADICTED
    j = judge(var, base, +1)
    assert j.verdict == REPRODUCED and j.needed is None and j.words() == "reproduced (4 seeds)"


def test_a_difference_within_the_seed_noise_is_inconclusive_with_the_seeds_that_would_decide_it():
    base = {0: 0.50, 1: 0.52, 2: 0.51}
    var = {0: 0.53, 1: 0.50, 2: 0.52}  # +0.03, -0.02, +0.01
    d = paired_difference(var, base)
    assert d.low < 0 < d.high
    j = judge(var, base, +1)
    assert j.verdict == INCONCLUSIVE and j.needed is not None and j.needed > 3
    assert (
        j.agree == 2 and j.words() == f"inconclusive at 3 seeds (2 of 3 the paper's way; ~{j.needed} would decide it)"
    )
    # every seed on one side and still inconclusive: one seed far out widens the interval over 0
    j = judge({0: 0.51, 1: 0.53, 2: 0.90}, base, -1)
    assert j.verdict == INCONCLUSIVE and j.agree == 0 and "(0 of 3 the paper's way;" in j.words()
    assert j.short().startswith("inconclusive, n=3, 0/3 the paper's way")


def _paired_t_power(effect: float, n: int, alpha: float = 0.05) -> float:
    """Power of the two-sided one-sample t-test on n differences at effect size d_z: the noncentral t's mass
    beyond the critical values."""
    df, crit = n - 1, st.t.ppf(1 - alpha / 2, n - 1)
    nc = effect * math.sqrt(n)
    return float(st.nct.sf(crit, df, nc) + st.nct.cdf(-crit, df, nc))


@pytest.mark.parametrize("diffs", [[0.02, -0.01, 0.015, 0.005], [0.3, 0.1, 0.2], [-1.0, -0.2, -0.5, 0.1, -0.7]])
def test_seeds_needed_is_the_smallest_n_with_80_percent_power(diffs):
    n = seeds_needed(diffs)
    effect = abs(np.mean(diffs)) / np.std(diffs, ddof=1)
    assert n is not None and n >= 2
    assert _paired_t_power(effect, n) >= 0.8 - 1e-6
    if n > 2:
        assert _paired_t_power(effect, n - 1) < 0.8


def test_the_seeds_both_arms_have_are_paired_in_seed_order():
    base = {2: 1.0, 0: 3.0, 1: 2.0, 7: 9.0}
    var = {1: 2.5, 0: 3.5, 2: 1.5}
    assert differences(var, base) == [0.5, 0.5, 0.5]


def test_degenerate_samples():
    one = mean_interval([0.4])
    assert one.n == 1 and math.isnan(one.low) and verdict(one, +1) == INCONCLUSIVE
    flat = mean_interval([0.3, 0.3, 0.3])
    assert (flat.low, flat.mean, flat.high) == (0.3, 0.3, 0.3)
    assert seeds_needed([0.0, 0.0]) is None and seeds_needed([0.1]) is None
    assert seeds_needed([1e-6, -1e-6, 2e-6, -1.5e-6]) is None  # beyond any budget


def test_the_forest_plot_draws_a_panel_per_metric(tmp_path):
    up = judge({0: 0.6, 1: 0.62, 2: 0.61}, {0: 0.5, 1: 0.52, 2: 0.5}, +1)
    noise = judge({0: 0.6, 1: 0.5, 2: 0.55}, {0: 0.55, 1: 0.56, 2: 0.54}, +1)
    lower = judge({0: 0.010, 1: 0.011, 2: 0.009}, {0: 0.020, 1: 0.022, 2: 0.021}, -1)
    rows = [
        ForestRow("CO2 vs MoCo v2", "top-1", up, 0.011),
        ForestRow("CLSA vs MoCo v2", "top-1", noise, 0.02),
        ForestRow("InvCLR vs SimCLR", "MSE b", lower, None),
    ]
    one = forest_png(rows[:1], tmp_path / "one.png", "one claim")
    three = forest_png(rows, tmp_path / "suite.png", "a suite")
    from PIL import Image

    h1, h3 = Image.open(one).size[1], Image.open(three).size[1]
    assert three.stat().st_size > 10_000 and h3 > h1  # taller with more rows and a second panel
    assert (up.verdict, noise.verdict, lower.verdict) == (REPRODUCED, INCONCLUSIVE, REPRODUCED)
