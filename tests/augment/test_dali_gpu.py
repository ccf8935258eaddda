"""DALI's GPU pipeline (`mixed` nvJPEG decode + GPU ops) agrees with the torch reference executor on every image
recipe without strong-pool views (those run on DALI's CPU backend: its Equalize is a host python_function).
pytest -m gpu; skipped with the reason where DALI or CUDA is absent."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_recipes import IMAGE_RECIPES, recipe_of

from pipeline.augment.params import sample_views

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.filterwarnings("ignore:The image decoding and encoding capabilities:DeprecationWarning"),
]


def _dali_cuda() -> str | None:
    from pipeline.augment.executors import cuda_usable_by_dali, dali_available

    if not torch.cuda.is_available():
        return "needs CUDA (none on this machine)"
    if not dali_available():
        return "needs nvidia-dali"
    return None if cuda_usable_by_dali() else "DALI cannot see the CUDA device"


@pytest.fixture(scope="module")
def photos() -> list[bytes]:
    from helpers import encode, natural

    return [encode(natural(240, 320, s), "JPEG") for s in range(6)] + [encode(natural(200, 180, 9), "PNG")]


@pytest.mark.parametrize("name", IMAGE_RECIPES)
def test_dali_gpu_pipeline_matches_torch(name, photos):
    reason = _dali_cuda()
    if reason:
        pytest.skip(reason)
    from pipeline.augment.dali_exec import DaliExecutor
    from pipeline.augment.torch_exec import TorchExecutor

    recipe = recipe_of(name, "imagenet", "data.image_size=112")
    if any(v.strong_ops for v in recipe.views):
        pytest.skip("strong-pool recipes run on DALI's CPU backend by design")
    params = sample_views(photos, recipe, np.random.default_rng(3))
    dali = DaliExecutor(recipe, len(photos), device="gpu")
    assert dali.device == "gpu"
    (d, dk), (t, tk) = dali(photos, params), TorchExecutor(recipe)(photos, params)
    assert dk.tolist() == tk.tolist() == list(range(len(photos)))
    assert all(v.is_cuda for v in d)
    scale = 255.0 * (1.0 if recipe.views[0].color_stage == "model" else np.array(recipe.std).reshape(1, 3, 1, 1))
    for v, (a, b) in enumerate(zip(d, t)):
        diff = np.abs(a.cpu().numpy() - b.numpy()) * scale  # in 0..255 levels
        # nvJPEG's IDCT differs from libjpeg-turbo's by a level or two on JPEG photos; resampling differs at the
        # border: judge the interior's bulk and mean, looser than the CPU-vs-CPU test for the decoder alone
        m = max(2, a.shape[-1] // 8)
        inner = diff[..., m:-m, m:-m]
        assert np.quantile(inner, 0.99) < 4.0, (name, v, np.quantile(inner, 0.99))
        assert inner.mean() < 1.0, (name, v, inner.mean())
