"""Invariance metrics and feature averaging (docs/methods/invclr.md §1.3, §4.2, §4.4): pipeline/eval/invariance.py
and the feature-averaged linear probe of pipeline/eval/probe/compare.py."""

import numpy as np
import pytest
import torch
from torch import nn

from pipeline.data.reader import Split
from pipeline.data.spirograph import NUISANCE, TARGETS, render_flat, sample_nuisance, sample_params
from pipeline.eval.invariance import (
    alpha_reference,
    alpha_regression,
    averaged_features,
    conditional_variance,
    conditional_variance_of,
    feature_average,
    transformed_features,
)
from pipeline.fields import Checked
from pipeline.losses.invclr import rademacher
from pipeline.sections import Config

SPIRO_AUG = {"kind": "spirograph", "size": 16}


@pytest.fixture(autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def spiro_split(n: int, seed: int = 0) -> Split:
    p = sample_params(n, torch.Generator().manual_seed(seed))
    return Split([], torch.stack([p[t] for t in TARGETS], 1).numpy(), list(TARGETS))


class SmallNet(nn.Module):
    """Conv + BatchNorm (eval mode matters) + pooling: a backbone that reads shape and colour."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(
            nn.Conv2d(3, 6, 3, padding=1), nn.BatchNorm2d(6), nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten()
        )
        with torch.no_grad():  # running statistics far from any batch's, so train mode would differ
            self.body[1].running_mean.fill_(0.3)
            self.body[1].running_var.fill_(4.0)

    def forward(self, x):
        return self.body(x)


class Constant(nn.Module):
    """Ignores its input entirely: a representation invariant to every nuisance."""

    def forward(self, x):
        return torch.ones(x.shape[0], 5) + torch.arange(5.0)


class MeanColour(nn.Module):
    """Reads the image's mean colour, which the nuisance colours (f_g, f_b, b_r, b_g, b_b) move."""

    def forward(self, x):
        return torch.cat([x.mean(dim=(2, 3)), torch.ones(x.shape[0], 1)], 1)


def test_features_are_per_copy_renders_and_their_mean_is_the_feature_average(capsys):
    net = SmallNet().train()
    split = spiro_split(10)
    feats, alpha, kept = transformed_features(
        net, split, SPIRO_AUG, 4, seed=5, batch_size=4, return_kept=True, progress=True
    )
    assert "10/10 samples (100%" in capsys.readouterr().out
    assert feats.shape == (10, 4, 24) and alpha.shape == (10, 4, 6) and kept.tolist() == list(range(10))
    assert net.training  # mode restored
    # copy c of sample i is the backbone (eval mode) on the render of the sample's factors with alpha[i, c]
    x = {t: torch.as_tensor(split.y[:, j]) for j, t in enumerate(TARGETS)}
    net.eval()
    with torch.no_grad():
        for c in range(4):
            a = {k: alpha[:, c, j] for j, k in enumerate(NUISANCE)}
            torch.testing.assert_close(feats[:, c], net(render_flat({**x, **a}, 16)), atol=1e-5, rtol=1e-5)
    # alpha is fresh per copy and in the nuisance ranges
    assert (alpha[:, 0] != alpha[:, 1]).all()
    assert alpha[..., 0].min() >= 0.5 and alpha[..., 0].max() <= 2.5
    # Eq. 14: the mean of the per-copy features, directly and streamed batch by batch with the same draws
    direct = sum(feats[:, c] for c in range(4)) / 4
    torch.testing.assert_close(feature_average(feats), direct)
    streamed, k2 = averaged_features(net.train(), split, SPIRO_AUG, 4, seed=5, batch_size=3)
    assert k2.tolist() == list(range(10))
    torch.testing.assert_close(streamed, direct, atol=1e-6, rtol=1e-5)


def test_conditional_variance_is_zero_for_a_nuisance_blind_backbone_only():
    split = spiro_split(12, seed=1)
    blind, _ = transformed_features(Constant(), split, SPIRO_AUG, 5, seed=0)
    colour, _ = transformed_features(MeanColour(), split, SPIRO_AUG, 5, seed=0)
    g = torch.Generator().manual_seed(0)
    assert conditional_variance_of(blind, g) == 0.0
    assert conditional_variance_of(colour, torch.Generator().manual_seed(0)) > 1e-3
    # averaging m copies divides the within-sample variance by m (Eq. 15): fewer spread across samples' draws
    many, _ = transformed_features(MeanColour(), split, SPIRO_AUG, 16, seed=0)
    assert (
        feature_average(many[:, :8]).sub(feature_average(many[:, 8:])).abs().mean()
        < (many[:, 0] - many[:, 1]).abs().mean()
    )


def test_conditional_variance_of_equals_a_direct_loop_of_eq7():
    g = torch.Generator().manual_seed(0)
    K, L, D = 7, 5, 6
    feats = torch.randn(K, L, D, generator=g) * 3 + 1
    value = conditional_variance_of(feats, torch.Generator().manual_seed(11))
    e = rademacher((K, D), generator=torch.Generator().manual_seed(11), dtype=torch.float64)  # one e per sample
    z = feats.double().tolist()
    total = 0.0
    for i in range(K):
        F = []
        for j in range(L):
            norm = sum(v * v for v in z[i][j]) ** 0.5
            F.append(sum(float(e[i, d]) * z[i][j][d] / norm for d in range(D)))
        total += sum(f * f for f in F) / (L - 1) - sum(F) ** 2 / (L * (L - 1))
    assert value == pytest.approx(total / K, rel=1e-12, abs=1e-15)
    assert value > 0


def test_conditional_variance_matches_eq7_and_numpy():
    Fv = torch.randn(6, 9, generator=torch.Generator().manual_seed(40), dtype=torch.float64)
    got = conditional_variance(Fv).item()
    assert got == pytest.approx(float(np.var(Fv.numpy(), axis=1, ddof=1).mean()), rel=1e-12)
    eq7 = 0.0
    for i in range(6):
        row = [float(v) for v in Fv[i]]
        L = len(row)
        eq7 += (sum(v * v for v in row) / (L - 1) - sum(row) ** 2 / (L * (L - 1))) / 6
    assert got == pytest.approx(eq7, rel=1e-10)


def test_conditional_variance_zero_for_constant_rows():
    Fv = torch.tensor([[0.3] * 5, [-1.7] * 5, [2.0] * 5], dtype=torch.float64)
    assert conditional_variance(Fv).item() == pytest.approx(0.0, abs=1e-15)
    Fv[1, 2] += 0.5
    assert conditional_variance(Fv).item() > 1e-3


def test_conditional_variance_rejects_single_draw():
    with pytest.raises(ValueError):
        conditional_variance(torch.zeros(4, 1))


def test_alpha_regression_recovers_linear_alpha_and_scores_noise_at_the_reference():
    ref, source = alpha_reference(SPIRO_AUG)
    assert source == "law" and round(ref, 4) == 0.0806  # Table 8 / 2.2: (4/12 + 5 * 0.36/12)/6
    g = torch.Generator().manual_seed(0)

    def alphas(n):
        a = sample_nuisance(n, g)
        return torch.stack([a[k] for k in NUISANCE], 1)

    # z linear in alpha (plus tiny noise): alpha is read back almost exactly
    w, b = torch.randn(6, 16, generator=g), torch.randn(16, generator=g)
    atr, ate = alphas(600), alphas(300)
    lin = alpha_regression(
        atr @ w + b + 1e-4 * torch.randn(600, 16, generator=g),
        atr,
        ate @ w + b + 1e-4 * torch.randn(300, 16, generator=g),
        ate,
        ref,
        NUISANCE,
        steps=50,
    )
    assert lin["mse"] < 1e-3 * ref and lin["reference"] == ref
    # z independent of alpha: the best linear predictor is the constant one, so the test MSE is the law's
    # Mean_i Var(alpha_i). Tolerance 5%: the fitted weights add ~D/n_train = 0.2% (OLS on pure noise), and
    # the test rows' variance of a uniform has relative s.e. sqrt(0.8/n) = 1.4% per dimension for n = 4000,
    # ~0.6% averaged over 6 independent dimensions; 5% is > 5 s.e. A standardised or mis-scaled target, or
    # a regression on the wrong rows, is off by far more.
    atr, ate = alphas(4000), alphas(4000)
    noise = alpha_regression(
        torch.randn(4000, 8, generator=g), atr, torch.randn(4000, 8, generator=g), ate, ref, NUISANCE, steps=50
    )
    assert noise["mse"] == pytest.approx(ref, rel=0.05)
    assert noise["reference_empirical"] == pytest.approx(ref, rel=0.05)
    assert abs(noise["r2"]) < 0.02
    # [N, copies, D] inputs are flattened into rows
    again = alpha_regression(
        torch.randn(4000, 8, generator=g).reshape(1000, 4, 8),
        atr.reshape(1000, 4, 6),
        torch.randn(4000, 8, generator=g).reshape(1000, 4, 8),
        ate.reshape(1000, 4, 6),
        steps=10,
    )
    assert again["mse"] == pytest.approx(ref, rel=0.05) and again["reference"] == again["reference_empirical"]


def test_image_alpha_reference_is_the_gated_colour_jitter_law():
    from pipeline.augment.params import sample_view_params
    from pipeline.augment.view_makers import image_recipe
    from pipeline.config import compose_config

    aug = compose_config(["augment=invclr", "data=cifar10"])["augment"]
    # without the gate it is the paper's CIFAR reference (4.2): (3 * 0.8^2/12 + 0.2^2/12)/4
    assert round(alpha_reference({**aug, "p_jitter": 1.0})[0], 4) == 0.0408
    ref, source = alpha_reference(aug)
    assert source == "law"
    spec = image_recipe(aug).views[0]
    p = sample_view_params([(32, 32)] * 20000, spec, np.random.default_rng(0))
    empirical = np.mean([p[k].var() for k in ("brightness", "contrast", "saturation", "hue")])
    assert ref == pytest.approx(empirical, rel=0.05)  # MC s.e. ~1% at n = 20000
    assert alpha_reference({**aug, "joint": {"color": {"beta": 1.0}}}) == (None, "empirical")


def test_compare_with_random_reports_feature_averaged_probe_and_invariance(tmp_path, monkeypatch, capsys):
    from pathlib import Path

    import mlflow
    from mlflow.tracking._tracking_service import utils as mlflow_uri

    from pipeline import checkpoint as ck
    from pipeline import tracking
    from pipeline.build import build_method
    from pipeline.config import compose_config
    from pipeline.data.spirograph_shards import make_spirograph_splits
    from pipeline.eval.probe.compare import compare_with_random
    from pipeline.eval.probe.spec import ProbeSpec
    from pipeline.store import Store

    small = [
        f"paths.root={tmp_path}",
        "model.width=8",
        "method.bn_splits=1",
        "eval.probe.steps=10",
        "eval.probe.batch_size=100",
        "data.generate.n_train=300",
        "data.generate.n_val=100",
    ]
    cfg = compose_config(
        small
        + [
            "eval.feature_averaging.m=4",
            "eval.invariance.enabled=true",
            "eval.invariance.copies=3",
            "eval.invariance.samples=40",
        ]
    )
    # the managed folder of these data.generate settings (named by their hash)
    make_spirograph_splits(Path(cfg["data"]["train"]).parent, 300, 100, seed=0, size=32, progress=False)
    method = build_method(cfg)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    ck.save(ckpt, method, torch.optim.SGD(method.parameters(), lr=0.1), 0, 0, cfg)

    # the MLflow store lives under tmp_path/runs (tracking.uri null, no env override). tracking.setup exports
    # MLFLOW_TRACKING_URI (mlflow.set_tracking_uri) before asking artifact_root, which then defers to MLflow's
    # default ./mlruns: run from tmp_path so the artifacts land there too.
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    previous_uri = mlflow_uri._tracking_uri
    try:
        run_id = tracking.start_or_resume(Store.of(cfg), "test-invariance", "probe", job="linear_probe")
        try:
            torch.manual_seed(0)  # the probe's head is initialised from the global RNG
            results = compare_with_random(ProbeSpec.of(Checked.of(Config, cfg)), ckpt)
        finally:
            mlflow.end_run()
    finally:
        mlflow.set_tracking_uri(previous_uri)
    out = capsys.readouterr().out
    assert "pretrained, FA m=4" in out and "random, FA m=4" in out
    header = next(line for line in out.splitlines() if line.startswith("metric"))
    assert header.split()[:3] == ["metric", "pretrained", "pretrained,"] and "random" in header
    assert "conditional variance" in out and "0.0806" in out
    assert set(results) == {"pretrained", "pretrained_fa", "random", "random_fa", "invariance"}
    for k in ("pretrained_fa", "random_fa"):
        assert set(results[k]) == set(results["pretrained"]) and all(np.isfinite(list(results[k].values())))
    assert results["pretrained_fa"] != results["pretrained"]
    inv = results["invariance"]
    assert inv["invariance_alpha_reference"] == pytest.approx(0.0806, abs=5e-5)
    assert inv["invariance_pretrained_conditional_variance"] > 0 and inv["invariance_random_alpha_mse"] > 0

    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    logged = client.get_run(run_id).data.metrics
    assert logged["probe/pretrained_fa_r2_m"] == pytest.approx(results["pretrained_fa"]["r2_m"])
    assert logged["probe/random_fa_mse"] == pytest.approx(results["random_fa"]["mse"])
    assert logged["probe/pretrained_r2_m"] == pytest.approx(results["pretrained"]["r2_m"])
    assert logged["probe/fa_m"] == 4
    for name in (
        "invariance_pretrained_conditional_variance",
        "invariance_pretrained_alpha_mse",
        "invariance_random_conditional_variance",
        "invariance_random_alpha_mse",
        "invariance_alpha_reference",
    ):
        assert logged[f"probe/{name}"] == pytest.approx(inv[name])
    arts = {a.path for a in client.list_artifacts(run_id, "probe")}
    assert {"probe/probe.png", "probe/table.txt", "probe/invariance.txt"} <= arts
    assert client.get_run(run_id).info.artifact_uri.replace("file://", "").startswith(str(tmp_path))
    table = client.download_artifacts(run_id, "probe/table.txt", str(tmp_path / "download"))
    assert "pretrained, FA m=4" in open(table).read()

    # the default (m = 0, invariance off) is the single-sample probe alone, with the same numbers
    torch.manual_seed(0)
    default = compare_with_random(ProbeSpec.of(Checked.of(Config, compose_config(small))), ckpt)
    assert set(default) == {"pretrained", "random"}
    assert default["pretrained"] == results["pretrained"] and default["random"] == results["random"]
    assert "FA m=" not in capsys.readouterr().out
