import numpy as np
import pytest
import torch

from pipeline.eval.knn import knn_classify, knn_metrics, knn_regress, r2_score
from pipeline.eval.probe.lbfgs import probe


def test_knn_classify_recovers_clusters():
    g = torch.Generator().manual_seed(0)
    centres = torch.randn(3, 8, generator=g) * 5
    y = torch.arange(3).repeat_interleave(20)
    bank = centres[y] + torch.randn(60, 8, generator=g) * 0.1
    query = centres + torch.randn(3, 8, generator=g) * 0.1
    assert knn_classify(bank, y, query, k=5).tolist() == [0, 1, 2]


def test_knn_regress_is_weighted_mean_of_neighbours():
    bank = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.1]])
    y = torch.tensor([[1.0], [5.0], [3.0]])
    query = torch.tensor([[1.0, 0.05]])
    sims = torch.nn.functional.normalize(bank, dim=1) @ torch.nn.functional.normalize(query, dim=1).t()
    top = sims.squeeze(1).topk(2)
    w = (top.values / 0.5).exp()
    expected = (w * y[top.indices, 0]).sum() / w.sum()
    assert knn_regress(bank, y, query, k=2, temperature=0.5).item() == pytest.approx(expected.item(), rel=1e-6)


def test_r2_score_matches_definition():
    rng = np.random.default_rng(0)
    y, p = rng.normal(size=(50, 2)), rng.normal(size=(50, 2))
    ref = 1 - ((p - y) ** 2).sum(0) / ((y - y.mean(0)) ** 2).sum(0)
    np.testing.assert_allclose(r2_score(torch.tensor(p), torch.tensor(y)).numpy(), ref)


def test_probe_regression_fits_linear_targets_and_not_noise():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(400, 10, generator=g)
    w = torch.randn(10, 2, generator=g)
    y = x @ w + 0.01 * torch.randn(400, 2, generator=g)
    res = probe(x[:300], y[:300], x[300:], y[300:], "regression", names=["a", "b"], steps=50)
    assert res["r2_a"] > 0.99 and res["r2_b"] > 0.99
    noise = probe(
        torch.randn(300, 10, generator=g), y[:300], torch.randn(100, 10, generator=g), y[300:], "regression", steps=50
    )
    assert noise["r2"] < 0.2


def test_probe_classification():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(300, 5, generator=g)
    y = (x[:, 0] > 0).long()
    res = probe(x[:200], y[:200], x[200:], y[200:], "classification", steps=30)
    assert res["top1"] > 0.95


def test_knn_metrics_keys():
    bank = torch.randn(20, 4)
    out = knn_metrics(bank, torch.randn(20, 2), bank[:5], torch.randn(5, 2), "regression", 3, 0.1, ["m", "b"])
    assert set(out) == {"knn_r2", "knn_r2_m", "knn_r2_b"}


def test_probe_is_not_blown_up_by_near_constant_features():
    from pipeline.eval.probe.lbfgs import probe

    g = torch.Generator().manual_seed(0)
    x = torch.randn(400, 8, generator=g)
    y = (x[:, :2] @ torch.tensor([[1.0], [0.5]])).squeeze(1) + 0.01 * torch.randn(400, generator=g)
    dead_train = 1e-7 * torch.randn(300, 1, generator=g)  # a unit that is (almost) constant in training
    dead_test = 1e-3 * torch.randn(100, 1, generator=g)  # and merely small at test time
    xtr, xte = torch.cat([x[:300], dead_train], 1), torch.cat([x[300:], dead_test], 1)
    res = probe(xtr, y[:300, None], xte, y[300:, None], "regression", ["t"], steps=100, weight_decay=1e-5)
    assert res["r2"] > 0.95
