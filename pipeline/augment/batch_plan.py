"""The batched executor's host side: everything a batch's views need, worked out in numpy from the views'
parameters before one copy (batched.py applies it). Per group of views of one size and colour stage: the resize
taps (resize_taps.py), the colour passes (colour_batch.py), the blur rows and taps, solarize, the strong pool's rows;
per-sample values as rows of one float matrix and one mask matrix."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .colour_batch import jitter_passes
from .host_pack import HostPack
from .params import Params, blur_window
from .recipe import Recipe, ViewSpec
from .resize_taps import crop_axes


@dataclass(frozen=True)
class Group:
    """Views made together: same size and colour stage. `views`: their indices in the recipe."""

    views: tuple[int, ...]
    size: int
    colour: bool  # the executor applies jitter and grayscale (color_stage=executor)


def view_groups(recipe: Recipe) -> list[Group]:
    keys: dict[tuple[int, bool], list[int]] = {}
    for v, spec in enumerate(recipe.views):
        keys.setdefault((spec.size, spec.color_stage == "executor"), []).append(v)
    return [Group(tuple(vs), size, colour) for (size, colour), vs in keys.items()]


class Rows:
    """Per-sample float rows and boolean masks of one group, sent as one [K, N] matrix each."""

    def __init__(self, n: int):
        self.n = n
        self.floats: dict[str, np.ndarray] = {}
        self.masks: dict[str, np.ndarray] = {}

    def f(self, name: str, values) -> None:
        self.floats[name] = np.broadcast_to(np.asarray(values, np.float32), (self.n,))

    def m(self, name: str, values) -> None:
        self.masks[name] = np.broadcast_to(np.asarray(values).astype(bool), (self.n,))


def _image_major(a: np.ndarray, n_views: int, rows_per_view: bool) -> np.ndarray:
    """[V*B, S, T] in view-major rows -> [B, V*S, T] (rows_per_view False: the vertical matmul's layout) or
    [B*V, S, T] (True: the horizontal one's)."""
    nb, s, t = a.shape
    b = nb // n_views
    a = a.reshape(n_views, b, s, t).transpose(1, 0, 2, 3)
    return np.ascontiguousarray(a.reshape(b * n_views, s, t) if rows_per_view else a.reshape(b, n_views * s, t))


def plan_group(
    g: Group,
    specs: Sequence[ViewSpec],
    params: Sequence[Params],
    pack: HostPack,
    key: str,
    normalize: bool,
    matmul: bool = True,
    static: bool = False,
) -> dict:
    """Add group g's arrays to `pack` under `key`; return what the device side needs to know besides them.
    matmul=False: the resize is left to resize_per_sample (large images on a CPU), which reads the plan's crops.
    static=True (a group without strong ops): the photometric steps and their rows are what the recipe can ask
    for, not what this batch's draws ask for, so that every batch of one size is the same work (fused.py compiles
    it); a sample a step does not touch passes through `where` untouched, so the views are the same."""
    p = _concat_views([params[v] for v in g.views])
    n, nv, s = len(p["crop"]), len(g.views), g.size
    per_view = [specs[v] for v in g.views]
    rows = Rows(n)
    plan: dict = {"n": n, "pre": [], "post": [], "hue": False, "gray": False, "blur": 0, "solarize": False}
    plan["static"] = static = static and not any(sp.strong_ops for sp in per_view)
    if matmul:
        (yi, yt), (xi, xt) = crop_axes(p["crop"], s, p["flip"])
        pack.add(f"{key}.yi", _image_major(yi, nv, False))
        pack.add(f"{key}.yt", _image_major(yt / np.float32(255.0), nv, False))  # the reference's /255, folded in
        pack.add(f"{key}.xi", _image_major(xi, nv, True))
        pack.add(f"{key}.xt", _image_major(xt, nv, True))
    else:
        plan["crops"] = p["crop"]
        rows.m("flip", p["flip"] > 0)
    if g.colour:
        on = p["jitter_on"] > 0
        factors = np.stack([p["brightness"], p["contrast"], p["saturation"]], 1)
        pre, post = jitter_passes(on, factors, p.get("jitter_order"), static)
        for name, passes in (("pre", pre), ("post", post)):
            for t, ps in enumerate(passes):
                for k in ("f", "omf", "ws"):
                    rows.f(f"{name}{t}.{k}", getattr(ps, k))
                for k in ("wc", "active"):
                    rows.m(f"{name}{t}.{k}", getattr(ps, k))
                plan[name].append((f"{name}{t}", ps.uses_gray, ps.uses_mean))
        if on.any() or static:
            plan["hue"] = True
            rows.f("turns6", np.float32(6.0) * p["hue"].astype(np.float32))
            rows.m("hue_on", on)
        if (p["gray"] > 0).any() or static:
            plan["gray"] = True
            rows.m("gray_on", p["gray"] > 0)
    blur_on = (p["blur_on"] > 0) & (p["sigma"] > 0)
    blur = np.flatnonzero(blur_on)
    if static and any(sp.p_blur > 0 for sp in per_view):  # every row blurred, each with its own taps, kept by `where`
        # the bound as the samples hold it (float32), whose window may be wider than the float64 bound's
        window = max(blur_window(float(np.float32(sp.blur_sigma[1]))) for sp in per_view)
        taps = _blur_taps(np.where(blur_on, p["sigma"], 1.0), window)
        plan["blur"], plan["blur_all"] = window, True
        rows.m("blur_on", blur_on)
        pack.add(f"{key}.blur_taps", np.repeat(taps, 3, axis=0).reshape(-1, 1, 1, window))
    elif len(blur):
        taps = _blur_taps(p["sigma"][blur])
        plan["blur"] = taps.shape[1]
        pack.add(f"{key}.blur_rows", blur)
        pack.add(f"{key}.blur_taps", np.repeat(taps, 3, axis=0).reshape(-1, 1, 1, taps.shape[1]))
    if "solarize_on" in p and ((p["solarize_on"] > 0).any() or static):
        plan["solarize"] = True
        rows.m("sol_on", p["solarize_on"] > 0)
        rows.f("sol_thr", np.repeat([sp.solarize_threshold for sp in per_view], n // nv))
    if any(sp.strong_ops for sp in per_view):
        plan["strong"] = _strong_rows(g, specs, params)
    plan["normalize"] = normalize and g.colour
    names_f, names_m = list(rows.floats), list(rows.masks)
    if names_f:
        pack.add(f"{key}.f", np.stack([rows.floats[k] for k in names_f]))
    if names_m:
        pack.add(f"{key}.m", np.stack([rows.masks[k] for k in names_m]).astype(np.int64))
    plan["names_f"], plan["names_m"] = names_f, names_m
    return plan


def _concat_views(params: Sequence[Params]) -> Params:
    """The views' rows, view-major. A key some views lack (a view without solarize, or in fixed jitter order)
    gets the rows that mean "off" there; the strong pool's keys are handled by _strong_rows."""
    keys = {k for p in params for k in p if not k.startswith("strong_") and k != "counts"}
    out = {}
    for k in sorted(keys):
        parts = []
        for p in params:
            if k in p:
                parts.append(p[k])
            elif k == "jitter_order":
                parts.append(np.tile(np.arange(4, dtype=np.int8), (len(p["crop"]), 1)))
            else:
                parts.append(np.zeros((len(p["crop"]),) + next(q[k] for q in params if k in q).shape[1:], np.uint8))
        out[k] = np.concatenate(parts)
    return out


def _blur_taps(sigma: np.ndarray, k: int | None = None) -> np.ndarray:
    """[n, k] taps of torchvision's Gaussian kernel (softmax of -(d / sqrt 2 / sigma)^2 over its own window of
    blur_window(sigma) taps), every row on the window k (default: the batch's largest) with zeros outside its own:
    with reflect padding of k // 2 that is torchvision's per-sample blur (reflection gives the same pixels where a
    smaller window reaches)."""
    windows = np.array([blur_window(float(s)) for s in sigma])
    k = int(windows.max()) if k is None else k
    assert windows.max() <= k, f"a blur window of {windows.max()} taps past the {k} planned"
    lim = (k - 1) / (2.0 * math.sqrt(2.0))
    pos = np.linspace(-lim, lim, k, dtype=np.float32).astype(np.float64)
    own = (np.abs(np.arange(k) - k // 2)[None, :] <= ((windows - 1) // 2)[:, None]).astype(bool)
    logits = -((pos[None, :] / sigma.astype(np.float32).astype(np.float64)[:, None]) ** 2)
    w = np.where(own, np.exp(logits - logits.max(1, keepdims=True)), 0.0)
    return (w / w.sum(1, keepdims=True)).astype(np.float32)


def _strong_rows(g: Group, specs: Sequence[ViewSpec], params: Sequence[Params]) -> tuple[np.ndarray, ...]:
    """The strong pool's (op, on, mag) rows of the group, [N, slots]; views without strong ops are all off."""
    slots = max(specs[v].strong_ops for v in g.views)
    out = []
    for key, dtype in (("strong_op", np.int64), ("strong_on", bool), ("strong_mag", np.float32)):
        parts = []
        for v in g.views:
            b = len(params[v]["crop"])
            a = params[v].get(key, np.zeros((b, 0), dtype)).astype(dtype).reshape(b, -1)
            parts.append(np.pad(a, ((0, 0), (0, slots - a.shape[1]))))
        out.append(np.concatenate(parts))
    return tuple(out)
