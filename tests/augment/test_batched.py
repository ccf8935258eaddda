"""The batched view executor (augment.executor=batched): batched.BatchedExecutor, its resize taps, colour passes
and blur, and strong_batch.

On the CPU it uses the same decoders (libjpeg through torchvision, libpng / PIL) as the torch executor and PyTorch's
own antialias weights, so the two agree to float rounding (1e-4 in normalised units; measured ~5e-6): the resize is
a matmul and the blur separable, which sum in another order. On CUDA (gpu-marked) nvjpeg decodes the JPEGs: see
test_matches_torch_executor.
"""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest
import torch
import torchvision.transforms.v2.functional as TF
from torchvision.transforms import InterpolationMode

from helpers import encode, natural, same_views
from pipeline.augment import batched, executors
from pipeline.augment.batch_plan import _blur_taps
from pipeline.augment.batched import BatchedExecutor, separable_blur
from pipeline.augment.colour import colour_distort, hue_hsv
from pipeline.augment.colour_batch import HUE_CONSTS, blend_pass, hue_batch, jitter_passes
from pipeline.augment.decode import decode_batch
from pipeline.augment.executors import make_executor, make_views
from pipeline.augment.params import blur_window, sample_views
from pipeline.augment.png_check import png_rows_readable
from pipeline.augment.resize_taps import aa_taps, crop_axes
from pipeline.augment.strong import OPS, apply_strong_torch, sample_strong, torch_op
from pipeline.augment.strong_batch import apply_strong_batch, batch_op
from pipeline.augment.torch_exec import TorchExecutor, decode_rgb
from pipeline.augment.view_makers import build_view_maker, image_recipe
from pipeline.config import compose_config

pytestmark = pytest.mark.filterwarnings("ignore:The image decoding and encoding capabilities:DeprecationWarning")

CUDA = pytest.param(
    "cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
)
RECIPES = ["mocov2", "simclr", "byol", "clsa", "cocor", "dino", "invclr"]
LEVEL = 1.0 / (255 * 0.225)  # one 8-bit level in normalised units (ImageNet std ~0.225)


def recipe_of(name: str):
    # 64 px views (27 px strong / local crops): small enough to be fast, large enough for sigma-2 blur windows
    return image_recipe(compose_config([f"augment={name}", "data=imagenet", "data.image_size=64"])["augment"])


@pytest.fixture(scope="module")
def photos() -> list[bytes]:
    """Six images, JPEG and PNG, all of different sizes."""
    shapes = [
        (120, 160, "JPEG"),
        (100, 90, "PNG"),
        (200, 150, "JPEG"),
        (77, 131, "PNG"),
        (96, 96, "JPEG"),
        (150, 110, "JPEG"),
    ]
    return [encode(natural(h, w, s), fmt) for s, (h, w, fmt) in enumerate(shapes)]


# ----------------------------------------------------------------------------- executor parity
@pytest.fixture(params=["matmul", "per_sample"])
def resize(request, monkeypatch):
    """Both resizes of the CPU: the dense matmul (every size, here) and the per-sample one (past CPU_MATMUL_MAX)."""
    monkeypatch.setattr(batched, "CPU_MATMUL_MAX", 10**12 if request.param == "matmul" else 0)
    return request.param


@pytest.mark.parametrize("device", ["cpu", CUDA])
@pytest.mark.parametrize("name", RECIPES)
def test_matches_torch_executor(name, device, photos, resize):
    """Same params -> the torch executor's views. CPU: same decoders, PyTorch's resize weights, within 1e-4, except
    where a strong-pool threshold (Solarize, Posterize, Equalize's LUT) turns a 1e-6 difference into a level or
    more: on those views 99.5 % of the values within 1e-4. CUDA: nvjpeg's IDCT and chroma upsampling differ from
    libjpeg's by about a level at most pixels (PNGs decode identically), and the strong-op thresholds amplify that:
    bound the mean per view (1.2 levels; 3 levels for strong-pool views) and require finite values on the device."""
    recipe = recipe_of(name)
    params = sample_views(photos, recipe, np.random.default_rng(3))
    if name != "invclr":  # the draws exercise what the batched paths do differently
        assert any((p["blur_on"] & (p["sigma"] > 0)).sum() > 1 for p in params)
    if recipe.views[-1].strong_ops:
        assert any(p["strong_on"].any() for p in params if "strong_on" in p)
    ex = BatchedExecutor(recipe, device)
    before = ex.skipped
    got, kept = ex(photos, params)
    want, want_kept = TorchExecutor(recipe)(photos, params)
    assert kept.tolist() == want_kept.tolist() == list(range(len(photos))) and ex.skipped == before
    assert [g.shape for g in got] == [w.shape for w in want] == [(len(photos), 3, s, s) for s in recipe.sizes]
    for v, (g, w) in enumerate(zip(got, want)):
        assert g.device.type == device and g.dtype == torch.float32
        diff = (g.cpu() - w).abs()
        if device == "cpu" and recipe.views[v].strong_ops:
            assert (diff < 1e-4).float().mean() > 0.995 and diff.mean() < 0.2 * LEVEL, (name, v)
        elif device == "cpu":
            assert diff.max() < 1e-4, (name, v, diff.max().item())
        else:
            assert torch.isfinite(g).all()
            bound = (3.0 if recipe.views[v].strong_ops else 1.2) * LEVEL
            assert diff.mean() < bound, (name, v, diff.mean().item() / LEVEL)


def test_views_for_model_colour_stage_are_unnormalised(photos):
    """InvCLR's views leave jitter / grayscale to the method and come out in [0, 1]."""
    recipe = recipe_of("invclr")
    (a, b), _ = BatchedExecutor(recipe, "cpu")(photos, sample_views(photos, recipe, np.random.default_rng(0)))
    assert min(a.min(), b.min()) >= 0 and max(a.max(), b.max()) <= 1 + 1e-6


# ----------------------------------------------------------------------------- resize, colour, blur
@pytest.mark.parametrize("size", [64, 224])
def test_resize_taps_are_torchvision_resize(size):
    """Crop + antialiased bilinear resize as two matmuls with the taps = F.resize(antialias=True) of the crop,
    down- and upscaling, over random boxes of 500 x 375 and small images; flipped rows are the flipped resize."""
    rng = np.random.default_rng(size)
    for _ in range(25):
        h, w = (int(v) for v in rng.choice([(375, 500), (500, 375), (40, 30), (size, size)], axis=0))
        ch, cw = int(rng.integers(1, h + 1)), int(rng.integers(1, w + 1))
        y, x = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
        img = torch.rand(3, h, w)
        want = TF.resize(img[:, y : y + ch, x : x + cw], [size, size], InterpolationMode.BILINEAR, antialias=True)
        for flip in (0, 1):
            (yi, yt), (xi, xt) = crop_axes(np.array([[y, x, ch, cw]]), size, np.array([flip]))
            wy = torch.zeros(size, h).scatter_add_(1, torch.from_numpy(yi[0]), torch.from_numpy(yt[0]))
            wx = torch.zeros(size, w).scatter_add_(1, torch.from_numpy(xi[0]), torch.from_numpy(xt[0]))
            got = wy @ img @ wx.T
            assert (got - (want.flip(-1) if flip else want)).abs().max() < 1e-5, (h, w, y, x, ch, cw, flip)
    # the same size is the identity, exactly; one output row's taps sum to 1
    _, t = aa_taps(np.array([0]), np.array([size]), np.array([size]), np.array([0]), size)
    assert np.array_equal(t[0].sum(-1), np.ones(size, np.float32)) and set(np.unique(t)) <= {0.0, 1.0}


def test_hue_batch_is_colour_hue_bit_for_bit():
    """Channel ties (8-bit images have many) take torchvision's branch: red if it is a maximum, else green."""
    torch.manual_seed(0)
    x = (torch.rand(16, 3, 20, 20) * 255).round() / 255
    x[0, 1], x[1, 2], x[2] = x[0, 0], x[1, 0], x[2, :1]  # r = g, r = b, grey
    turns = torch.rand(16) - 0.5
    consts = {k: torch.from_numpy(v) for k, v in HUE_CONSTS.items()}
    assert torch.equal(hue_batch(x, (6.0 * turns).view(-1, 1, 1, 1), consts), hue_hsv(x, turns))


@pytest.mark.parametrize("order", ["fixed", "random"])
def test_colour_passes_equal_colour_distort(order):
    """The pre / hue / post passes give colour.colour_distort's jitter; a sample whose jitter is off comes through
    bit for bit (even a value the resize left a hair above 1, which a clamp would change)."""
    rng = np.random.default_rng(1)
    n = 40
    x = torch.rand(n, 3, 12, 12)
    x[3, 0, 0, 0] = 1.0000001
    on = rng.random(n) < 0.7
    on[3] = False
    f = np.where(on[:, None], rng.uniform(0.6, 1.4, (n, 3)), 1.0).astype(np.float32)
    hue = np.where(on, rng.uniform(-0.1, 0.1, n), 0.0).astype(np.float32)
    perm = np.stack([rng.permutation(4) for _ in range(n)]) if order == "random" else None
    pre, post = jitter_passes(on, f, perm)
    assert len(pre) + len(post) == 3 if order == "fixed" else len(pre) + len(post) <= 6
    luma = torch.tensor([0.2989, 0.587, 0.114]).view(1, 3, 1, 1)
    consts = {k: torch.from_numpy(v) for k, v in HUE_CONSTS.items()}

    def apply(y, ps):
        rows = {k: torch.from_numpy(np.asarray(getattr(ps, k))).view(-1, 1, 1, 1) for k in ("f", "omf", "ws")}
        rows.update({k: torch.from_numpy(getattr(ps, k)).view(-1, 1, 1, 1) for k in ("wc", "active")})
        return blend_pass(y, luma, rows, ps.uses_gray, ps.uses_mean)

    y = x
    for ps in pre:
        y = apply(y, ps)
    y = torch.where(
        torch.from_numpy(on).view(-1, 1, 1, 1), hue_batch(y, torch.from_numpy(6 * hue).view(-1, 1, 1, 1), consts), y
    )
    for ps in post:
        y = apply(y, ps)
    params = {
        "jitter_on": torch.from_numpy(on.astype(np.uint8)),
        "brightness": torch.from_numpy(f[:, 0]),
        "contrast": torch.from_numpy(f[:, 1]),
        "saturation": torch.from_numpy(f[:, 2]),
        "hue": torch.from_numpy(hue),
        "gray": torch.zeros(n, dtype=torch.uint8),
    }
    if perm is not None:
        params["jitter_order"] = torch.from_numpy(perm.astype(np.int8))
    want = colour_distort(x, params)
    assert (y - want).abs().max() < 1e-6
    assert torch.equal(y[~torch.from_numpy(on)], x[~torch.from_numpy(on)])
    assert (y[torch.from_numpy(on)] - x[torch.from_numpy(on)]).abs().max() > 0.05  # it did jitter


def test_separable_blur_equals_torchvision_per_sample():
    torch.manual_seed(0)
    x = torch.rand(7, 3, 30, 26)
    sigma = np.array([0.3, 0.0, 1.7, 2.0, 0.9, 1.2, 0.45], np.float32)  # windows 3, -, 13, 13, 7, 9, 5
    rows = np.array([0, 2, 3, 5, 6])  # sample 4 gated off, sample 1 sigma 0
    taps = _blur_taps(sigma[rows])
    got = separable_blur(
        x, torch.from_numpy(rows), torch.from_numpy(np.repeat(taps, 3, 0).reshape(-1, 1, 1, taps.shape[1]))
    )
    for i in range(len(x)):
        if i in rows:
            s = float(sigma[i])
            want = TF.gaussian_blur(x[i], kernel_size=[blur_window(s)] * 2, sigma=[s, s])
            assert (got[i] - want).abs().max() < 1e-5, i
            assert (got[i] - x[i]).abs().max() > 0.01, i  # it did blur
        else:
            assert torch.equal(got[i], x[i]), i


# ----------------------------------------------------------------------------- batched strong ops
def _images(n: int, h: int = 24, w: int = 32, seed: int = 0) -> torch.Tensor:
    """Photo-like batch plus a low-contrast and a flat-channel image (AutoContrast / Equalize corner cases)."""
    x = torch.from_numpy(np.stack([natural(h, w, seed + i) for i in range(n)])).permute(0, 3, 1, 2).float() / 255
    x[-2] = x[-2] * 0.2 + 0.4
    x[-1, 1] = 0.5
    return x


def _random_mags(name: str, n: int, rng: np.random.Generator) -> np.ndarray:
    if name in ("ShearX", "ShearY", "TranslateX", "TranslateY"):
        m = rng.uniform(-0.3, 0.3, n)
    elif name == "Rotate":
        m = rng.uniform(-30, 30, n)
    elif name == "Solarize":
        m = rng.uniform(0, 256, n)
    elif name == "Posterize":
        m = rng.integers(4, 9, n)
    elif name in ("Contrast", "Color", "Brightness", "Sharpness"):
        m = rng.uniform(0.05, 1.6, n)
    else:
        m = np.zeros(n)
    return m.astype(np.float32)


@pytest.mark.parametrize("name", OPS)
def test_batched_strong_op_equals_torch_op(name):
    rng = np.random.default_rng(OPS.index(name))
    x = _images(6, seed=OPS.index(name))
    mags = _random_mags(name, len(x), rng)
    got = batch_op(name, x, mags)
    want = torch.stack([torch_op(name, x[i], float(mags[i])) for i in range(len(x))])
    assert got.shape == x.shape
    assert (got - want).abs().max() < 1e-5, (name, (got - want).abs().max().item())
    if name != "Identity":
        assert (got - x).abs().max() > 0.01  # the op did something


@pytest.mark.parametrize("pool,law,p", [("clsa", "paper", 0.5), ("fixmatch", "code", 1.0), ("fixmatch", "fixed", 1.0)])
def test_strong_chain_equals_apply_strong_torch(pool, law, p):
    x = _images(8, 20, 28, seed=5)
    s = sample_strong(len(x), 5, pool, p, law, np.random.default_rng(7))
    got = apply_strong_batch(x, s["strong_op"], s["strong_on"], s["strong_mag"])
    want = torch.stack(
        [apply_strong_torch(x[i], s["strong_op"][i], s["strong_on"][i], s["strong_mag"][i]) for i in range(len(x))]
    )
    assert (got - want).abs().max() < 1e-4
    # tensors in, same result; all gates off is the identity
    same = apply_strong_batch(x, *(torch.from_numpy(s[k]) for k in ("strong_op", "strong_on", "strong_mag")))
    assert torch.equal(same, got)
    assert torch.equal(apply_strong_batch(x, s["strong_op"], np.zeros_like(s["strong_on"]), s["strong_mag"]), x)


# ----------------------------------------------------------------------------- corrupt inputs
def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def _raw_png(arr: np.ndarray, interlace: bool = False, filter_byte: int = 0) -> bytes:
    """8-bit RGB PNG written by hand (PIL writes no Adam7); every row gets `filter_byte`."""
    h, w, _ = arr.shape
    passes = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2))
    rows = [
        bytes([filter_byte]) + r.tobytes()
        for x0, y0, dx, dy in (passes if interlace else ((0, 0, 1, 1),))
        for r in arr[y0::dy, x0::dx]
    ]
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, int(interlace))
    return (
        b"\x89PNG\r\n\x1a\n"
        + _chunk(b"IHDR", ihdr)
        + _chunk(b"IDAT", zlib.compress(b"".join(rows)))
        + _chunk(b"IEND", b"")
    )


def _corrupt_batch() -> tuple[list[bytes], set[int]]:
    jpeg = encode(natural(150, 200, 1), "JPEG")
    png = encode(natural(90, 120, 2), "PNG")
    bad = {
        1: b"\xff\xd8\xff" + bytes(2000),  # JPEG magic, unreadable header
        3: jpeg[:700] + bytes(len(jpeg) - 700),  # JPEG header fine, scan data garbage
        4: png[:120] + bytes(len(png) - 120),  # PNG header fine, IDAT zeroed (CRC and zlib broken)
        6: _raw_png(natural(40, 50, 3), filter_byte=7),  # intact chunks and zlib, invalid row filter
        7: png[: len(png) // 2],  # truncated PNG
    }
    good = {0: jpeg, 2: png, 5: encode(natural(80, 60, 4), "JPEG"), 8: _raw_png(natural(41, 53, 5), True)}
    merged = {**good, **bad}
    return [merged[i] for i in range(len(merged))], set(bad)


def test_corrupt_jpeg_and_png_are_dropped_and_counted():
    """The batched JPEG call fails on the corrupt one and is redone one by one; PNGs whose rows libpng could
    not read are kept from torchvision's decoder (it would crash the process: png_check.py) and dropped.
    CPU only: whether nvjpeg reports garbage scan data as an error (rather than decoding noise) is nvjpeg's."""
    device = "cpu"
    encoded, bad = _corrupt_batch()
    recipe = same_views(size=24)
    ex = BatchedExecutor(recipe, device)
    views = make_views(encoded, recipe, ex, np.random.default_rng(0))
    expected = [i for i in range(len(encoded)) if i not in bad]
    assert views.kept.tolist() == expected and ex.skipped == len(bad)
    assert all(v.shape == (len(expected), 3, 24, 24) and v.device.type == device for v in views.images)
    assert all(len(t) == len(expected) and t.device.type == device for p in views.params for t in p.values())
    ref = TorchExecutor(recipe)
    assert make_views(encoded, recipe, ref, np.random.default_rng(0)).kept.tolist() == expected
    assert ref.skipped == len(bad)
    # all corrupt: empty views of the right shape on the device
    only_bad = [encoded[i] for i in sorted(bad)]
    imgs, kept = ex(only_bad, sample_views(only_bad, recipe, np.random.default_rng(1)))
    assert len(kept) == 0 and all(v.shape == (0, 3, 24, 24) and v.device.type == device for v in imgs)
    assert ex.skipped == 2 * len(bad)


def test_decode_batch_equals_torch_decoder_and_png_check():
    encoded, bad = _corrupt_batch()
    images, kept = decode_batch(encoded, range(len(encoded)), "cpu")
    assert kept.tolist() == [i for i in range(len(encoded)) if i not in bad]
    for i, img in zip(kept, images):
        assert img.dtype == torch.uint8 and torch.equal(img, decode_rgb(encoded[i]))
    # the hand-written Adam7 PNG decodes to its pixels; the check accepts intact PNGs of every layout
    arr = natural(41, 53, 5)
    assert torch.equal(images[-1].permute(1, 2, 0), torch.from_numpy(arr))
    assert png_rows_readable(_raw_png(arr)) and png_rows_readable(_raw_png(arr, True))
    assert not png_rows_readable(_raw_png(arr, True, filter_byte=5))
    assert png_rows_readable(b"not a png")  # nothing to say about other formats
    import io

    from PIL import Image

    im = Image.fromarray(natural(33, 47, 6))
    for img, kw in (
        (im, {}),
        (im.convert("L"), {}),
        (im.convert("1"), {}),
        (im.convert("P"), {}),
        (im.convert("P", palette=Image.ADAPTIVE, colors=16), {"bits": 4}),
        (im.convert("RGBA"), {}),
        (im.convert("LA"), {}),
        (im.convert("I;16"), {}),
    ):
        buf = io.BytesIO()
        img.save(buf, "PNG", **kw)
        assert png_rows_readable(buf.getvalue()), (img.mode, kw)


# ----------------------------------------------------------------------------- eval transform, factory
@pytest.mark.parametrize("device", ["cpu", CUDA])
def test_eval_transform_equals_torch_exec(device, photos, resize):
    recipe = same_views(size=32)
    ex, ref = BatchedExecutor(recipe, device), TorchExecutor(recipe)
    encoded = photos + [b"corrupt"]
    got, kept = ex.eval_transform(encoded, 40)
    want, want_kept = ref.eval_transform(encoded, 40)
    assert kept.tolist() == want_kept.tolist() == list(range(len(photos))) and ex.skipped == 1
    assert got.shape == want.shape == (len(photos), 3, 40, 40) and got.device.type == device
    diff = (got.cpu() - want).abs()
    assert diff.max() < 1e-5 if device == "cpu" else diff.mean() < 1.2 * LEVEL
    assert ex.eval_transform([b"corrupt"])[0].shape == (0, 3, 32, 32)


def test_make_executor_batched_kind_and_auto(monkeypatch):
    recipe = same_views(size=32)
    ex = make_executor("batched", recipe, 4, torch_device="cpu")
    assert type(ex) is BatchedExecutor and ex.device == torch.device("cpu")
    default = make_executor("batched", recipe, 4)
    assert default.device.type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert make_executor("batched", recipe, 4, device="cpu", torch_device="cuda").device.type == "cpu"
    maker = build_view_maker(
        {
            "kind": "views",
            "executor": "batched",
            "device": "auto",
            "mean": [0.5] * 3,
            "std": [0.25] * 3,
            "view": {"size": 16},
            "views": [{"name": "v", "count": 2}],
        },
        4,
        device="cpu",
    )
    assert type(maker.executor) is BatchedExecutor and maker.executor.device == torch.device("cpu")
    with pytest.raises(ValueError, match="auto|dali|torch|batched"):
        make_executor("pil", recipe, 4)
    with pytest.raises(ValueError, match="gpu is now called batched"):
        make_executor("gpu", recipe, 4)
    # auto: the batched executor on the worker's device, with or without DALI; on a CPU only up to 96 px views
    auto = make_executor("auto", recipe, 4, torch_device="cpu")
    assert type(auto) is BatchedExecutor and auto.device == torch.device("cpu")
    assert executors.auto_kind(recipe_of("mocov2"), torch_device="cpu") == "batched"  # 64 px
    large = image_recipe(compose_config(["augment=mocov2", "data=imagenet"])["augment"])  # 224 px
    assert executors.auto_kind(large, torch_device="cpu") == "torch"
    assert executors.auto_kind(large, device="cpu", torch_device="cuda") == "torch"  # augment.device=cpu
    assert type(make_executor("auto", large, 4, torch_device="cpu")) is TorchExecutor
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA"):
            make_executor("batched", recipe, 4, device="gpu")
    monkeypatch.setattr(executors.torch.cuda, "is_available", lambda: True)  # a GPU worker: batched at any size
    assert executors.auto_kind(large, torch_device="cuda:0") == executors.auto_kind(large) == "batched"


def test_config_refuses_the_old_executor_name():
    from pipeline.config import ConfigError
    from pipeline.schema import validate

    with pytest.raises(ConfigError, match=r"augment.executor=.?gpu.?: expected one of auto, dali, torch, batched"):
        validate(compose_config(["augment.executor=gpu"]))


def test_a_host_pack_brings_every_array_back_each_at_a_16_byte_boundary():
    """HostPack: arrays of each dtype it carries (float32, float64, int64; bool and int8 travel as int64) come back
    equal, in their shapes, each starting at a 16-byte boundary (what a compiled consumer is specialised on)."""
    from pipeline.augment.host_pack import HostPack

    rng = np.random.default_rng(0)
    arrays = {
        "a": rng.random(3).astype(np.float32),
        "b": rng.random((2, 5)),
        "c": rng.integers(0, 9, (7,)).astype(np.int8),
        "d": rng.random((1, 3, 1)).astype(np.float32),
        "e": rng.random(4) > 0.5,
    }
    pack = HostPack()
    for k, a in arrays.items():
        pack.add(k, a, np.float64 if k == "b" else None)
    out = pack.to(torch.device("cpu"))
    for k, a in arrays.items():
        t = out[k]
        assert t.shape == a.shape and t.data_ptr() % 16 == 0, k
        want = np.asarray(a, np.float64 if k == "b" else np.float32 if a.dtype.kind == "f" else np.int64)
        assert t.dtype == torch.from_numpy(want).dtype and np.array_equal(t.numpy(), want), k
