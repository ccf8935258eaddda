"""augment.fuse=true (pipeline/augment/fused.py): the batched executor's photometric stage on a static plan,
compiled by torch.compile for the batch size that repeats, eager for any other.

The static plan runs every step the recipe can ask for and keeps, through `where`, what a sample's draws leave
untouched: eager, it makes the batched executor's views (the colour passes bit for bit; the blur on a wider window
of zero taps, to float rounding). Compiled, inductor fuses and reorders the float arithmetic: within 1e-5."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from helpers import encode, natural
from pipeline.augment.batch_plan import plan_group, view_groups
from pipeline.augment.batched import BatchedExecutor, photometric_group
from pipeline.augment.decode import decode_batch
from pipeline.augment.executors import make_executor
from pipeline.augment.host_pack import HostPack
from pipeline.augment.params import sample_views
from pipeline.augment.view_makers import image_recipe
from pipeline.config import compose_config

RESIZE_TAPS = ("yi", "yt", "xi", "xt")
pytestmark = pytest.mark.filterwarnings("ignore:The image decoding and encoding capabilities:DeprecationWarning")


def recipe_of(name: str, size: int = 64):
    return image_recipe(compose_config([f"augment={name}", "data=imagenet", f"data.image_size={size}"])["augment"])


def images(n: int, seed: int, biggest: int = 120) -> list[bytes]:
    rng = np.random.default_rng(seed)
    sizes = rng.integers(40, biggest, size=(n, 2))
    return [encode(natural(int(h), int(w), seed * 100 + i), "JPEG") for i, (h, w) in enumerate(sizes)]


@pytest.mark.parametrize("name", ["mocov2", "simclr", "byol", "clsa", "dino", "invclr"])
def test_a_static_plan_makes_the_same_views(name):
    """Eager on the static plan (fuse=True with the stage left uncompiled) against the per-batch plan: the same
    views, colour passes, hue, grayscale and solarize bit for bit (only the blurred rows may differ, by rounding)."""
    recipe = recipe_of(name)
    photos = images(8, 1)
    params = sample_views(photos, recipe, np.random.default_rng(5))
    plain = BatchedExecutor(recipe, "cpu")
    static = BatchedExecutor(recipe, "cpu", fuse=True, batch_size=len(photos))
    static.photometric = photometric_group  # the static plan, run eager
    (want, _), (got, _) = plain(photos, params), static(photos, params)
    for v, (w, g) in enumerate(zip(want, got)):
        blurred = torch.as_tensor((params[v]["blur_on"] > 0) & (params[v]["sigma"] > 0))
        assert torch.equal(w[~blurred], g[~blurred]), (name, v)
        assert (w[blurred] - g[blurred]).abs().max().item() < 1e-5 if blurred.any() else True


@pytest.mark.parametrize("name", ["mocov2", "simclr", "byol", "mocov1", "dino", "invclr", "clsa", "cocor"])
def test_a_static_plan_is_the_same_work_for_every_draw(name):
    """Over many draws, a group without strong-pool views plans the same steps and the same rows (names, passes,
    blur window, the shapes of what it sends): only the resize taps, which follow the crops, change. A group with
    strong-pool views stays on the per-batch plan."""
    recipe = recipe_of(name)
    photos = images(8, 1)
    seen: dict[int, set] = {}
    for seed in range(12):
        params = sample_views(photos, recipe, np.random.default_rng(seed))
        for i, g in enumerate(view_groups(recipe)):
            pack = HostPack()
            plan = plan_group(g, recipe.views, params, pack, "g", True, True, static=True)
            assert plan["static"] == (not any(recipe.views[v].strong_ops for v in g.views)), (name, i)
            if plan["static"]:
                sent = tuple((k, a.shape) for k, a in pack._arrays.items() if k.split(".")[1] not in RESIZE_TAPS)
                seen.setdefault(i, set()).add((repr(plan), sent))
    assert seen or name in ("clsa", "cocor")
    assert all(len(work) == 1 for work in seen.values()), {i: len(w) for i, w in seen.items()}


def test_the_fused_stage_compiles_once_for_full_batches_and_runs_other_sizes_eager(monkeypatch):
    """A partial batch first (it must not become the compiled size), then three full batches of images of
    different sizes (the resize before the stage changes shape, the stage does not): one compile, without CUDA
    graphs, used for the full batches only; every view within 1e-5 of the eager executor's."""
    from torch._dynamo.utils import counters

    recipe = recipe_of("simclr", 32)  # random jitter order, blur and grayscale: every step of the stage
    torch._dynamo.reset()
    counters.clear()
    real, options, calls = torch.compile, [], []

    def watched_compile(fn, **kw):  # FusedStage's own compile, watched: its options and the batches it gets
        options.append(kw)
        compiled = real(fn, **kw)

        def spy(x, *rest):
            calls.append(x.shape[0])
            return compiled(x, *rest)

        return spy

    monkeypatch.setattr(torch, "compile", watched_compile)
    fused = make_executor("auto", recipe, 8, torch_device="cpu", fuse=True)
    assert isinstance(fused, BatchedExecutor) and fused.fuse
    plain = BatchedExecutor(recipe, "cpu")
    rng = np.random.default_rng(0)
    for seed, n in ((4, 5), (1, 8), (2, 8), (3, 8)):
        photos = images(n, seed, biggest=60 + 30 * seed)
        params = sample_views(photos, recipe, rng)
        (want, _), (got, _) = plain(photos, params), fused(photos, params)
        for w, g in zip(want, got):
            assert w.shape == g.shape and (w - g).abs().max().item() < 1e-5
    assert options == [{"dynamic": False}]  # one compile; default mode: no CUDA graphs to overwrite views in use
    assert calls == [16, 16, 16]  # two views of each full batch; the partial one ran eager
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    torch._dynamo.reset()


def test_fuse_is_refused_with_an_executor_that_has_no_stage_to_compile_and_left_to_auto(caplog):
    """Named with the torch executor: refused. With executor=auto where auto picks the torch executor (a CPU, views
    past 96 px): auto's choice stands, and a warning says fuse has no effect."""
    with pytest.raises(ValueError, match="augment.fuse=true compiles the batched executor's photometric stage"):
        make_executor("torch", recipe_of("mocov2"), 4, fuse=True)
    with caplog.at_level("WARNING"):
        ex = make_executor("auto", recipe_of("mocov2", 224), 4, torch_device="cpu", fuse=True)
    assert type(ex).__name__ == "TorchExecutor" and "augment.fuse=true has no effect" in caplog.text


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_fused_stage_on_cuda_matches_eager_and_does_not_synchronise():
    """On CUDA, after the compiling batch: a full batch's views under sync debug mode "error" (no blocking copy or
    device-to-host read), within 1e-4 of the eager executor's on the same decoded images."""
    recipe, device = recipe_of("mocov2", 64), torch.device("cuda")
    photos = images(32, 7)
    params = sample_views(photos, recipe, np.random.default_rng(0))
    decoded, kept = decode_batch(photos, range(len(photos)), device)
    assert len(kept) == len(photos)
    fused, plain = BatchedExecutor(recipe, device, fuse=True, batch_size=len(photos)), BatchedExecutor(recipe, device)
    want = plain.views_of(decoded, params)
    fused.views_of(decoded, params)  # compiles
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = fused.views_of(decoded, params)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    for w, g in zip(want, got):
        assert g.device.type == "cuda" and (w - g).abs().max().item() < 1e-4
