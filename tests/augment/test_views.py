"""View stage: samplers follow their laws, executors apply exactly the recorded parameters,
DALI and torch agree, corrupt / short batches are handled.

Measured DALI-vs-torch agreement (PNG and JPEG, 0-255 levels, CPU backend):
  interior pixels (2 px border excluded; 8 px when blur is on): max |diff| < 0.01 for every op,
  including the exact-HSV hue; the whole image: mean < 0.05, max up to ~18 on the 1-2 px border
  when downscaling strongly (antialias filters treat the image edge differently).
"""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image
from scipy import stats

from helpers import encode, natural, same_views
from pipeline.augment.executors import Views, make_executor, make_views
from pipeline.augment.params import (
    blur_window,
    eval_geometry,
    image_size,
    sample_crop,
    sample_view_params,
    sample_views,
)
from pipeline.augment.recipe import ViewSpec, recipe_from_dict

dali = pytest.importorskip("nvidia.dali")
# torchvision 0.29 deprecates torchvision.io decoding (torch_exec filters it; pytest resets filters).
pytestmark = pytest.mark.filterwarnings("ignore:The image decoding and encoding capabilities:DeprecationWarning")

KINDS = ["dali", "torch"]
H, W = 150, 200  # coordinate image: R = row, G = col (both < 256, so k = 1 and PNG keeps them exact)


# ----------------------------------------------------------------------------- helpers
def coord_image() -> np.ndarray:
    yy, xx = np.mgrid[0:H, 0:W]
    return np.stack([yy, xx, np.full_like(yy, 77)], axis=-1).astype(np.uint8)


def denorm(x: torch.Tensor, recipe: same_views) -> np.ndarray:
    """Normalised float [B,3,S,S] -> float [B,S,S,3] in 0..255."""
    mean = torch.tensor(recipe.mean).view(1, 3, 1, 1)
    std = torch.tensor(recipe.std).view(1, 3, 1, 1)
    return ((x.cpu() * std + mean) * 255).permute(0, 2, 3, 1).numpy()


def identity_params(crops: np.ndarray, **over) -> dict[str, np.ndarray]:
    """Params of one view with every op off except the given crop boxes; `over` sets fields."""
    n = len(crops)
    p = {
        "crop": np.asarray(crops, np.int32).reshape(n, 4),
        "flip": np.zeros(n, np.uint8),
        "jitter_on": np.zeros(n, np.uint8),
        "brightness": np.ones(n, np.float32),
        "contrast": np.ones(n, np.float32),
        "saturation": np.ones(n, np.float32),
        "hue": np.zeros(n, np.float32),
        "gray": np.zeros(n, np.uint8),
        "blur_on": np.zeros(n, np.uint8),
        "sigma": np.zeros(n, np.float32),
    }
    for k, v in over.items():
        p[k] = np.full(n, v, dtype=p[k].dtype)
    return p


GEOMETRY_ONLY = dict(p_jitter=0.0, p_gray=0.0, p_blur=0.0)
_EXECUTORS: dict = {}


def executor(kind: str, size: int, n_views: int = 1, batch_size: int = 8):
    """Executors only read size / n_views / mean / std from the recipe, so one per shape is reused."""
    key = (kind, size, n_views, batch_size)
    if key not in _EXECUTORS:
        _EXECUTORS[key] = make_executor(kind, same_views(size=size, n_views=n_views), batch_size, device="cpu")
    return _EXECUTORS[key]


@pytest.fixture(scope="module")
def photos() -> list[bytes]:
    return [encode(natural(375, 500, s), "JPEG") for s in range(3)] + [
        encode(natural(150, 200, s), "PNG") for s in range(3, 6)
    ]


# ----------------------------------------------------------------------------- recipe
def test_recipe_from_dict():
    r = recipe_from_dict({"size": 96, "scale": [0.08, 1.0], "p_blur": 0.0})
    v = r.views[0]
    assert r.n_views == 2 and r.views[1] == v
    assert r.size == 96 and v.scale == (0.08, 1.0) and v.p_blur == 0.0 and v.jitter == (0.4, 0.4, 0.4, 0.1)
    assert recipe_from_dict({}) == same_views()
    with pytest.raises(ValueError, match="unknown"):
        recipe_from_dict({"szie": 96})
    with pytest.raises(ValueError):
        recipe_from_dict({"p_flip": 1.5})


# ----------------------------------------------------------------------------- samplers
def test_image_size_reads_header():
    assert image_size(encode(coord_image())) == (H, W)
    assert image_size(encode(natural(375, 500, 0), "JPEG")) == (375, 500)


def test_crop_law():
    rng = np.random.default_rng(0)
    scale, ratio, h, w = (0.2, 1.0), (3 / 4, 4 / 3), 375, 500
    boxes = np.array([sample_crop(h, w, scale, ratio, rng) for _ in range(4000)])
    y, x, ch, cw = boxes.T
    assert (y >= 0).all() and (x >= 0).all() and (y + ch <= h).all() and (x + cw <= w).all()
    area = ch * cw / (h * w)
    aspect = cw / ch
    # Rounding the box to integers moves area and aspect slightly past the bounds.
    assert area.min() >= scale[0] * 0.98 and area.max() <= scale[1]
    assert aspect.min() >= ratio[0] * 0.98 and aspect.max() <= ratio[1] * 1.02
    assert area.min() < 0.22 and area.max() > 0.95  # the whole range is used
    # Positions are uniform: the mean offset centres the box.
    assert abs(np.mean((y + ch / 2) / h) - 0.5) < 0.02 and abs(np.mean((x + cw / 2) / w) - 0.5) < 0.02


def test_crop_fallback_is_central_and_clamped_to_ratio():
    rng = np.random.default_rng(0)
    # A 10 x 1000 strip: no box with aspect <= 4/3 and area >= 90% exists, so the fallback runs.
    assert sample_crop(10, 1000, (0.9, 1.0), (3 / 4, 4 / 3), rng) == (0, (1000 - 13) // 2, 10, 13)
    assert sample_crop(1000, 10, (0.9, 1.0), (3 / 4, 4 / 3), rng) == ((1000 - 13) // 2, 0, 13, 10)


def test_view_param_laws():
    recipe = ViewSpec()
    n = 20000
    p = sample_view_params([(375, 500)] * n, recipe, np.random.default_rng(1))
    assert p["crop"].dtype == np.int32 and p["crop"].shape == (n, 4)
    for key in ("flip", "jitter_on", "gray", "blur_on"):
        assert p[key].dtype == np.uint8 and p[key].shape == (n,)
    tol = 4 * np.sqrt(0.25 / n)  # 4 binomial standard deviations
    assert abs(p["flip"].mean() - recipe.p_flip) < tol
    assert abs(p["jitter_on"].mean() - recipe.p_jitter) < tol
    assert abs(p["gray"].mean() - recipe.p_gray) < tol
    assert abs(p["blur_on"].mean() - recipe.p_blur) < tol

    on, off = p["jitter_on"] == 1, p["jitter_on"] == 0
    b, c, s, h = recipe.jitter
    for key, strength in (("brightness", b), ("contrast", c), ("saturation", s)):
        lo, hi = max(0.0, 1 - strength), 1 + strength
        assert stats.kstest(p[key][on], "uniform", args=(lo, hi - lo)).pvalue > 1e-3, key
        assert (p[key][off] == 1).all()
    assert stats.kstest(p["hue"][on], "uniform", args=(-h, 2 * h)).pvalue > 1e-3
    assert (p["hue"][off] == 0).all()

    blur = p["blur_on"] == 1
    lo, hi = recipe.blur_sigma
    assert stats.kstest(p["sigma"][blur], "uniform", args=(lo, hi - lo)).pvalue > 1e-3
    assert (p["sigma"][~blur] == 0).all()


def test_sample_views_independent_per_view():
    encoded = [encode(coord_image())] * 64
    views = sample_views(encoded, same_views(n_views=3), np.random.default_rng(0))
    assert len(views) == 3
    assert not np.array_equal(views[0]["crop"], views[1]["crop"])
    assert all((v["crop"][:, 0] + v["crop"][:, 2] <= H).all() for v in views)


def test_blur_window_and_eval_geometry():
    assert blur_window(0.1) == 3 and blur_window(1.0) == 7 and blur_window(2.0) == 13
    assert eval_geometry(375, 500, 224) == (256, 341, 16, 58)
    assert eval_geometry(500, 375, 224) == (341, 256, 58, 16)


# ----------------------------------------------------------------------------- executors apply the recorded crop
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("flip", [0, 1])
def test_unscaled_crop_is_the_source_window(kind, flip):
    """Output size = crop size: the view must equal the recorded sub-window, pixel for pixel."""
    size = 48
    recipe = same_views(
        size=size, ratio=(1.0, 1.0), scale=(size * size / (H * W),) * 2, p_flip=float(flip), n_views=1, **GEOMETRY_ONLY
    )
    src = coord_image()
    encoded = [encode(src)] * 6
    (params,) = sample_views(encoded, recipe, np.random.default_rng(5))
    assert (params["crop"][:, 2:] == size).all() and len(set(map(tuple, params["crop"]))) > 1
    (out,), kept = executor(kind, size)(encoded, [params])
    assert kept.tolist() == list(range(6))
    got = np.round(denorm(out, recipe)).astype(np.int64)
    for i, (y, x, h, w) in enumerate(params["crop"]):
        window = src[y : y + h, x : x + w].astype(np.int64)
        np.testing.assert_array_equal(got[i], window[:, ::-1] if flip else window)


@pytest.mark.parametrize("kind", KINDS)
def test_scaled_crop_follows_box_coordinates(kind):
    """Resampling a linear ramp returns the ramp at the output pixel centres:
    R(i) = y + (i + 0.5) * h / S - 0.5, G(j) = x + (j + 0.5) * w / S - 0.5 (interior pixels).
    Measured error: torch < 1e-3, DALI < 0.032 levels (its filter weights are coarser); a box off
    by one pixel would be off by >= 1 level."""
    size = 32
    recipe = same_views(size=size, n_views=1, **GEOMETRY_ONLY, p_flip=0.0)
    encoded = [encode(coord_image())] * 8
    (params,) = sample_views(encoded, recipe, np.random.default_rng(7))
    (out,), _ = executor(kind, size)(encoded, [params])
    got = denorm(out, recipe)
    centres = (np.arange(size) + 0.5) / size
    for i, (y, x, h, w) in enumerate(params["crop"]):
        rows = y + centres * h - 0.5
        cols = x + centres * w - 0.5
        inner = slice(2, -2)  # edge pixels see a truncated filter
        square = (size - 4,) * 2
        np.testing.assert_allclose(got[i, inner, inner, 0], np.broadcast_to(rows[inner, None], square), atol=0.05)
        np.testing.assert_allclose(got[i, inner, inner, 1], np.broadcast_to(cols[None, inner], square), atol=0.05)
        np.testing.assert_allclose(got[i, ..., 2], 77, atol=0.01)


# ----------------------------------------------------------------------------- DALI vs torch
def _levels_diff(a: torch.Tensor, b: torch.Tensor, recipe: same_views) -> np.ndarray:
    return np.abs(denorm(a, recipe) - denorm(b, recipe))


@pytest.mark.parametrize("mode", ["geometry", "moco_v2"])
def test_dali_matches_torch(photos, mode):
    size = 64
    extra = GEOMETRY_ONLY if mode == "geometry" else {}
    recipe = same_views(size=size, n_views=2, **extra)
    params = sample_views(photos, recipe, np.random.default_rng(11))
    d_views, d_kept = executor("dali", size, 2)(photos, params)
    t_views, t_kept = executor("torch", size, 2)(photos, params)
    assert d_kept.tolist() == t_kept.tolist() == list(range(len(photos)))
    border = 2 if mode == "geometry" else 8  # blur spreads the border difference inwards
    for d, t in zip(d_views, t_views):
        diff = _levels_diff(d, t, recipe)
        assert diff[:, border:-border, border:-border].max() < 0.05
        assert diff.mean() < 0.1 and diff.max() < 25


@pytest.mark.parametrize("hue", [-0.5, -0.1, 0.07, 0.3])
def test_dali_hue_is_torchvision_hue(photos, hue):
    size = 32
    recipe = same_views(size=size, n_views=1)
    crops = [[0, 0, 150, 200]] * 3
    encoded = photos[3:]
    params = [identity_params(np.array(crops), jitter_on=1, hue=hue, saturation=1.2, contrast=0.8)]
    (d,), _ = executor("dali", size)(encoded, params)
    (t,), _ = executor("torch", size)(encoded, params)
    assert _levels_diff(d, t, recipe)[:, 2:-2, 2:-2].max() < 0.05


# ----------------------------------------------------------------------------- photometric ops do what they say
def _run_one(kind: str, encoded: list[bytes], size: int, **over) -> np.ndarray:
    crops = np.array([[0, 0, *image_size(e)] for e in encoded])
    (out,), _ = executor(kind, size)(encoded, [identity_params(crops, **over)])
    return denorm(out, same_views(size=size))


@pytest.fixture(scope="module")
def dim_photos() -> list[bytes]:
    """Values in [20, 150], so brightness 1.3 never clips."""
    return [encode((20 + natural(96, 128, s) / 255 * 130).astype(np.uint8)) for s in range(3)]


@pytest.mark.parametrize("kind", KINDS)
def test_photometric_ops(kind, dim_photos):
    size = 64
    base = _run_one(kind, dim_photos, size)
    # Every op off (or sigma 0, or identity factors) is an exact identity.
    np.testing.assert_allclose(_run_one(kind, dim_photos, size, jitter_on=1), base, atol=1e-3)
    np.testing.assert_allclose(_run_one(kind, dim_photos, size, blur_on=1, sigma=0.0), base, atol=1e-3)
    np.testing.assert_allclose(_run_one(kind, dim_photos, size, sigma=1.5), base, atol=1e-3)  # blur_on = 0

    bright = _run_one(kind, dim_photos, size, jitter_on=1, brightness=1.3)
    np.testing.assert_allclose(bright.mean(axis=(1, 2, 3)) / base.mean(axis=(1, 2, 3)), 1.3, rtol=2e-3)

    flat = _run_one(kind, dim_photos, size, jitter_on=1, contrast=0.0)
    assert flat.std(axis=(1, 2, 3)).max() < 0.01  # contrast 0: uniform grey at the luma mean
    low = _run_one(kind, dim_photos, size, jitter_on=1, contrast=0.5)
    np.testing.assert_allclose(low.std(axis=(1, 2, 3)), 0.5 * base.std(axis=(1, 2, 3)), rtol=0.1)

    gray = _run_one(kind, dim_photos, size, gray=1)
    assert np.abs(gray[..., 0] - gray[..., 1]).max() < 1e-3 and np.abs(gray[..., 1] - gray[..., 2]).max() < 1e-3
    desat = _run_one(kind, dim_photos, size, jitter_on=1, saturation=0.0)
    np.testing.assert_allclose(desat, gray, atol=1e-3)  # saturation 0 == grayscale

    def hf_energy(img):  # mean squared horizontal + vertical differences
        return (np.diff(img, axis=1) ** 2).mean() + (np.diff(img, axis=2) ** 2).mean()

    blurred = _run_one(kind, dim_photos, size, blur_on=1, sigma=1.5)
    assert hf_energy(blurred) < 0.5 * hf_energy(base)
    np.testing.assert_allclose(blurred.mean(), base.mean(), rtol=0.01)  # blur keeps the mean


@pytest.mark.parametrize("kind", KINDS)
def test_hue_rotates_primaries(kind):
    """A third of a turn maps red -> green -> blue -> red."""
    img = np.zeros((32, 96, 3), np.uint8)
    img[:, :32, 0] = img[:, 32:64, 1] = img[:, 64:, 2] = 200
    out = _run_one(kind, [encode(img)], 96, jitter_on=1, hue=1 / 3)
    # Output is 96 x 96 from a 32 x 96 source: check the middle column of each third.
    for third, expected in ((16, 1), (48, 2), (80, 0)):
        np.testing.assert_allclose(out[0, 48, third], np.eye(3)[expected] * 200, atol=0.05)


def _other_formats() -> dict[str, bytes]:
    im = Image.fromarray(natural(120, 160, 0))
    as16 = Image.fromarray(np.asarray(im.convert("L")).astype(np.uint16) * 257)

    def enc(img, fmt):
        buf = io.BytesIO()
        img.save(buf, format=fmt)
        return buf.getvalue()

    return {
        "gray_jpeg": enc(im.convert("L"), "JPEG"),
        "cmyk_jpeg": enc(im.convert("CMYK"), "JPEG"),
        "palette_png": enc(im.convert("P"), "PNG"),
        "rgba_png": enc(im.convert("RGBA"), "PNG"),
        "png16": enc(as16, "PNG"),
        "webp": enc(im, "WEBP"),
        "bmp": enc(im, "BMP"),
    }


def test_other_formats_agree():
    """Formats found in real datasets (ImageNet has grayscale and CMYK JPEGs) decode to the same RGB."""
    encoded = list(_other_formats().values())
    recipe = same_views(size=32, n_views=1, **GEOMETRY_ONLY)
    params = sample_views(encoded, recipe, np.random.default_rng(0))
    (d,), d_kept = executor("dali", 32)(encoded, params)
    (t,), t_kept = executor("torch", 32)(encoded, params)
    assert d_kept.tolist() == t_kept.tolist() == list(range(len(encoded)))
    assert _levels_diff(d, t, recipe)[:, 2:-2, 2:-2].max() < 0.05


# ----------------------------------------------------------------------------- robustness
def _corrupt_batch() -> tuple[list[bytes], set[int]]:
    good = encode(natural(375, 500, 1), "JPEG")
    bad_header = b"\xff\xd8\xff" + bytes(2000)  # unreadable header
    bad_body = good[:700] + bytes(len(good) - 700)  # header fine, scan data garbage
    return [good, bad_header, encode(coord_image()), bad_body, good], {1, 3}


@pytest.mark.parametrize("kind", KINDS)
def test_corrupt_images_are_dropped_and_counted(kind):
    encoded, bad = _corrupt_batch()
    recipe = same_views(size=32)
    ex = executor(kind, 32, n_views=2)
    before = ex.skipped
    views = make_views(encoded, recipe, ex, np.random.default_rng(0))
    expected = [i for i in range(len(encoded)) if i not in bad]
    assert views.kept.tolist() == expected
    assert ex.skipped - before == len(bad)
    assert all(img.shape == (len(expected), 3, 32, 32) for img in views.images)
    assert all(len(v) == len(expected) for p in views.params for v in p.values())
    assert all(torch.isfinite(img).all() for img in views.images)


def test_dali_recovers_after_a_failed_batch():
    encoded, _ = _corrupt_batch()
    ex = executor("dali", 32, n_views=2)
    params = sample_views(encoded, same_views(size=32), np.random.default_rng(0))
    ex(encoded, params)
    good = [encoded[0], encoded[2]]
    views, kept = ex(good, sample_views(good, same_views(size=32), np.random.default_rng(1)))
    assert kept.tolist() == [0, 1] and views[0].shape[0] == 2


def test_all_corrupt_gives_empty_views():
    ex = executor("dali", 32, n_views=2)
    encoded = [b"not an image", b"\x89PNG\r\n\x1a\n" + bytes(100)]
    views, kept = ex(encoded, sample_views(encoded, same_views(size=32), np.random.default_rng(0)))
    assert len(kept) == 0 and all(v.shape == (0, 3, 32, 32) for v in views)


@pytest.mark.parametrize("n", [4, 3, 1, 9])
def test_dali_batch_sizes(n, photos):
    """Full batch, a smaller last batch, and more than batch_size (processed in chunks)."""
    ex = executor("dali", 32, n_views=2, batch_size=4)
    encoded = (photos * 2)[:n]
    recipe = same_views(size=32)
    params = sample_views(encoded, recipe, np.random.default_rng(n))
    views, kept = ex(encoded, params)
    assert kept.tolist() == list(range(n)) and all(v.shape == (n, 3, 32, 32) for v in views)
    ref, _ = executor("torch", 32, n_views=2)(encoded, params)
    assert max(_levels_diff(a, b, recipe)[:, 8:-8, 8:-8].max() for a, b in zip(views, ref)) < 0.05


@pytest.mark.parametrize("kind", KINDS)
def test_jpeg_views_and_make_views(kind):
    encoded = [encode(natural(375, 500, s), "JPEG") for s in range(2)]
    recipe = same_views(size=64)
    views = make_views(encoded, recipe, executor(kind, 64, n_views=2), np.random.default_rng(0))
    assert isinstance(views, Views) and len(views.images) == len(views.params) == 2
    for img, p in zip(views.images, views.params):
        assert img.shape == (2, 3, 64, 64) and img.dtype == torch.float32
        assert p["crop"].dtype == torch.int32 and p["crop"].shape == (2, 4)
        assert p["brightness"].dtype == torch.float32
        assert -3 < img.mean().item() < 3


# ----------------------------------------------------------------------------- eval transform + factory
def test_eval_transform_agrees(photos):
    dali_ex, torch_ex = executor("dali", 32), executor("torch", 32)
    encoded = photos + [b"corrupt"]
    d, d_kept = dali_ex.eval_transform(encoded, 48)
    t, t_kept = torch_ex.eval_transform(encoded, 48)
    assert d.shape == t.shape == (len(photos), 3, 48, 48)
    assert d_kept.tolist() == t_kept.tolist() == list(range(len(photos)))
    diff = _levels_diff(d, t, same_views())
    assert diff.mean() < 0.1 and diff[:, 2:-2, 2:-2].max() < 0.05


def test_make_executor():
    recipe = same_views(size=32)
    auto = make_executor("auto", recipe, 4, device="cpu")  # views on the CPU: the batched executor there
    assert type(auto).__name__ == "BatchedExecutor" and auto.device == torch.device("cpu")
    assert type(make_executor("dali", recipe, 4, device="cpu")).__name__ == "DaliExecutor"
    assert type(make_executor("torch", recipe, 4)).__name__ == "TorchExecutor"
    assert make_executor("dali", recipe, 4, device="auto").device == ("gpu" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ValueError):
        make_executor("pil", recipe, 4)


def test_class_labels_travel_with_every_view_and_skip_dropped_samples():
    """SupCon and CoCor's labelled loss read params[v]["label"]: aligned with the kept samples when one is corrupt."""
    from pipeline.augment.view_makers import build_view_maker, class_labels

    aug = {
        "kind": "views",
        "executor": "torch",
        "device": "cpu",
        "mean": [0.5] * 3,
        "std": [0.25] * 3,
        "view": {"size": 16},
        "views": [{"name": "view", "count": 2}],
    }
    encoded = [encode(natural(24, 24, s)) for s in range(4)]
    encoded[1] = b"not an image"
    batch = {"png": np.array(encoded, dtype=object), "cls": np.array([b"3", b"7", b"0", b"12"], dtype=object)}
    views = build_view_maker(aug, 4)(batch, np.random.default_rng(0))
    assert views.kept.tolist() == [0, 2, 3]
    assert all(p["label"].tolist() == [3, 0, 12] for p in views.params) and len(views.params) == 2
    assert class_labels([5, b"6", np.bytes_(b"7")]).tolist() == [5, 6, 7]


def test_dali_pipelines_leave_no_generated_modules_in_the_temp_folder():
    """DALI's conditionals write autograph's generated modules to the temp folder and delete them only at a clean
    interpreter exit, which Ray's workers never have: building the pipelines must leave none behind."""
    import glob
    import os
    import tempfile

    from pipeline.augment.dali_exec import DaliExecutor
    from pipeline.augment.view_makers import image_recipe
    from pipeline.config import compose_config

    pattern = os.path.join(tempfile.gettempdir(), "__autograph_generated_file*.py")
    before = set(glob.glob(pattern))
    for name in ("mocov2", "clsa"):  # colour jitter, blur and the strong pool: conditionals in every graph
        aug = compose_config([f"augment={name}", "data=cifar10"])["augment"]
        assert DaliExecutor(image_recipe(aug), 4, device="cpu").device == "cpu"  # built: the graphs were traced
    assert set(glob.glob(pattern)) - before == set()
    assert tempfile.tempdir is None or os.path.isdir(tempfile.tempdir)  # the temp folder is the process's own again
