"""Invariance of a frozen backbone to the training transformations (docs/methods/invclr.md §1.3, §4.2, §4.4).

* `transformed_features`: features of `n_copies` transformed versions of every sample of an eval split,
  with the transformation parameters alpha that made them.
* `feature_average`: Eq. 14, z^(M)(x) = (1/M) sum_m f(t(x, alpha_m, beta_m)); `averaged_features` streams it
  without holding the [N, M, D] tensor.
* `conditional_variance`: V by the nested Monte Carlo Eq. 7 from the values F_ij of L copies of K samples;
  `conditional_variance_of`: the same on F = e . z/||z|| (Eq. 5), one Rademacher e per sample shared by its copies.
* `alpha_regression`: test MSE of a linear regression of raw alpha from z (higher = more invariant) and the
  reference Mean_i Var(alpha_i), the loss of the best constant predictor (`alpha_reference`).

What alpha is:
* Spirograph (`augment.kind: spirograph`): the six nuisance parameters (h, f_g, f_b, b_r, b_g, b_b) in
  `spirograph.NUISANCE` order. Each copy re-renders the sample's factors (m, b, sigma, f_r) with a fresh
  nuisance draw; there is no beta, and images stay in [0, 1] (no normalisation), as in training (2.2, 3.3).
* Image recipes (`augment.kind: views`): (brightness, contrast, saturation, hue) of the recipe's FIRST view,
  made by the configured view maker (crop, flip, colour jitter, grayscale, ...; the model-side colour stage
  is applied when the recipe leaves colour to the model). Where the view's jitter gate was off (probability
  1 - p_jitter) the recorded factors are the identity, 1, 1, 1, 0: that is what the images were made with,
  and the view parameters do not keep a draw for those samples. So the law of alpha here is the gated one;
  InvCLR's code regresses the un-gated draws instead, whence its reference 0.0408 = the p_jitter = 1 value
  (see `alpha_reference`).
"""

from __future__ import annotations

import time
from typing import Any, Iterator, Mapping, Sequence

import numpy as np
import torch
from torch import nn

from pipeline.augment.colour import ModelColourStage
from pipeline.augment.executors import params_to_tensors
from pipeline.augment.params import sample_views, select
from pipeline.augment.recipe import Recipe
from pipeline.augment.view_makers import build_view_maker, image_recipe
from pipeline.data.spirograph import NUISANCE, RANGES, TARGETS, render_flat, sample_nuisance
from pipeline.eval.probe.lbfgs import probe
from pipeline.losses.invclr import rademacher, scalar_projection
from pipeline.losses.precision import float32

IMAGE_ALPHA = ("brightness", "contrast", "saturation", "hue")  # = pipeline.augment.colour.ALPHA_KEYS
_IDENTITY = {"brightness": 1.0, "contrast": 1.0, "saturation": 1.0, "hue": 0.0}
_AUTO_PROGRESS = 10_000  # forward passes (samples x copies) from which progress is printed by default


def is_spirograph(aug: Mapping[str, Any]) -> bool:
    return aug.get("kind", "views") == "spirograph"


def alpha_names(aug: Mapping[str, Any]) -> tuple[str, ...]:
    """Names of the alpha columns `transformed_features` returns for this augment config."""
    return NUISANCE if is_spirograph(aug) else IMAGE_ALPHA


def split_targets(task: str, targets: list[str] | None, aug: Mapping[str, Any]) -> list[str] | None:
    """The targets to load an eval split with so that `transformed_features` can use it (data.task, data.targets,
    the recipe): Spirograph re-renders from all four factors, so it needs them whatever `data.targets` says."""
    if task != "regression":
        return targets
    targets = list(targets or [])
    if is_spirograph(aug):
        targets += [t for t in TARGETS if t not in targets]
    return targets


# ----------------------------------------------------------------------------------------------- features


def transformed_features(
    backbone: nn.Module,
    split,
    aug: Mapping[str, Any],
    n_copies: int,
    device: str | torch.device = "cpu",
    seed: int = 0,
    batch_size: int = 256,
    *,
    fix_beta: bool = False,
    return_kept: bool = False,
    progress: bool | None = None,
):
    """Features of `n_copies` transformed versions of every sample of `split` (a reader.Split).

    Returns feats [N', n_copies, D] (float32, CPU) and alpha [N', n_copies, d_alpha] (`alpha_names` order),
    plus, with `return_kept`, the indices of the N' samples into the split (image data: samples that do not
    decode in every copy are dropped; Spirograph: all of them). The backbone runs in eval mode (BatchNorm
    running statistics) without gradients; its mode is restored after.

    fix_beta: image recipes only. False (Eq. 14, 4.4): every copy is a fresh draw of the whole first view
    (alpha and beta). True (Eq. 6/7): beta (crop, flip, the jitter and grayscale gates, every other view
    parameter) is drawn once per sample and only alpha is redrawn for the copies, from the view's own law
    (independent of a JointColor partner view). Spirograph has no beta, so the flag changes nothing there.
    progress: print a line every ~10% of the work; None = only for runs of >= 10k forward passes.
    Draws come from `seed`: Spirograph's do not depend on batch_size; image recipes draw batch by batch, so
    theirs do.
    """
    feats, alphas, kept = [], [], []
    for f, a, k in _iter_copies(backbone, split, aug, n_copies, device, seed, batch_size, fix_beta, progress):
        feats.append(f)
        alphas.append(a)
        kept.append(k)
    out = (torch.cat(feats), torch.cat(alphas))
    return (*out, np.concatenate(kept)) if return_kept else out


def averaged_features(
    backbone: nn.Module,
    split,
    aug: Mapping[str, Any],
    m: int,
    device: str | torch.device = "cpu",
    seed: int = 0,
    batch_size: int = 256,
    *,
    progress: bool | None = None,
) -> tuple[torch.Tensor, np.ndarray]:
    """Eq. 14 over the split, batch by batch: (z^(m) [N', D], kept indices). Equal to
    feature_average(transformed_features(..., m, seed=seed)) without holding the [N, m, D] tensor."""
    feats, kept = [], []
    for f, _, k in _iter_copies(backbone, split, aug, m, device, seed, batch_size, False, progress):
        feats.append(feature_average(f))
        kept.append(k)
    return torch.cat(feats), np.concatenate(kept)


def feature_average(feats: torch.Tensor) -> torch.Tensor:
    """Eq. 14: [N, M, D] per-copy (raw, un-normalised) encoder outputs -> [N, D] their mean over the copies."""
    if feats.dim() != 3:
        raise ValueError(f"feats must be [N, copies, D], got {tuple(feats.shape)}")
    return feats.mean(dim=1)


def _iter_copies(
    backbone, split, aug, n_copies, device, seed, batch_size, fix_beta, progress
) -> Iterator[tuple[torch.Tensor, torch.Tensor, np.ndarray]]:
    if n_copies < 1:
        raise ValueError(f"n_copies must be >= 1, got {n_copies}")
    n = len(split.y)
    make = _spirograph_batches if is_spirograph(aug) else _image_batches
    total = n * n_copies
    show = total >= _AUTO_PROGRESS if progress is None else progress
    was_training = backbone.training
    backbone.eval()
    t0, next_report, done = time.monotonic(), 0.1, 0
    try:
        with torch.no_grad():
            for f, a, k, n_in in make(backbone, split, aug, n_copies, device, seed, batch_size, fix_beta):
                done += n_in * n_copies
                if show and done >= next_report * total:
                    print(
                        f"[transformed features] {n_copies} copies: {done // n_copies}/{n} samples "
                        f"({100 * done / total:.0f}%, {time.monotonic() - t0:.0f}s)",
                        flush=True,
                    )
                    while next_report * total <= done:
                        next_report += 0.1
                yield f, a, k
    finally:
        backbone.train(was_training)


def _forward(backbone, x, device) -> torch.Tensor:
    return backbone(x.to(device)).float().cpu()


def _spirograph_batches(backbone, split, aug, n_copies, device, seed, batch_size, fix_beta):
    names = list(split.names)
    missing = [t for t in TARGETS if t not in names]
    if missing:
        raise ValueError(
            f"re-rendering Spirograph needs the factors {list(TARGETS)} in the split; missing "
            f"{missing} (load it with targets=split_targets(...))"
        )
    y = torch.as_tensor(np.asarray(split.y), dtype=torch.float32)
    x = {t: y[:, names.index(t)] for t in TARGETS}
    size = int(aug["size"])
    gen = torch.Generator().manual_seed(int(seed))
    # every nuisance parameter is alpha (no beta); drawn up front, copy by copy, so the draws do not depend on
    # batch_size. Renders stay in [0, 1], unnormalised, as the training views.
    draws = [sample_nuisance(len(y), gen) for _ in range(n_copies)]
    for start in range(0, len(y), batch_size):
        xb = {t: v[start : start + batch_size] for t, v in x.items()}
        b = next(iter(xb.values())).shape[0]
        feats, alphas = [], []
        for d in draws:
            a = {k: d[k][start : start + b] for k in NUISANCE}
            feats.append(_forward(backbone, render_flat({**xb, **a}, size), device))
            alphas.append(torch.stack([a[k] for k in NUISANCE], 1))
        yield torch.stack(feats, 1), torch.stack(alphas, 1), np.arange(start, start + b), b


def _image_batches(backbone, split, aug, n_copies, device, seed, batch_size, fix_beta):
    maker = build_view_maker({**aug, "fuse": False}, batch_size, num_threads=1, seed=int(seed))  # no compile
    recipe = maker.recipe
    first = recipe.views[0]
    # the colour stage of the first view only, when the recipe leaves it to the model (InvCLR)
    stage = ModelColourStage(Recipe(views=(first,), mean=recipe.mean, std=recipe.std))
    rng = np.random.default_rng(int(seed))
    for start in range(0, len(split.encoded), batch_size):
        encoded = list(split.encoded[start : start + batch_size])
        b = len(encoded)
        feats = alphas = None
        ok = np.ones(b, dtype=bool)
        base = sample_views(encoded, recipe, rng) if fix_beta else None
        for c in range(n_copies):
            if fix_beta:
                params = base if c == 0 else _redraw_alpha(base, first, rng)
                images, kept = maker.executor(encoded, params)
                image, p0 = images[0], params_to_tensors(select(params[0], kept), images[0].device)
            else:
                views = maker({"jpg": np.array(encoded, dtype=object)}, rng)
                image, p0, kept = views.images[0], views.params[0], views.kept
            if stage:
                image = stage([image], [p0])[0][0]
            f = _forward(backbone, image, device)
            a = torch.stack([p0[k].float().cpu() for k in IMAGE_ALPHA], 1)
            if feats is None:
                feats = torch.full((b, n_copies, f.shape[1]), float("nan"))
                alphas = torch.full((b, n_copies, a.shape[1]), float("nan"))
            kept = np.asarray(kept, dtype=np.int64)
            feats[kept, c], alphas[kept, c] = f, a
            mask = np.zeros(b, dtype=bool)
            mask[kept] = True
            ok &= mask
        idx = np.flatnonzero(ok)
        yield feats[idx], alphas[idx], idx + start, b


def _redraw_alpha(params: Sequence[dict], spec, rng: np.random.Generator) -> list[dict]:
    """The first view's colour factors redrawn from the view's law (torchvision ColorJitter ranges, gated by
    the view's own jitter_on, which stays fixed); every other parameter is kept."""
    out = [dict(p) for p in params]
    p = out[0]
    on = p["jitter_on"] > 0
    n = len(on)
    for name, s in zip(IMAGE_ALPHA, spec.jitter):
        lo, hi = (-s, s) if name == "hue" else (max(0.0, 1.0 - s), 1.0 + s)
        p[name] = np.where(on, rng.uniform(lo, hi, n), _IDENTITY[name]).astype(np.float32)
    return out


# ----------------------------------------------------------------------------------------------- metrics


@float32
def conditional_variance(F_values: torch.Tensor) -> torch.Tensor:
    """InvCLR's nested Monte Carlo estimate of V (Foster et al. 2021, Eq. 7; docs/methods/invclr.md §1.1).

        V ≈ (1/K) Σ_i [ (1/(L-1)) Σ_j F_ij² - (1/(L(L-1))) (Σ_j F_ij)² ],
    i.e. the unbiased (Bessel-corrected) within-sample variance, averaged over samples. Needs L >= 2.

    Args:
        F_values: [K, L], F(α_ij, β_i, x_i, e_i) for L draws of α per sample (build it with
            `pipeline.losses.invclr.scalar_projection`).

    Example: `v = conditional_variance(scalar_projection(z, e))` for z [K, L, D], e [K, D]
    """
    if F_values.dim() != 2 or F_values.shape[1] < 2:
        raise ValueError(f"F_values must be [K, L] with L >= 2, got {tuple(F_values.shape)}")
    return F_values.var(dim=1, correction=1).mean()


def conditional_variance_of(feats: torch.Tensor, generator: torch.Generator | None = None) -> float:
    """V by Eq. 7 (docs/methods/invclr.md §1.1, §4.2): feats [K, L, D], L >= 2 transformed copies per sample.
    One Rademacher e_i in R^D per sample (drawn from `generator` as a [K, D] tensor), shared by its L copies;
    F_ij = e_i . z_ij/||z_ij||; V = mean_i of the Bessel-corrected variance of F_i1..F_iL. In float64."""
    if feats.dim() != 3 or feats.shape[1] < 2:
        raise ValueError(f"feats must be [K, L, D] with L >= 2, got {tuple(feats.shape)}")
    z = feats.double()
    e = rademacher((z.shape[0], z.shape[2]), generator=generator, dtype=torch.float64)
    return float(conditional_variance(scalar_projection(z, e)))


def alpha_reference(aug: Mapping[str, Any]) -> tuple[float | None, str]:
    """Mean_i Var(alpha_i) of the law of alpha (the best constant predictor's MSE) and where it comes from:
    ("law") computed from the distributions, or (None, "empirical") when it cannot be derived here.

    Spirograph: alpha_i ~ U(lo, hi) from RANGES, Var = (hi - lo)^2/12: (4/12 + 5 * 0.36/12)/6 = 0.0806 (2.2).
    Image recipes, the first view: with probability p = p_jitter a factor is U(lo, hi) (brightness, contrast,
    saturation: lo = max(0, 1 - s), hi = 1 + s; hue: -s, s), else the identity c (1, or 0 for hue), so
        Var = p (hi - lo)^2/12 + p (1 - p) ((lo + hi)/2 - c)^2.
    For p = 1 and s = (0.4, 0.4, 0.4, 0.1) this is the paper's CIFAR 0.0408 (4.2); InvCLR's recipe has p = 0.8,
    which gives 0.0327 for the gated alpha recorded here (module docstring). A JointColor recipe couples the
    first view's factor to the second's, so its law is not the per-view one: (None, "empirical")."""
    if is_spirograph(aug):
        return float(np.mean([(RANGES[k][1] - RANGES[k][0]) ** 2 / 12 for k in NUISANCE])), "law"
    recipe = image_recipe(aug)
    if recipe.joint.color_beta is not None:
        return None, "empirical"
    spec = recipe.views[0]
    p = spec.p_jitter
    out = []
    for name, s in zip(IMAGE_ALPHA, spec.jitter):
        lo, hi = (-s, s) if name == "hue" else (max(0.0, 1.0 - s), 1.0 + s)
        out.append(p * (hi - lo) ** 2 / 12 + p * (1 - p) * ((lo + hi) / 2 - _IDENTITY[name]) ** 2)
    return float(np.mean(out)), "law"


def alpha_regression(
    train_feats: torch.Tensor,
    train_alpha: torch.Tensor,
    test_feats: torch.Tensor,
    test_alpha: torch.Tensor,
    reference: float | None = None,
    names: Sequence[str] | None = None,
    steps: int = 200,
    weight_decay: float = 1e-5,
) -> dict[str, float]:
    """Linear regression of raw (un-standardised) alpha from z (4.2 b): fitted on train, scored on test.

    feats [..., D] and alpha [..., d_alpha] (leading dims, e.g. [N, copies], are flattened into rows). The
    regressor is the linear probe (`linear_probe.probe`: standardised features, bias, full-batch L-BFGS on the
    MSE, weight decay on the weights), the paper's Table 6 protocol, which 4.2 presumes. Returns
    mse (averaged over the alpha dimensions), r2, mse_<name> and r2_<name> per dimension, reference (the given
    law value, else the empirical one) and reference_empirical (Mean_i of the test alpha's variance about its
    own mean: the best constant predictor on the test rows)."""

    def rows(t: torch.Tensor) -> torch.Tensor:
        return t.reshape(-1, t.shape[-1]).double()

    xtr, atr, xte, ate = rows(train_feats), rows(train_alpha), rows(test_feats), rows(test_alpha)
    names = list(names or [f"alpha{i}" for i in range(atr.shape[1])])
    res = probe(xtr, atr, xte, ate, "regression", names, steps, weight_decay)
    empirical = float(ate.var(dim=0, correction=0).mean())
    res["reference_empirical"] = empirical
    res["reference"] = float(reference) if reference is not None else empirical
    return res
