"""The named recipes of conf/augment, the generalised view layer (multi-crop, per-view laws, random jitter
order, solarize, joint samplers), the differentiable colour ops, and the gallery."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision.transforms.v2.functional as TF
from PIL import Image

from helpers import encode, natural
from pipeline.augment import colour
from pipeline.augment.executors import make_executor
from pipeline.augment.params import sample_views
from pipeline.augment.recipe import Recipe, ViewSpec, recipe_from_dict
from pipeline.augment.view_makers import image_recipe
from pipeline.config import CONF_DIR, compose_config

pytestmark = pytest.mark.filterwarnings("ignore:The image decoding and encoding capabilities:DeprecationWarning")
IMAGE_RECIPES = sorted(p.stem for p in (CONF_DIR / "augment").glob("*.yaml") if p.stem != "spirograph")


@pytest.fixture(scope="module")
def photos() -> list[bytes]:
    return [encode(natural(120, 160, s), "JPEG") for s in range(3)] + [encode(natural(100, 90, 9), "PNG")]


def recipe_of(name: str, data: str = "cifar10", *overrides: str) -> Recipe:
    return image_recipe(compose_config([f"augment={name}", f"data={data}", *overrides])["augment"])


# ----------------------------------------------------------------------------- the named recipes
@pytest.mark.parametrize("name", IMAGE_RECIPES)
def test_every_recipe_composes_on_every_dataset(name):
    for data, size in (("imagenet", 224), ("cifar10", 32)):
        r = recipe_of(name, data, "augment.joint.crop.beta=1")
        assert r.size == size and r.joint.crop_beta == 1.0
        assert all(0 < s <= size for s in r.sizes)


def test_recipe_laws_match_the_papers():
    byol = recipe_of("byol", "imagenet")
    assert [v.p_blur for v in byol.views] == [1.0, 0.1] and [v.p_solarize for v in byol.views] == [0.0, 0.2]
    assert byol.views[0].scale == (0.08, 1.0) and byol.views[0].jitter == (0.4, 0.4, 0.2, 0.1)
    assert recipe_of("mocov3", "imagenet") == byol
    dino = recipe_of("dino", "imagenet")
    assert dino.sizes == (224, 224) + (96,) * 6 and dino.views[2].scale == (0.05, 0.4)
    assert [v.name for v in dino.views].count("local") == 6
    assert recipe_of("dino", "imagenet", "augment.views.1.count=10").n_views == 12
    clsa = recipe_of("clsa", "imagenet")
    assert clsa.sizes == (224, 224, 96) and clsa.views[2].strong_ops == 5 and clsa.views[2].strong_p == 0.5
    assert clsa.views[0].strong_ops == 0
    multi = recipe_of("clsa_multi", "imagenet")
    assert multi.sizes == (224, 224, 224, 192, 160, 128, 96)
    assert [v.scale for v in multi.views[2:]] == [
        (0.2, 1.0),
        (0.172, 0.86),
        (0.143, 0.715),
        (0.114, 0.571),
        (0.086, 0.429),
    ]
    cocor = recipe_of("cocor", "imagenet")
    assert [v.strong_ops for v in cocor.views] == [0, 0, 1, 2, 3]
    assert all(v.strong_p == 1.0 and v.strong_pool == "fixmatch" for v in cocor.views[2:])
    inv = recipe_of("invclr", "cifar10")
    assert inv.views[0].color_stage == "model" and inv.views[0].hue_mode == "yiq" and inv.mean[0] == 0.4914
    m1 = recipe_of("mocov1", "imagenet")
    assert m1.views[0].p_jitter == 1.0 and m1.views[0].jitter == (0.4,) * 4 and m1.views[0].p_blur == 0.0
    assert recipe_of("clsa", "cifar10").sizes == (32, 32, 14)  # 96 px at 224 -> 14 px at 32


def test_recipe_errors_are_clear():
    with pytest.raises(ValueError, match="JointCrop needs the first two views to share scale"):
        r = recipe_from_dict({"views": [{"scale": [0.2, 1]}, {"scale": [0.05, 0.4]}], "joint": {"crop": {"beta": 1}}})
        sample_views([encode(natural(50, 50, 0))], r, np.random.default_rng(0))
    with pytest.raises(
        ValueError, match=r"^1 validation error for ViewSpec\n  Input should be 'fixed' or 'random'|jitter_order"
    ):
        ViewSpec(jitter_order="shuffled")
    with pytest.raises(ValueError, match=r"scale=\[0.5, 0.2\]: expected a list of 2 numbers, 0 < low <= high <= 1"):
        ViewSpec(scale=(0.5, 0.2))  # a spec made in code is held to a config's relations too


@pytest.mark.parametrize(
    "config,line",
    [
        (
            {"views": [{"count": 2, "p_blurr": 1.0}]},
            "augment.views.0.p_blurr: unknown key; expected one of name, size,",
        ),
        (
            {"views": [{"count": 2, "per_view": [{"p_blur": 1.0}]}]},
            "augment.views.0.per_view=[{p_blur: 1.0}]: expected 2",
        ),
        (
            {"views": [{}, {"count": 2, "per_view": [{}, {"p_gray": 2}]}]},
            "augment.views.1.per_view.1.p_gray=2: expected a",
        ),
        (
            {"view": {"jitter": [0.4, 0.4, 0.4, 0.6]}, "views": [{}]},
            "augment.views.0.jitter=[0.4, 0.4, 0.4, 0.6]: expected 4",  # a relation: judged on each view
        ),
        ({"p_blur": 1.5}, "augment.p_blur=1.5: expected a number in [0, 1]"),
        ({"size": 32.5}, "augment.size=32.5: expected an integer >= 1"),
        ({"scale": [0.6, 0.2]}, "augment.scale=[0.6, 0.2]: expected a list of 2 numbers, 0 < low <= high <= 1"),
        ({"ratio": [1.0]}, "augment.ratio=[1.0]: expected a list of 2 numbers, 0 < low <= high"),
        ({"strong_law": "magic"}, "augment.strong_law=magic: expected one of paper, code, fixed"),
        ({"hue_mode": "yiq"}, "augment.hue_mode=yiq: expected hsv: yiq exists only in the differentiable colour"),
        ({"joint": {"crop": {"betta": 1}}}, "augment.joint.crop.betta: unknown key; expected one of beta"),
        (
            {"joint": {"color": {"factor": "hue"}}},
            "augment.joint.color.factor=hue: expected one of brightness, contrast",
        ),
        ({"n_views": 1, "joint": {"crop": {"beta": 0}}}, "augment.n_views=1: expected 2 or more with augment.joint"),
        ({"views": [{}], "joint": {"crop": {"beta": 0}}}, "augment.views=1 view: expected two views or more with"),
        ({"views": 3}, "augment.views=3: expected a non-empty list of view groups"),
        ({"views": [5]}, "augment.views.0=5: expected a mapping of view keys"),
        ({"views": [{"count": 2, "per_view": 5}]}, "augment.views.0.per_view=5: expected a list of mappings"),
        ({"views": [{"count": 1, "per_view": [3]}]}, "augment.views.0.per_view=[3]: expected a list of mappings"),
        ({"view": "x", "views": [{}]}, "augment.view=x: expected a mapping of keys"),
        ({"view": {"p_blur": 2}, "views": [{}]}, "augment.view.p_blur=2: expected a number in [0, 1]"),
        ({"std": [0.2, 0, 0.2]}, "augment.std=[0.2, 0.0, 0.2]: expected 3 numbers > 0"),
        ({"views": [{}], "size": 32}, "augment.size=32: unknown key next to views; view defaults go under view"),
    ],
)
def test_each_recipe_key_is_checked_where_it_is_written(config, line):
    from pipeline.config import ConfigError

    with pytest.raises(ConfigError) as e:
        recipe_from_dict(config)
    assert str(e.value).startswith(line), str(e.value)


def test_view_defaults_are_held_to_their_relations_only_once_merged_into_a_view():
    # a default no view keeps as it is (hue_mode=yiq needs color_stage=model, which each group sets) is no error
    r = recipe_from_dict({"view": {"hue_mode": "yiq"}, "views": [{"color_stage": "model", "count": 2}]})
    assert [v.hue_mode for v in r.views] == ["yiq", "yiq"]
    with pytest.raises(ValueError, match=r"^augment.views.1.hue_mode=yiq: expected hsv"):
        recipe_from_dict({"view": {"hue_mode": "yiq"}, "views": [{"color_stage": "model"}, {}]})


def test_a_recipe_compares_and_hashes_by_its_law():
    a = recipe_from_dict({"views": [{"count": 2, "size": 32, "scale": [0.2, 1]}], "joint": {"crop": {"beta": 1}}})
    b = recipe_from_dict({"size": 32, "scale": (0.2, 1.0), "joint": {"crop": {"beta": 1.0}}})
    assert a == b and hash(a) == hash(b) and a.views[0].scale == (0.2, 1.0) and a.joint.crop_beta == 1.0
    assert a != recipe_from_dict({"size": 32, "joint": {"crop": {"beta": 2}}})


# ----------------------------------------------------------------------------- both executors, every recipe
_EXEC: dict = {}


def _executors(name: str, recipe: Recipe, batch: int):
    if name not in _EXEC:
        _EXEC[name] = {k: make_executor(k, recipe, batch, device="cpu") for k in ("dali", "torch")}
    return _EXEC[name]


@pytest.mark.parametrize("name", IMAGE_RECIPES)
def test_dali_and_torch_agree_on_every_recipe(name, photos):
    pytest.importorskip("nvidia.dali")
    recipe = recipe_of(name, "cifar10", "data.image_size=96")
    params = sample_views(photos, recipe, np.random.default_rng(3))
    ex = _executors(name, recipe, len(photos))
    (d, dk), (t, tk) = ex["dali"](photos, params), ex["torch"](photos, params)
    assert dk.tolist() == tk.tolist() == list(range(len(photos)))
    assert [v.shape for v in d] == [v.shape for v in t] == [(len(photos), 3, s, s) for s in recipe.sizes]
    scale = 255.0 * (1.0 if recipe.views[0].color_stage == "model" else np.array(recipe.std).reshape(1, 3, 1, 1))
    for v, (a, b) in enumerate(zip(d, t)):
        diff = np.abs(a.numpy() - b.numpy()) * scale  # in 0..255 levels
        # Resampling differs at the borders and blur carries that inwards: judge the interior. Discontinuous
        # ops (solarize, posterize, equalize) can flip a pixel sitting on a threshold: bound the bulk and the mean.
        m = max(2, a.shape[-1] // 8)
        inner = diff[..., m:-m, m:-m]
        assert np.quantile(inner, 0.99) < 1.0, (name, v, np.quantile(inner, 0.99))
        assert inner.mean() < 0.3 and diff.mean() < 1.0, (name, v, inner.mean(), diff.mean())


# ----------------------------------------------------------------------------- random order, solarize
def test_random_jitter_order_is_the_recorded_permutation(photos):
    spec = ViewSpec(
        size=40, jitter_order="random", p_jitter=1.0, p_gray=0, p_blur=0, p_flip=0, scale=(1, 1), ratio=(4 / 3, 4 / 3)
    )
    recipe = Recipe(views=(spec,), mean=(0, 0, 0), std=(1, 1, 1))
    params = sample_views(photos[:3], recipe, np.random.default_rng(0))
    p = params[0]
    p["jitter_order"][:] = [[3, 2, 1, 0], [0, 1, 2, 3], [2, 0, 3, 1]]
    p["brightness"][:], p["contrast"][:], p["saturation"][:], p["hue"][:] = 1.3, 0.6, 1.5, 0.2
    ex = make_executor("torch", recipe, 3, device="cpu")
    (views,), _ = ex(photos[:3], params)
    from pipeline.augment.torch_exec import crop_resize, decode_rgb

    fns = [
        lambda x: TF.adjust_brightness(x, 1.3),
        lambda x: TF.adjust_contrast(x, 0.6),
        lambda x: TF.adjust_saturation(x, 1.5),
        lambda x: TF.adjust_hue(x, 0.2),
    ]
    for i, order in enumerate(p["jitter_order"]):
        x = crop_resize(decode_rgb(photos[i]), p["crop"][i], 40)
        for k in order:
            x = fns[k](x)
        assert (views[i] - x).abs().max() < 2e-3, order
    assert (views[0] - views[1]).abs().max() > 0.05  # the order matters for these factors
    pytest.importorskip("nvidia.dali")
    (d,), _ = make_executor("dali", recipe, 3, device="cpu")(photos[:3], params)
    assert (d - views).abs()[..., 2:-2, 2:-2].max() * 255 < 0.1


@pytest.mark.parametrize("kind", ["dali", "torch"])
def test_solarize_inverts_above_threshold(kind, photos):
    if kind == "dali":
        pytest.importorskip("nvidia.dali")
    spec = ViewSpec(size=32, p_jitter=0, p_gray=0, p_blur=0, p_flip=0, p_solarize=1.0, solarize_threshold=0.5)
    plain = Recipe(views=(ViewSpec(size=32, p_jitter=0, p_gray=0, p_blur=0, p_flip=0),), mean=(0, 0, 0), std=(1, 1, 1))
    sol = Recipe(views=(spec,), mean=(0, 0, 0), std=(1, 1, 1))
    params = sample_views(photos, sol, np.random.default_rng(1))
    base = {k: v for k, v in params[0].items() if k != "solarize_on"}
    (x,), _ = make_executor(kind, plain, 4, device="cpu")(photos, [base])
    (y,), _ = make_executor(kind, sol, 4, device="cpu")(photos, params)
    hi = x >= 0.5 + 1e-4
    lo = x < 0.5 - 1e-4
    assert hi.float().mean() > 0.1 and lo.float().mean() > 0.1
    assert (y[hi] - (1 - x[hi])).abs().max() < 1e-4 and (y[lo] - x[lo]).abs().max() < 1e-4


# ----------------------------------------------------------------------------- joint samplers wired in
def _log_area_ratio(params) -> np.ndarray:
    a = params[0]["crop"][:, 2] * params[0]["crop"][:, 3]
    b = params[1]["crop"][:, 2] * params[1]["crop"][:, 3]
    return np.log(b / a)


def test_joint_crop_blur_color_reach_the_views():
    encoded = [encode(natural(300, 400, 0))] * 2000
    indep = recipe_from_dict({"p_blur": 1.0, "p_jitter": 1.0})
    tight = recipe_from_dict(
        {
            "p_blur": 1.0,
            "p_jitter": 1.0,
            "joint": {"crop": {"beta": 20}, "blur": {"beta": 20}, "color": {"beta": 20, "factor": "contrast"}},
        }
    )
    pi = sample_views(encoded, indep, np.random.default_rng(0))
    pt = sample_views(encoded, tight, np.random.default_rng(0))
    # beta = 20: log-ratio std s_b / 20, so the two views' areas, sigmas and contrasts nearly coincide
    assert np.std(_log_area_ratio(pt)) < 0.25 * np.std(_log_area_ratio(pi))
    for key in ("sigma", "contrast"):
        ri, rt = np.log(pi[1][key] / pi[0][key]), np.log(pt[1][key] / pt[0][key])
        assert np.std(rt) < 0.25 * np.std(ri), key
    # brightness was not the joint factor: still independent
    rb = np.log(pt[1]["brightness"] / pt[0]["brightness"])
    assert np.std(rb) > 0.5 * np.std(np.log(pi[1]["brightness"] / pi[0]["brightness"]))
    # the apply gates stay independent per view
    gated = recipe_from_dict({"p_blur": 0.5, "joint": {"blur": {"beta": 1}}})
    pg = sample_views(encoded, gated, np.random.default_rng(1))
    assert abs(pg[0]["blur_on"].mean() - 0.5) < 0.05 and 0.15 < (pg[0]["blur_on"] & pg[1]["blur_on"]).mean() < 0.35
    assert ((pg[0]["sigma"] > 0) == (pg[0]["blur_on"] > 0)).all()


# ----------------------------------------------------------------------------- differentiable colour ops
def _batch(n: int = 4, seed: int = 0) -> torch.Tensor:
    return torch.from_numpy(np.stack([natural(24, 32, seed + i) for i in range(n)])).permute(0, 3, 1, 2).float() / 255


def test_colour_ops_equal_torchvision():
    x = _batch()
    f = torch.tensor([0.3, 0.9, 1.2, 1.8])
    h = torch.tensor([-0.45, -0.1, 0.05, 0.3])
    for ours, theirs, fac in (
        (colour.brightness, TF.adjust_brightness, f),
        (colour.contrast, TF.adjust_contrast, f),
        (colour.saturation, TF.adjust_saturation, f),
        (colour.hue_hsv, TF.adjust_hue, h),
    ):
        got = ours(x, fac)
        want = torch.stack([theirs(x[i], float(fac[i])) for i in range(4)])
        assert (got - want).abs().max() < 1e-5, ours.__name__


def test_yiq_hue_is_invclr_equation():
    x = _batch(3, 5).double()
    turns = torch.tensor([0.0, 0.1, -0.37], dtype=torch.float64)
    got = colour.hue_yiq(x, turns, clip=False)
    t_yiq, t_rgb = np.array(colour.YIQ), np.array(colour.YIQ_TO_RGB)
    for i in range(3):
        th = 2 * math.pi * float(turns[i])
        rot = np.array([[1, 0, 0], [0, math.cos(th), -math.sin(th)], [0, math.sin(th), math.cos(th)]])
        for r, c in ((0, 0), (5, 7), (23, 31)):
            want = t_rgb @ rot @ t_yiq @ x[i, :, r, c].numpy()
            np.testing.assert_allclose(got[i, :, r, c].numpy(), want, atol=1e-12)
    # angle 0 is the identity only up to the paper's rounded matrices
    assert (got[0] - x[0]).abs().max() < 2e-3


def test_colour_distort_is_differentiable_in_its_factors():
    x = _batch(4, 2).double()
    alpha = {
        k: torch.tensor(v, dtype=torch.float64, requires_grad=True)
        for k, v in (
            ("brightness", [1.2, 0.8, 1.1, 0.9]),
            ("contrast", [0.7, 1.3, 1.0, 1.2]),
            ("saturation", [1.4, 0.6, 1.2, 0.8]),
            ("hue", [0.05, -0.08, 0.02, 0.0]),
        )
    }
    params = {**alpha, "jitter_on": torch.tensor([1, 1, 0, 1]), "gray": torch.tensor([0, 0, 0, 1])}
    out = colour.colour_distort(x, params, hue_mode="yiq")
    grads = torch.autograd.grad(out.sum(), list(alpha.values()))
    for g in grads:
        assert torch.isfinite(g).all()
        assert g[2] == 0  # jitter off: the view does not depend on its factors
    assert all(g[0] != 0 for g in grads)
    assert torch.equal(out[2], x[2])  # gates off: exact identity
    # numerical check of d out / d brightness for sample 1 (no clipping at these values)
    eps = 1e-6
    bumped = {
        **{k: v.detach().clone() for k, v in alpha.items()},
        "jitter_on": params["jitter_on"],
        "gray": params["gray"],
    }
    bumped["brightness"][1] += eps
    fd = (colour.colour_distort(x, bumped, "yiq")[1].sum() - out[1].sum().detach()) / eps
    assert abs(float(fd) - float(grads[0][1])) < 1e-4 * max(1.0, abs(float(fd)))


# ----------------------------------------------------------------------------- gallery
def test_gallery_job_writes_annotated_grid(tmp_path):
    import subprocess
    import sys

    from pipeline.data.imagefolder import make_imagefolder_split

    root = tmp_path / "imgs"
    for c in ("a", "b"):
        (root / c).mkdir(parents=True)
        for i in range(3):
            Image.fromarray(natural(60, 80, i + (10 if c == "b" else 0))).save(root / c / f"{i}.jpg")
    make_imagefolder_split(root, tmp_path / "shards", "train", maxcount=10, progress=False)
    out = tmp_path / "g.png"
    job = Path(__file__).resolve().parents[2] / "jobs" / "gallery.py"
    res = subprocess.run(
        [
            sys.executable,
            str(job),
            "augment=dino",
            "data=cifar10",
            f"data.train={tmp_path}/shards/train",
            f"data.val={tmp_path}/shards/train",
            "gallery.n_images=3",
            f"gallery.out={out}",
            "augment.executor=torch",
            f"paths.root={tmp_path}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert "3 images x 8 views" in res.stdout
    img = np.asarray(Image.open(out).convert("RGB"))
    assert img.shape[0] > 300 and img.shape[1] > 1000  # 3 rows, 9 columns
    assert img.std() > 20  # not blank
