"""Spirograph views keep the factors and redraw the nuisance: the law of the views, not just shapes."""

import json

import numpy as np
import torch

from pipeline.augment.spirograph_views import SpirographRecipe, factors, render_views
from pipeline.augment.view_makers import build_view_maker
from pipeline.data.spirograph import NUISANCE, RANGES, TARGETS, render_flat, sample_params


def _batch(n, seed=0):
    p = sample_params(n, torch.Generator().manual_seed(seed))
    rows = [json.dumps({k: float(v[i]) for k, v in p.items()}).encode() for i in range(n)]
    return p, {"json": np.array(rows, dtype=object)}


def test_views_render_stored_factors_with_their_own_nuisance():
    p, batch = _batch(6)
    views = build_view_maker({"kind": "spirograph", "size": 32, "n_views": 2}, 6)(batch, np.random.default_rng(0))
    assert len(views.images) == 2 and views.images[0].shape == (6, 3, 32, 32)
    for img, params in zip(views.images, views.params):
        # each view records its nuisance alpha and the sample's factors (InvCLR re-renders from both)
        assert set(params) == set(NUISANCE) | set(TARGETS)
        for t in TARGETS:
            torch.testing.assert_close(params[t], p[t])
        # re-rendering the stored factors with the recorded nuisance gives the view back exactly
        expected = render_flat({**{t: p[t] for t in TARGETS}, **{k: params[k] for k in NUISANCE}}, 32)
        torch.testing.assert_close(img, expected)
    # the two views differ in nuisance, so in pixels
    assert not torch.equal(views.params[0]["h"], views.params[1]["h"])
    assert (views.images[0] - views.images[1]).abs().mean() > 0.01


def test_nuisance_follows_its_uniform_law():
    x = {t: torch.full((4000,), v) for t, v in zip(TARGETS, (3.0, 0.5, 0.5, 0.7))}
    _, params = render_views(x, SpirographRecipe(size=8, n_views=1), torch.Generator().manual_seed(1))
    from scipy.stats import kstest

    for name, v in params[0].items():
        lo, hi = RANGES[name]
        assert v.min() >= lo and v.max() <= hi
        assert kstest(v.numpy(), "uniform", args=(lo, hi - lo)).pvalue > 1e-3


def test_factors_parse_json_rows():
    p, batch = _batch(3, seed=2)
    x = factors(list(batch["json"]))
    for t in TARGETS:
        torch.testing.assert_close(x[t], p[t])
