"""JointCrop / JointBlur / JointColor samplers (pipeline/augment/joint.py) follow the law of
docs/methods/jointcrop.md: log(x2/x1) ~ JC(beta), x1 | r uniform on its interval, boxes inside the image.

The reference CDF of JC(beta) below is derived by hand from the spec, not from the sampler:
  beta > 0: truncated normal G(t) = (Phi(t/sd) - Phi(-s_b/sd)) / (Phi(s_b/sd) - Phi(-s_b/sd)), sd = s_b/beta
  beta = 0: uniform on [-s_b, s_b]
  beta < 0: r = -s_b - x (x < 0) or s_b - x (x >= 0), x ~ G with sd = s_b/|beta|, so
            F(t) = 1/2 - G(-s_b - t) for t <= 0 and 3/2 - G(s_b - t) for t > 0.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from pipeline.augment.joint import (
    JointSampler,
    joint_blur_sigmas,
    joint_color_factors,
    joint_factor_pair,
    sample_joint_crops,
    sample_log_ratio,
)
from pipeline.augment.params import sample_crop

LOW, HIGH = 0.2, 1.0
SB = math.log(HIGH / LOW)
RATIO = (3 / 4, 4 / 3)
P_OK = 1e-3  # seeded KS tests: the law holds -> p above this
P_POWER = 1e-6  # the same tests against a wrong law -> p below this


def jc_cdf(t, beta: float, s_b: float):
    t = np.clip(np.asarray(t, dtype=float), -s_b, s_b)
    if beta == 0:
        return (t + s_b) / (2 * s_b)
    sd = s_b / abs(beta)
    z0, z1 = stats.norm.cdf(-s_b / sd), stats.norm.cdf(s_b / sd)

    def g(x):
        return (stats.norm.cdf(x / sd) - z0) / (z1 - z0)

    if beta > 0:
        return g(t)
    return np.where(t <= 0, 0.5 - g(-s_b - t), 1.5 - g(s_b - t))


def draw(beta, n=20000, seed=0, low=LOW, high=HIGH):
    return JointSampler(low, high, beta).sample_np(n, np.random.default_rng(seed))


# ---------------------------------------------------------------- the log-ratio law JC(beta)


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0, 2.0, 5.0, -0.5, -1.0, -2.0])
def test_log_ratio_follows_jc(beta):
    x1, x2 = draw(beta, seed=int(10 * beta) + 100)
    p = stats.kstest(np.log(x2 / x1), lambda t: jc_cdf(t, beta, SB)).pvalue
    assert p > P_OK, (beta, p)
    # the raw JC sampler too, on another range (JointBlur's s_b = log 20)
    r = sample_log_ratio(beta, math.log(20), 20000, np.random.default_rng(7))
    assert stats.kstest(r, lambda t: jc_cdf(t, beta, math.log(20))).pvalue > P_OK


@pytest.mark.parametrize("beta,wrong", [(2.0, 0.0), (-1.0, 0.0), (1.0, 2.0), (-2.0, -1.0), (-1.0, 1.0)])
def test_log_ratio_ks_has_power(beta, wrong):
    x1, x2 = draw(beta, seed=3)
    p = stats.kstest(np.log(x2 / x1), lambda t: jc_cdf(t, wrong, SB)).pvalue
    assert p < P_POWER, (beta, wrong, p)


@pytest.mark.parametrize("beta", [1e-6, -1e-6])
def test_beta_near_zero_is_uniform(beta):
    """Spec 1.2: both signs are continuous with the uniform case at beta -> 0."""
    x1, x2 = draw(beta, seed=5)
    assert stats.kstest(np.log(x2 / x1), lambda t: jc_cdf(t, 0.0, SB)).pvalue > P_OK


# Spec 1.5 Monte-Carlo table, s_min = 0.2, s_max = 1:
# beta: (P(ratio outside [1/2, 2]), E|log s_r|, E max(s1,s2), E min(s1,s2), E s1)
SPEC_TABLE = {
    2.0: (0.360, 0.582, 0.695, 0.401, 0.548),
    1.0: (0.512, 0.741, 0.733, 0.363, 0.548),
    0.0: (0.570, 0.805, 0.749, 0.349, 0.549),
    -1.0: (0.631, 0.869, 0.763, 0.332, 0.548),
    -2.0: (0.780, 1.028, 0.801, 0.295, 0.548),
}


@pytest.mark.parametrize("beta", sorted(SPEC_TABLE))
def test_matches_spec_monte_carlo_table(beta):
    """Also pins x1 | r to the LINEAR uniform (a log-uniform x1 moves E[s1] and E[min] by > 0.02)."""
    x1, x2 = draw(beta, n=100000, seed=11)
    r = np.log(x2 / x1)
    got = (
        np.mean(np.abs(r) > math.log(2)),
        np.abs(r).mean(),
        np.maximum(x1, x2).mean(),
        np.minimum(x1, x2).mean(),
        x1.mean(),
    )
    for g, want, tol in zip(got, SPEC_TABLE[beta], (0.008, 0.008, 0.004, 0.004, 0.004)):
        assert abs(g - want) < tol, (beta, got, SPEC_TABLE[beta])
    # the independent control row: P = 0.28125 analytically, E|log s_r| = 0.494
    if beta == 0.0:
        y1, y2 = draw(None, n=100000, seed=11)
        q = np.log(y2 / y1)
        np.testing.assert_allclose((np.mean(np.abs(q) > math.log(2)), np.abs(q).mean()), (0.28125, 0.494), atol=0.008)


# ---------------------------------------------------------------- bounds and the conditional law of x1


@pytest.mark.parametrize("beta", [0.0, 1.0, -1.0, 50.0, -50.0, 1e-9, None])
@pytest.mark.parametrize("low,high", [(0.2, 1.0), (0.1, 2.0), (1e-3, 2.5), (0.6, 1.4)])
def test_samples_inside_bounds(beta, low, high):
    x1, x2 = draw(beta, n=5000, seed=1, low=low, high=high)
    for x in (x1, x2):
        assert x.dtype == np.float64 and x.shape == (5000,)
        assert x.min() >= low and x.max() <= high
    # the range is used, not just a corner of it
    assert x1.min() < low + 0.05 * (high - low) and x1.max() > high - 0.05 * (high - low)


def test_degenerate_range():
    for beta in (0.0, 2.0, -2.0, None):
        x1, x2 = draw(beta, n=100, low=0.7, high=0.7)
        assert (x1 == 0.7).all() and (x2 == 0.7).all()


@pytest.mark.parametrize("beta", [0.0, 2.0, -1.0])
def test_x1_given_r_is_uniform_on_its_interval(beta):
    x1, x2 = draw(beta, seed=21)
    r = np.log(x2 / x1)
    a = LOW * np.maximum(1.0, np.exp(-r))
    b = HIGH * np.minimum(1.0, np.exp(-r))
    assert (x1 >= a * (1 - 1e-12)).all() and (x1 <= b * (1 + 1e-12)).all()
    wide = (b - a) > 0.01  # selecting on r does not bias x1 | r
    assert wide.mean() > 0.9
    pos = (x1 - a)[wide] / (b - a)[wide]
    assert stats.kstest(pos, "uniform").pvalue > P_OK
    # power: the same position measured in the log domain is clearly not uniform
    log_pos = np.log(x1 / a)[wide] / np.log(b / a)[wide]
    assert stats.kstest(log_pos, "uniform").pvalue < P_POWER


def test_independent_control():
    x1, x2 = draw(None, seed=31)
    for x in (x1, x2):
        assert stats.kstest(x, "uniform", args=(LOW, HIGH - LOW)).pvalue > P_OK
    n = len(x1)
    assert abs(np.corrcoef(x1, x2)[0, 1]) < 4 / math.sqrt(n)
    assert abs(stats.spearmanr(x1, x2).statistic) < 4 / math.sqrt(n)
    # power of both checks: the joint law is neither independent nor uniform in x1
    y1, y2 = draw(2.0, seed=31)
    assert abs(stats.spearmanr(y1, y2).statistic) > 10 / math.sqrt(n)  # (negative: about -0.14)
    assert stats.kstest(y1, "uniform", args=(LOW, HIGH - LOW)).pvalue < P_POWER
    assert stats.kstest(np.log(x2 / x1), lambda t: jc_cdf(t, 0.0, SB)).pvalue < P_POWER


def test_views_have_the_same_marginal():
    """JC(beta) is symmetric, so s1 and s2 share one marginal (spec 1.2, DERIVED)."""
    x1, x2 = draw(-1.0, seed=41)
    assert stats.ks_2samp(x1, x2).pvalue > P_OK


# ---------------------------------------------------------------- determinism, torch entry point


def test_same_seed_same_samples_numpy_and_torch():
    s = JointSampler(LOW, HIGH, 1.0)
    a = s.sample_np(1000, np.random.default_rng(5))
    b = s.sample_np(1000, np.random.default_rng(5))
    c = s.sample_np(1000, np.random.default_rng(6))
    assert all(np.array_equal(u, v) for u, v in zip(a, b))
    assert not np.array_equal(a[0], c[0])
    t1 = s.sample(1000, torch.Generator().manual_seed(5))
    t2 = s.sample(1000, torch.Generator().manual_seed(5))
    t3 = s.sample(1000, torch.Generator().manual_seed(6))
    assert all(torch.equal(u, v) for u, v in zip(t1, t2))
    assert not torch.equal(t1[0], t3[0])
    assert t1[0].dtype == torch.float64 and t1[0].shape == (1000,)
    boxes = [sample_joint_crops([(300, 400)] * 50, (0.2, 1.0), RATIO, 0.0, np.random.default_rng(9)) for _ in range(2)]
    assert all(np.array_equal(u, v) for u, v in zip(*boxes))


@pytest.mark.parametrize("beta", [0.0, -2.0, None])
def test_torch_and_numpy_follow_the_same_law(beta):
    s = JointSampler(LOW, HIGH, beta)
    g = torch.Generator().manual_seed(123)
    t1, t2 = (t.numpy() for t in s.sample(20000, g))
    n1, n2 = s.sample_np(20000, np.random.default_rng(321))
    assert t1.min() >= LOW and t2.max() <= HIGH
    assert stats.ks_2samp(np.log(t2 / t1), np.log(n2 / n1)).pvalue > P_OK
    assert stats.ks_2samp(t1, n1).pvalue > P_OK
    if beta is not None:
        assert stats.kstest(np.log(t2 / t1), lambda t: jc_cdf(t, beta, SB)).pvalue > P_OK


@pytest.mark.parametrize(
    "args",
    [
        (0.0, 1.0, 0.0),
        (-0.1, 1.0, 0.0),
        (1.0, 0.5, 0.0),
        (float("nan"), 1.0, 0.0),
        (0.2, float("inf"), 0.0),
        (0.2, 1.0, float("inf")),
        (0.2, 1.0, float("nan")),
    ],
)
def test_invalid_arguments(args):
    with pytest.raises(ValueError):
        JointSampler(*args)


def test_invalid_helper_arguments():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError):
        sample_joint_crops([(10, 10)], (0.2, 1.0), RATIO, 0.0, rng, fallback="center")
    with pytest.raises(ValueError):
        joint_color_factors(-0.1, 0.0, np.ones(3), np.ones(3), rng)
    with pytest.raises(ValueError):
        joint_factor_pair(0.1, 2.0, 0.0, np.ones(3), np.ones(4), rng)


# ---------------------------------------------------------------- JointCrop boxes


def inside(v, h, w):
    return (
        (v[:, 0] >= 0)
        & (v[:, 1] >= 0)
        & (v[:, 2] > 0)
        & (v[:, 3] > 0)
        & (v[:, 0] + v[:, 2] <= h)
        & (v[:, 1] + v[:, 3] <= w)
    )


def is_whole(v, h, w):
    return (v[:, 0] == 0) & (v[:, 1] == 0) & (v[:, 2] == h) & (v[:, 3] == w)


@pytest.mark.parametrize("fallback", ["image", "fit"])
@pytest.mark.parametrize("beta", [0.0, 2.0, -2.0, None])
def test_boxes_inside_image(beta, fallback):
    rng = np.random.default_rng(2)
    sizes = [(300, 400), (400, 300), (1, 1), (2, 3), (5, 400), (400, 5), (1, 1000), (33, 32), (224, 224)] * 60
    hs, ws = np.array(sizes).T
    for scale in [(0.2, 1.0), (0.08, 1.0), (0.05, 0.4)]:
        v1, v2 = sample_joint_crops(sizes, scale, RATIO, beta, rng, fallback=fallback)
        for v in (v1, v2):
            assert v.dtype == np.int32 and v.shape == (len(sizes), 4)
            assert inside(v, hs, ws).all()


def test_fallback_rate_and_area_fractions():
    """Official rule (spec 1.2, 6.3): the area is NOT redrawn between the 10 tries, so a view misses with
    probability (1 - q(s))^10, q(s) = the share of log-ratio range where a box of area s fits, and then is
    the whole image. At scale (0.2, 1) on 400x300 images that is ~7% of views, not rare. torchvision's rule
    (area redrawn each try) would give ~0 here."""
    H, W, n = 300, 400, 20000
    v1, v2 = sample_joint_crops([(H, W)] * n, (0.2, 1.0), RATIO, 0.0, np.random.default_rng(4))
    fb = np.concatenate([is_whole(v1, H, W), is_whole(v2, H, W)])
    # expected rate from the area law alone (continuous box sizes)
    s = np.concatenate(draw(0.0, n=200000, seed=99))
    lr0, lr1 = np.log(RATIO)
    lo, hi = np.maximum(lr0, np.log(s * W / H)), np.minimum(lr1, np.log(W / (s * H)))
    expected = np.mean((1 - np.clip(hi - lo, 0, None) / (lr1 - lr0)) ** 10)
    assert 0.05 < expected < 0.1
    assert abs(fb.mean() - expected) < 4 * math.sqrt(expected / (2 * n)) + 0.002, (fb.mean(), expected)
    # boxes that did not fall back have their area fraction inside scale, up to rounding of h and w
    v = np.concatenate([v1, v2])[~fb]
    frac = v[:, 2] * v[:, 3] / (H * W)
    tol = 1.0 / v[:, 2] + 1.0 / v[:, 3]
    assert (frac >= 0.2 * (1 - tol)).all() and (frac <= 1.0 * (1 + tol)).all()
    assert frac.min() < 0.21
    # aspect ratios of accepted boxes stay in the range, up to rounding
    ar = v[:, 3] / v[:, 2]
    assert (ar >= RATIO[0] * (1 - tol)).all() and (ar <= RATIO[1] * (1 + tol)).all()

    # with areas that always fit (s <= 0.5625 on 400x300) there is no fallback at all
    u1, u2 = sample_joint_crops([(H, W)] * 5000, (0.08, 0.5), RATIO, -2.0, np.random.default_rng(4))
    assert not (is_whole(u1, H, W) | is_whole(u2, H, W)).any()

    # fallback="fit" keeps every area in scale and every box's area close to its sampled s
    f1, f2 = sample_joint_crops([(H, W)] * n, (0.2, 1.0), RATIO, 0.0, np.random.default_rng(4), fallback="fit")
    f = np.concatenate([f1, f2])
    frac = f[:, 2] * f[:, 3] / (H * W)
    tol = 1.0 / f[:, 2] + 1.0 / f[:, 3]
    assert (frac >= 0.2 * (1 - tol)).all() and (frac <= 1.0 * (1 + tol)).all()
    assert is_whole(f, H, W).mean() < 0.01  # only areas that round to the whole image (s close to 1)


def test_fit_fallback_on_elongated_images():
    """No ratio in [3/4, 4/3] fits a box of area >= 0.2 in a 30x400 image: "fit" keeps the area and takes
    the fitting aspect nearest to the range (full short side); "image" returns the whole image."""
    n = 3000
    for (H, W), short in (((30, 400), 2), ((400, 30), 3)):
        f1, f2 = sample_joint_crops([(H, W)] * n, (0.2, 1.0), RATIO, 0.0, np.random.default_rng(3), fallback="fit")
        i1, i2 = sample_joint_crops([(H, W)] * n, (0.2, 1.0), RATIO, 0.0, np.random.default_rng(3))
        assert is_whole(i1, H, W).all() and is_whole(i2, H, W).all()
        f = np.concatenate([f1, f2])
        assert inside(f, H, W).all()
        assert (f[:, short] == min(H, W)).all()
        frac = f[:, 2] * f[:, 3] / (H * W)
        assert frac.min() >= 0.2 - 1.0 / max(H, W) and frac.min() < 0.22
        # the achieved ratio is still JC(0) up to rounding of the long side
        assert stats.kstest(crop_log_ratio(f1, f2), lambda t: jc_cdf(t, 0.0, SB)).pvalue > P_OK


def crop_log_ratio(v1, v2):
    return np.log((v2[:, 2] * v2[:, 3]) / (v1[:, 2] * v1[:, 3]))


@pytest.mark.parametrize("beta", [0.0, 2.0, -1.0])
def test_crop_area_ratio_follows_jc(beta):
    H, W, n = 300, 400, 6000
    # no fallback can happen at this scale, so the achieved ratio is JC(beta) up to pixel rounding
    scale = (0.08, 0.5)
    v1, v2 = sample_joint_crops([(H, W)] * n, scale, RATIO, beta, np.random.default_rng(50 + int(beta)))
    r = crop_log_ratio(v1, v2)
    s_b = math.log(scale[1] / scale[0])
    assert stats.kstest(r, lambda t: jc_cdf(t, beta, s_b)).pvalue > P_OK
    wrong = -beta if beta != 0.0 else 2.0
    assert stats.kstest(r, lambda t: jc_cdf(t, wrong, s_b)).pvalue < P_POWER
    # the two views' areas share a marginal (symmetry of JC)
    assert stats.ks_2samp(v1[:, 2] * v1[:, 3], v2[:, 2] * v2[:, 3]).pvalue > P_OK
    # aspect ratios stay per-view independent log-uniform (spec 1.2 step 6)
    ar1, ar2 = np.log(v1[:, 3] / v1[:, 2]), np.log(v2[:, 3] / v2[:, 2])
    assert abs(stats.spearmanr(ar1, ar2).statistic) < 4 / math.sqrt(n)
    # default scale with the area-keeping fallback: also JC(beta)
    f1, f2 = sample_joint_crops([(H, W)] * n, (0.2, 1.0), RATIO, beta, np.random.default_rng(60), fallback="fit")
    assert stats.kstest(crop_log_ratio(f1, f2), lambda t: jc_cdf(t, beta, SB)).pvalue > P_OK


def test_crop_positions_uniform():
    """Given a box size, the corner is uniform on [0, H-h] x [0, W-w]."""
    H, W, n = 300, 400, 20000
    v1, _ = sample_joint_crops([(H, W)] * n, (0.08, 0.5), RATIO, 0.0, np.random.default_rng(70))
    uy = (v1[:, 0] + 0.5) / (H - v1[:, 2] + 1)
    ux = (v1[:, 1] + 0.5) / (W - v1[:, 3] + 1)
    assert stats.kstest(uy, "uniform").pvalue > P_OK and stats.kstest(ux, "uniform").pvalue > P_OK


def test_independent_crops_are_params_sample_crop():
    sizes = [(300, 400), (500, 200), (64, 64)] * 200
    v1, v2 = sample_joint_crops(sizes, (0.2, 1.0), RATIO, None, np.random.default_rng(8))
    rng = np.random.default_rng(8)
    ref = [np.array([sample_crop(h, w, (0.2, 1.0), RATIO, rng) for h, w in sizes]) for _ in range(2)]
    assert np.array_equal(v1, ref[0]) and np.array_equal(v2, ref[1])
    # and the law: view areas independent, log-ratio not JC(0) but the i.i.d. one
    H, W, n = 300, 400, 6000
    u1, u2 = sample_joint_crops([(H, W)] * n, (0.2, 1.0), RATIO, None, np.random.default_rng(9))
    a1, a2 = u1[:, 2] * u1[:, 3] / (H * W), u2[:, 2] * u2[:, 3] / (H * W)
    assert abs(stats.spearmanr(a1, a2).statistic) < 4 / math.sqrt(n)
    x1, x2 = draw(None, n=20000, seed=9)
    assert stats.ks_2samp(crop_log_ratio(u1, u2), np.log(x2 / x1)).pvalue > P_OK


# ---------------------------------------------------------------- JointBlur / JointColor helpers


def test_joint_blur_gates_and_law():
    n = 20000
    rng = np.random.default_rng(12)
    on1, on2 = (rng.random(n) < 0.5).astype(np.uint8), (rng.random(n) < 0.5).astype(np.uint8)
    g1, g2 = on1.copy(), on2.copy()
    s1, s2 = joint_blur_sigmas((0.1, 2.0), 0.0, on1, on2, np.random.default_rng(13))
    assert np.array_equal(on1, g1) and np.array_equal(on2, g2)  # gates untouched
    assert s1.dtype == np.float32 and s2.dtype == np.float32
    assert ((s1 == 0) == (on1 == 0)).all() and ((s2 == 0) == (on2 == 0)).all()
    for s, on in ((s1, on1), (s2, on2)):
        assert s[on > 0].min() >= np.float32(0.1) and s[on > 0].max() <= np.float32(2.0)
    both = (on1 > 0) & (on2 > 0)
    r = np.log(s2[both].astype(float) / s1[both])
    assert stats.kstest(r, lambda t: jc_cdf(t, 0.0, math.log(20))).pvalue > P_OK
    # the value of view 1 does not depend on view 2's gate (gates independent, pair never redrawn)
    only1 = (on1 > 0) & (on2 == 0)
    assert stats.ks_2samp(s1[only1], s1[both]).pvalue > P_OK
    # power: the joint sigma marginal is not the independent U[0.1, 2]
    assert stats.kstest(s1[on1 > 0], "uniform", args=(0.1, 1.9)).pvalue < P_POWER


@pytest.mark.parametrize("strength,low", [(0.4, 0.6), (1.0, 1e-3), (1.5, 1e-3)])
def test_joint_color_factors(strength, low):
    n = 20000
    on = np.ones(n, dtype=np.uint8)
    off2 = np.zeros(n, dtype=np.uint8)
    f1, f2 = joint_color_factors(strength, -1.0, on, on, np.random.default_rng(14))
    high = 1.0 + strength
    for f in (f1, f2):
        assert f.min() >= np.float32(low) and f.max() <= np.float32(high)
    r = np.log(f2.astype(float) / f1)
    # float32 storage rounds the log-ratio by ~1e-7; the ratio range is log(high / low)
    assert stats.kstest(r, lambda t: jc_cdf(t, -1.0, math.log(high / low))).pvalue > P_OK
    g1, g2 = joint_color_factors(strength, -1.0, on, off2, np.random.default_rng(14))
    assert (g2 == 1.0).all() and np.array_equal(g1, f1)


def test_joint_color_zero_strength_and_factor_pair_off_value():
    on = np.ones(50, dtype=np.uint8)
    f1, f2 = joint_color_factors(0.0, 2.0, on, on, np.random.default_rng(0))
    assert (f1 == 1.0).all() and (f2 == 1.0).all()
    x1, x2 = joint_factor_pair(0.5, 1.5, None, on, np.zeros(50), np.random.default_rng(0), off=-7.0)
    assert (x2 == -7.0).all() and x1.min() >= 0.5 and x1.max() <= 1.5
