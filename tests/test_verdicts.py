"""The richer verdicts (pipeline/verdicts.py) against their definitions computed here and against scipy and
statsmodels: Holm and BH from their step-down / step-up formulas, TOST and the paired p-value from the t law,
log-ratio intervals from ttest_1samp, seeds for a stated effect from the noncentral t power; the health gate on a
fabricated diverged arm; and decide()'s verdicts on samples whose intervals are checked here first."""

import math
import warnings

import numpy as np
import pytest
from scipy import stats as st
from scipy.integrate import quad
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.power import TTestPower
from statsmodels.stats.weightstats import ttost_paired

from pipeline.verdicts import (
    CONTRADICTED,
    EQUIVALENT,
    EXCLUDES_GAIN,
    INCONCLUSIVE,
    REPRODUCED,
    REPRODUCED_SMALLER,
    UNHEALTHY,
    apply_adjustment,
    as_ratio,
    bh,
    decide,
    health,
    holm,
    log_ratio,
    paired_p,
    pooled_sd,
    seeds_for_effect,
    tost,
)

NAN = math.nan
P_SAMPLES = [
    [0.01, 0.04, 0.03, 0.005, NAN, 0.2],
    [0.01, 0.01, 0.02, NAN, 0.5, 0.049],
    [0.5],
    [NAN, NAN],
    np.random.default_rng(7).uniform(0, 0.2, 20).tolist(),
]


def _holm_direct(p):
    """Step-down: the i-th smallest of m gets max over j ≤ i of min(1, (m − j + 1) p_(j)); nan is not counted."""
    have = sorted((i for i, x in enumerate(p) if not math.isnan(x)), key=lambda i: p[i])
    out, running = [NAN] * len(p), 0.0
    for rank, i in enumerate(have, 1):
        running = max(running, min(1.0, (len(have) - rank + 1) * p[i]))
        out[i] = running
    return out


def _bh_direct(p):
    """Step-up: the i-th smallest of m gets min over j ≥ i of min(1, m p_(j) / j); nan is not counted."""
    have = sorted((i for i, x in enumerate(p) if not math.isnan(x)), key=lambda i: p[i])
    out, running = [NAN] * len(p), 1.0
    for rank in range(len(have), 0, -1):
        i = have[rank - 1]
        running = min(running, len(have) * p[i] / rank)
        out[i] = running
    return out


def _same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert (math.isnan(x) and math.isnan(y)) or x == pytest.approx(y, rel=1e-12), (a, b)


def _statsmodels(p, method):
    p = np.asarray(p, dtype=float)
    out = np.full(p.shape, NAN)
    if (~np.isnan(p)).any():
        out[~np.isnan(p)] = multipletests(p[~np.isnan(p)], method=method)[1]
    return out.tolist()


@pytest.mark.parametrize("p", P_SAMPLES)
def test_holm_is_the_step_down_of_its_definition_and_statsmodels(p):
    _same(holm(p), _holm_direct(p))
    _same(holm(p), _statsmodels(p, "holm"))


@pytest.mark.parametrize("p", P_SAMPLES)
def test_bh_is_the_step_up_of_its_definition_and_statsmodels(p):
    _same(bh(p), _bh_direct(p))
    _same(bh(p), _statsmodels(p, "fdr_bh"))


def test_a_nan_entry_is_outside_the_family():
    assert holm([0.01, NAN])[0] == pytest.approx(0.01) and bh([0.01, NAN])[0] == pytest.approx(0.01)


X1 = np.array([0.612, 0.634, 0.598, 0.621, 0.607, 0.629])
X2 = np.array([0.605, 0.640, 0.590, 0.611, 0.612, 0.620])


@pytest.mark.parametrize("margin", [0.005, 0.02, 0.05])
def test_tost_against_statsmodels_and_the_t_law(margin):
    d = X1 - X2
    se = d.std(ddof=1) / math.sqrt(len(d))
    lower = st.t.sf((d.mean() + margin) / se, len(d) - 1)  # H0: mean ≤ −margin
    upper = st.t.cdf((d.mean() - margin) / se, len(d) - 1)  # H0: mean ≥ +margin
    assert tost(d, margin) == pytest.approx(max(lower, upper), rel=1e-10)
    assert tost(d, margin) == pytest.approx(ttost_paired(X1, X2, -margin, margin)[0], rel=1e-10)


def test_tost_refuses_a_non_positive_margin_and_cannot_decide_without_spread():
    with pytest.raises(ValueError):
        tost([0.1, 0.2], 0)
    assert math.isnan(tost([0.001] * 4, 0.1)) and math.isnan(tost([0.001], 0.1))


def test_paired_p_is_scipys_paired_t():
    assert paired_p(X1 - X2) == pytest.approx(st.ttest_rel(X1, X2).pvalue, rel=1e-12)
    assert math.isnan(paired_p([0.3])) and math.isnan(paired_p([0.2, 0.2, 0.2]))


def test_log_ratio_is_the_t_interval_of_the_log_ratios_over_the_shared_seeds():
    variant = {0: 0.50, 1: 0.60, 2: 0.55, 3: 0.40, 9: 1.0}
    baseline = {0: 0.60, 1: 0.62, 2: 0.70, 3: 0.50, 7: 0.3}
    logs = np.log(np.array([0.50, 0.60, 0.55, 0.40]) / np.array([0.60, 0.62, 0.70, 0.50]))
    ci = st.ttest_1samp(logs, 0).confidence_interval(0.95)
    got = log_ratio(variant, baseline)
    assert got.n == 4 and got.mean == pytest.approx(logs.mean(), rel=1e-12)
    assert (got.low, got.high) == (pytest.approx(ci.low, rel=1e-12), pytest.approx(ci.high, rel=1e-12))
    ratio = as_ratio(got)
    assert ratio.mean == pytest.approx(st.gmean(np.exp(logs)), rel=1e-12)
    assert (ratio.low, ratio.high) == (pytest.approx(math.exp(ci.low)), pytest.approx(math.exp(ci.high)))
    with pytest.raises(ValueError):
        log_ratio({0: 0.5, 1: 0.0}, {0: 0.4, 1: 0.3})


def test_pooled_sd_against_its_definition():
    groups = [[1.0, 2.0, 4.0], [0.5, 0.7], [3.0], [2.0, 2.5, 3.5, 5.0]]
    num = sum((len(g) - 1) * np.var(g, ddof=1) for g in groups if len(g) > 1)
    assert pooled_sd(groups) == pytest.approx(math.sqrt(num / (2 + 1 + 3)), rel=1e-12)
    assert pooled_sd([groups[0]]) == pytest.approx(np.std(groups[0], ddof=1), rel=1e-12)
    assert math.isnan(pooled_sd([[1.0], [2.0]]))


def _power(es, n, alpha=0.05):
    """Two-sided paired t power from its definition: T = (Z + nc) / sqrt(V / df), V ~ χ²(df), so given V the
    test rejects with probability Φ(nc − c·s) + Φ(−nc − c·s), s = sqrt(V / df); averaged over V's quantiles."""
    df, nc = n - 1, es * math.sqrt(n)
    c = st.t.ppf(1 - alpha / 2, df)

    def given(u):
        s = c * math.sqrt(st.chi2.ppf(u, df) / df)
        return st.norm.cdf(nc - s) + st.norm.cdf(-nc - s)

    return quad(given, 0, 1, limit=200)[0]


# d_z from 0.1 (hundreds of seeds) to 50 (two), where statsmodels' solver and power give nan or stop short
EFFECTS = [(0.5, 1.0), (0.02, 0.015), (1.0, 0.5), (-0.1, 0.3), (10.0, 1.0), (5.5, 1.0), (0.05, 0.001), (0.1, 1.0)]


@pytest.mark.parametrize("effect, sd", EFFECTS)
def test_seeds_for_effect_is_the_least_n_with_the_power(effect, sd):
    n = seeds_for_effect(effect, sd)
    es = abs(effect) / sd
    assert n is not None and n >= 2
    assert _power(es, n) >= 0.8 - 1e-9 and (n == 2 or _power(es, n - 1) < 0.8)
    at_n, below = TTestPower().power(es, n, 0.05), TTestPower().power(es, n - 1, 0.05) if n > 2 else NAN
    assert (math.isnan(at_n) or at_n >= 0.8) and (math.isnan(below) or below < 0.8)  # where statsmodels can say
    with warnings.catch_warnings():  # it fails to converge at d_z = 50
        warnings.simplefilter("ignore")
        solved = TTestPower().solve_power(effect_size=es, alpha=0.05, power=0.8)
    assert math.isnan(solved) or abs(n - solved) < 1.001  # the solver's root, rounded to the seed that reaches it


@pytest.mark.parametrize("effect, sd", [(0.0, 1.0), (0.5, 0.0), (0.5, NAN), (math.inf, 1.0), (0.001, 1.0)])
def test_seeds_for_effect_says_none_where_it_cannot(effect, sd):
    assert seeds_for_effect(effect, sd) is None


def test_health_names_the_diverged_and_the_below_random_seeds():
    # an MSE probe (lower is better): seed 1 diverged, seeds 2 and 3 are worse than their random-init probes
    values = {0: 0.5, 1: NAN, 2: 1.2, 3: 1.05, 4: 0.7}
    h = health({s: {"value": v, "random": 1.0, "direction": -1} for s, v in values.items()})
    assert h.diverged == (1,) and h.below_random == (2, 3) and h.unhealthy == (1, 2, 3)
    assert h.rate == pytest.approx(3 / 5) and not h.ok
    assert h.words() == "2/5 seeds below random init (seeds 2, 3); 1 diverged (seed 1)"


def test_health_of_an_accuracy_arm_counts_a_tie_with_random_init_and_skips_an_unknown_random():
    arm = {
        0: {"value": 0.7, "random": 0.3, "direction": 1},
        1: {"value": 0.3, "random": 0.3, "direction": 1},
        2: {"value": 0.1, "random": None, "direction": 1},
        3: {"value": math.inf, "random": 0.3, "direction": 1},
    }
    h = health(arm)
    assert (h.diverged, h.below_random) == ((3,), (1,))
    assert health({0: arm[0], 2: arm[2]}).ok


BASE = {0: 0.61, 1: 0.64, 2: 0.58, 3: 0.62, 4: 0.60}


def _arm(diffs):
    return {s: BASE[s] + d for s, d in zip(BASE, diffs)}


def _ci(diffs):
    ci = st.ttest_1samp(diffs, 0).confidence_interval(0.95)
    return ci.low, ci.high


UP = [0.05, 0.06, 0.04, 0.055, 0.045]  # a clear gain


def test_a_gain_on_the_papers_side_is_reproduced_and_qualified_when_short_of_the_papers_gain():
    low, high = _ci(UP)
    assert low > 0 and 0.03 < high < 0.2
    v = decide(_arm(UP), BASE, +1, paper_gain=0.03, sesoi=None, log=False)
    assert v.verdict == REPRODUCED and v.p == pytest.approx(st.ttest_1samp(UP, 0).pvalue)
    assert decide(_arm(UP), BASE, +1, paper_gain=0.2, sesoi=None, log=False).verdict == REPRODUCED_SMALLER


def test_a_gain_against_the_papers_side_is_contradicted():
    assert _ci(UP)[0] > 0
    assert decide(_arm(UP), BASE, -1, paper_gain=None, sesoi=None, log=False).verdict == CONTRADICTED


def test_an_unhealthy_arm_is_never_contradicted():
    said = decide(_arm(UP), BASE, -1, paper_gain=None, sesoi=0.01, log=False, health_ok=False)
    assert said.verdict == UNHEALTHY and said.diff.low > 0  # the interval is still reported


def test_a_lower_mse_is_reproduced_on_the_log_ratio_scale():
    mse = {0: 0.020, 1: 0.031, 2: 0.025, 3: 0.018, 4: 0.027}
    better = {s: m * r for (s, m), r in zip(mse.items(), [0.80, 0.84, 0.78, 0.83, 0.81])}
    logs = np.log([better[s] / mse[s] for s in mse])
    assert _ci(logs)[1] < 0
    v = decide(better, mse, -1, paper_gain=math.log(0.9), sesoi=None, log=True)
    assert v.verdict == REPRODUCED and v.diff.mean == pytest.approx(logs.mean())
    with pytest.raises(ValueError):  # the paper's gain on the wrong side of the claim
        decide(better, mse, -1, paper_gain=0.1, sesoi=None, log=True)


def test_zero_spread_never_decides():
    v = decide(_arm([0.5] * 5), BASE, +1, paper_gain=0.1, sesoi=1.0, log=False)
    assert v.verdict == INCONCLUSIVE and v.reason == "no spread" and math.isnan(v.p)
    assert decide(_arm([0.5]), BASE, +1, paper_gain=None, sesoi=None, log=False).verdict == INCONCLUSIVE


SMALL = [0.001, -0.002, 0.0015, -0.0005, 0.0005]  # no effect, tightly measured


def test_a_tight_null_is_equivalent_within_a_wide_margin_only():
    low, high = _ci(SMALL)
    assert low < 0 < high
    d = np.asarray(SMALL)
    assert ttost_paired(d, np.zeros(5), -0.01, 0.01)[0] < 0.05
    assert ttost_paired(d, np.zeros(5), -0.0005, 0.0005)[0] >= 0.05
    v = decide(_arm(SMALL), BASE, +1, paper_gain=0.05, sesoi=0.01, log=False)
    assert v.verdict == EQUIVALENT and v.short_of_gain  # said over "excludes the paper's gain", which also holds
    assert decide(_arm(SMALL), BASE, +1, paper_gain=None, sesoi=0.0005, log=False).verdict == INCONCLUSIVE


NOISY = [0.02, -0.01, 0.03, 0.0, 0.01]  # a small gain the seeds cannot tell from 0


def test_an_interval_short_of_the_papers_gain_excludes_it():
    low, high = _ci(NOISY)
    assert low < 0 < high < 0.1
    assert decide(_arm(NOISY), BASE, +1, paper_gain=0.1, sesoi=None, log=False).verdict == EXCLUDES_GAIN
    assert decide(_arm(NOISY), BASE, +1, paper_gain=high / 2, sesoi=None, log=False).verdict == INCONCLUSIVE


def test_adjustment_turns_a_decided_verdict_that_does_not_survive_holm_inconclusive():
    strong, moderate, null = UP, [0.1, 0.35, 0.02, 0.2, 0.15], [0.05, -0.1, 0.08, -0.02, 0.03]
    raw = [st.ttest_1samp(d, 0).pvalue for d in (strong, moderate, null)]
    adjusted = _holm_direct(raw)
    assert raw[1] < 0.05 <= adjusted[1] and adjusted[0] < 0.05  # the moderate gain stands only unadjusted
    verdicts = [decide(_arm(d), BASE, +1, paper_gain=None, sesoi=None, log=False) for d in (strong, moderate, null)]
    assert [v.verdict for v in verdicts] == [REPRODUCED, REPRODUCED, INCONCLUSIVE]
    after = apply_adjustment(verdicts, holm([v.p for v in verdicts]), "Holm")
    assert [v.verdict for v in after] == [REPRODUCED, "inconclusive (after Holm)", INCONCLUSIVE]
    assert after[1].diff == verdicts[1].diff and after[1].adjusted == pytest.approx(adjusted[1])
    assert all(v.adjusted_kind == "Holm" for v in after) and "Holm p" in after[1].words()
    # a demoted gain whose interval falls short of the paper's: judged as any difference that does not exclude 0
    short = decide(_arm(moderate), BASE, +1, paper_gain=1.0, sesoi=None, log=False)
    assert short.verdict == REPRODUCED_SMALLER and short.short_of_gain
    (demoted,) = apply_adjustment([short], [0.2], "Holm")
    assert demoted.verdict == EXCLUDES_GAIN
