import math

import pytest
import torch

from pipeline.data import spirograph as sp

# Fig. 7 parameters of the paper (sigma = 0.5 as the text says for Fig. 7(b)).
FIG7 = {
    "m": 4.0,
    "b": 0.4,
    "h": 2.0,
    "sigma": 0.5,
    "f_r": 0.9,
    "f_g": 0.8,
    "f_b": 0.7,
    "b_r": 0.3,
    "b_g": 0.4,
    "b_b": 0.5,
}


def _flat(values: dict, dtype=torch.float32) -> dict:
    return {k: torch.tensor([v], dtype=dtype) for k, v in values.items()}


def _reference_image(p: dict, size: int) -> list[list[list[float]]]:
    """Eqs. 36-39 with plain math: [channel][row][column]."""
    ts = [2 * math.pi * i / 39 for i in range(40)]
    r = p["m"] - p["h"]
    pts = [
        (r * math.cos(t) + p["h"] * math.cos(r * t / p["b"]), r * math.sin(t) - p["h"] * math.sin(r * t / p["b"]))
        for t in ts
    ]
    grid = [-6 + 12 * k / (size - 1) for k in range(size)]
    raw = [
        [sum(math.exp((-((u - x) ** 2) - (v - y) ** 2) / p["sigma"]) for x, y in pts) / 40 for v in grid] for u in grid
    ]
    peak = max(max(row) for row in raw)
    fg, bg = (p["f_r"], p["f_g"], p["f_b"]), (p["b_r"], p["b_g"], p["b_b"])
    return [
        [
            [raw[i][j] / (peak + 1e-8) * fg[c] + (1 - raw[i][j] / (peak + 1e-8)) * bg[c] for j in range(size)]
            for i in range(size)
        ]
        for c in range(3)
    ]


def test_curve_points_match_equations():
    p = FIG7
    x, y = sp.curve_points(*(torch.tensor([p[k]], dtype=torch.float64) for k in ("m", "b", "h")))
    assert x.shape == y.shape == (1, 40)
    for i in (0, 1, 17, 39):
        t = 2 * math.pi * i / 39
        assert x[0, i].item() == pytest.approx(2 * math.cos(t) + 2 * math.cos(5 * t), abs=1e-9)
        assert y[0, i].item() == pytest.approx(2 * math.sin(t) - 2 * math.sin(5 * t), abs=1e-9)
    assert x[0, 0].item() == pytest.approx(4.0)  # t = 0: x = m
    assert y[0, 0].item() == pytest.approx(0.0, abs=1e-12)


def test_render_matches_plain_python_reference():
    size = 32
    image = sp.render_flat(_flat(FIG7, torch.float64), size=size)
    assert image.shape == (1, 3, size, size)
    ref = torch.tensor(_reference_image(FIG7, size), dtype=torch.float64)
    torch.testing.assert_close(image[0], ref, atol=1e-9, rtol=0)
    # float32 render is close to the same reference too
    torch.testing.assert_close(sp.render_flat(_flat(FIG7), size=size)[0].double(), ref, atol=1e-5, rtol=0)


def test_render_range_and_batching():
    params = sp.sample_params(64, torch.Generator().manual_seed(1))
    images = sp.render_flat(params, size=32)
    assert images.shape == (64, 3, 32, 32) and images.dtype == torch.float32
    assert images.min() >= 0 and images.max() <= 1
    # normalisation to max 1: each image has a pixel of exactly its foreground colour
    fg = sp.to_render_params(params)["fg"]
    distance_to_fg = (images - fg[:, :, None, None]).abs().sum(dim=1).amin(dim=(1, 2))
    assert distance_to_fg.max() < 1e-5
    # batched result equals rendering one at a time
    one = sp.render_flat({k: v[5:6] for k, v in params.items()}, size=32)
    torch.testing.assert_close(images[5:6], one)


def test_rows_follow_x_and_columns_follow_y():
    # (m - h) / b = 0.25: the inner circle turns a quarter turn, so the curve stays at x > 0, y < 0.
    p = dict(FIG7, m=2.775, h=2.5, b=1.1, sigma=0.25)
    intensity = sp.render_flat(_flat(p), size=32)[0, 0] - p["b_r"]
    weights = intensity / intensity.sum()
    index = torch.arange(32, dtype=torch.float32)
    row_centre = (weights.sum(dim=1) * index).sum()
    col_centre = (weights.sum(dim=0) * index).sum()
    assert row_centre > 15.5 + 3  # large x -> large row index
    assert col_centre < 15.5 - 3  # negative y -> small column index


def test_gradcheck_h_fg_bg():
    # Asymmetric curves: a symmetric one ties for the grid maximum, where the max is not differentiable.
    asym = dict(FIG7, m=3.7, b=0.37, h=1.3, sigma=0.8)
    base = sp.to_render_params(_flat(asym, torch.float64))
    base = {k: torch.cat([v, v * 0.9]) for k, v in base.items()}  # two images
    h, fg, bg = (base[k].clone().requires_grad_() for k in ("h", "fg", "bg"))

    def fn(h, fg, bg):
        return sp.render(dict(base, h=h, fg=fg, bg=bg), size=6)

    assert torch.autograd.gradcheck(fn, (h, fg, bg), eps=1e-6, atol=1e-5)
    fn(h, fg, bg).sum().backward()
    for grad in (h.grad, fg.grad, bg.grad):
        assert torch.isfinite(grad).all() and (grad != 0).all()


def test_all_parameters_receive_gradients():
    params = {k: v.requires_grad_() for k, v in sp.sample_params(4, torch.Generator().manual_seed(2)).items()}
    sp.render_flat(params, size=16).square().sum().backward()
    for name, value in params.items():
        assert torch.isfinite(value.grad).all() and value.grad.abs().sum() > 0, name


def test_ranges_match_spec():
    assert sp.PARAM_NAMES == sp.TARGETS + sp.NUISANCE and len(set(sp.PARAM_NAMES)) == 10
    assert sp.RANGES == {
        "m": (2, 5),
        "b": (0.1, 1.1),
        "sigma": (0.25, 1),
        "f_r": (0.4, 1),
        "f_g": (0.4, 1),
        "f_b": (0.4, 1),
        "h": (0.5, 2.5),
        "b_r": (0, 0.6),
        "b_g": (0, 0.6),
        "b_b": (0, 0.6),
    }
    # spec reference value: mean nuisance variance = (4/12 + 5 * 0.36/12) / 6
    mean_var = sum((sp.RANGES[k][1] - sp.RANGES[k][0]) ** 2 / 12 for k in sp.NUISANCE) / 6
    assert mean_var == pytest.approx(0.0806, abs=1e-4)


def test_sampled_params_follow_uniform_law():
    n = 20000
    params = sp.sample_params(n, torch.Generator().manual_seed(0))
    assert set(params) == set(sp.PARAM_NAMES)
    empirical_vars = {}
    for name, value in params.items():
        low, high = sp.RANGES[name]
        width = high - low
        assert value.shape == (n,) and value.dtype == torch.float32
        assert value.min() >= low and value.max() <= high
        assert value.mean().item() == pytest.approx((low + high) / 2, abs=0.02 * width)
        empirical_vars[name] = value.double().var().item()
        assert empirical_vars[name] == pytest.approx(width**2 / 12, rel=0.05)
    assert sum(empirical_vars[k] for k in sp.NUISANCE) / 6 == pytest.approx(0.0806, rel=0.03)


def test_sampling_is_seeded_and_nuisance_only():
    a = sp.sample_params(5, torch.Generator().manual_seed(7))
    b = sp.sample_params(5, torch.Generator().manual_seed(7))
    assert all(torch.equal(a[k], b[k]) for k in sp.PARAM_NAMES)
    nuisance = sp.sample_nuisance(5, torch.Generator().manual_seed(7))
    assert set(nuisance) == set(sp.NUISANCE)
    for name, value in nuisance.items():
        assert value.min() >= sp.RANGES[name][0] and value.max() <= sp.RANGES[name][1]


def test_to_render_params_layout():
    flat = sp.sample_params(3, torch.Generator().manual_seed(3))
    rp = sp.to_render_params(flat)
    assert set(rp) == {"m", "b", "h", "sigma", "fg", "bg"}
    assert rp["fg"].shape == rp["bg"].shape == (3, 3)
    torch.testing.assert_close(rp["fg"][:, 1], flat["f_g"])
    torch.testing.assert_close(rp["bg"][:, 2], flat["b_b"])
