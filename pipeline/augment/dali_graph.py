"""The DALI graphs behind DaliExecutor (dali_exec.py): one pipeline that applies sampled view parameters, and
the evaluation one (resize, centre crop), with the host arrays each view's external sources are fed.

Encoded bytes and every view's parameters are fed per batch through `fn.external_source`
(per-sample argument inputs). Per view: fused decode+crop (`decoders.image_slice`, "mixed" on
GPU), resize to size x size in float, then the photometric ops written with DALI arithmetic so
they mean exactly what torchvision's do (torch_exec.py is the reference):
  brightness  x*b                        contrast    c*x + (1-c)*mean(luma)
  saturation  s*x + (1-s)*luma           hue         HSV rotation (closed form below)
each clamped to [0, 255] like torchvision clamps to [0, 1] (in a per-sample random order where the
view asks), then grayscale, gaussian blur, solarize (arithmetic: DALI has no CPU solarize), the
strong-pool ops (strong_dali.py), and crop_mirror_normalize (flip + normalise + CHW). Flipping last
is equivalent to torch_exec's flip-after-resize, since every op before it is per-pixel or a
symmetric blur with symmetric borders; views with strong ops (shear, translate) flip first instead.
Random per-sample application uses DALI conditionals, so "off" is an exact identity. The graph is
built from the recipe: one branch per view, holding only the ops its spec can use.

DALI is an optional dependency: this module and dali_exec import it at their top, and pipeline.augment.executors
imports the executor only when DALI makes the views.
"""

from __future__ import annotations

from typing import cast

import numpy as np
import nvidia.dali.fn as fn
import nvidia.dali.math as dmath
from nvidia.dali import pipeline_def
from nvidia.dali.data_node import DataNode
from nvidia.dali.types import DALIDataType, DALIImageType, DALIInterpType  # types.FLOAT etc.: not in types.pyi

from .params import Params, blur_window
from .recipe import Recipe, ViewSpec
from .strong_dali import apply_strong_dali, strong_feed, strong_inputs

LUMA = (0.2989, 0.587, 0.114)  # torchvision's rgb_to_grayscale weights


# ----------------------------------------------------------------------------- graph pieces
def _luma(r, g, b):
    return r * LUMA[0] + g * LUMA[1] + b * LUMA[2]


def _clamp(x):
    return dmath.clamp(x, 0.0, 255.0)


def _hue_shift(r, g, b, turns):
    """torchvision's adjust_hue (RGB -> HSV, h += turns, HSV -> RGB) as elementwise arithmetic.

    h6 is the hue in sixths of a turn. HSV -> RGB uses the closed form
    channel_n = V - V*S*clamp(min(k, 4 - k), 0, 1), k = (n + h6) mod 6, n = 5, 3, 1 for R, G, B,
    with V = max and V*S = max - min (the chroma).
    """
    mx = dmath.max(dmath.max(r, g), b)
    mn = dmath.min(dmath.min(r, g), b)
    chroma = mx - mn
    div = chroma + (chroma == 0.0)  # greys have chroma 0: any non-zero divisor gives h6 = 0
    rc, gc, bc = (mx - r) / div, (mx - g) / div, (mx - b) / div
    is_r = mx == r
    is_g = (mx == g) & (mx != r)
    is_b = (mx != g) & (mx != r)
    h6 = is_r * (bc - gc) + is_g * (2.0 + rc - bc) + is_b * (4.0 + gc - rc) + turns * 6.0
    out = []
    for n in (5.0, 3.0, 1.0):
        k = h6 + n
        k = k - dmath.floor(k / 6.0) * 6.0
        out.append(mx - chroma * dmath.clamp(dmath.min(k, 4.0 - k), 0.0, 1.0))
    return out


def _brightness(r, g, b, f):
    return tuple(_clamp(c * f) for c in (r, g, b))


def _contrast(r, g, b, f):
    mean = fn.reductions.mean(_luma(r, g, b))  # per-sample scalar, broadcast below
    return tuple(_clamp(c * f + mean * (1.0 - f)) for c in (r, g, b))


def _saturation(r, g, b, f):
    lum = _luma(r, g, b)
    return tuple(_clamp(c * f + lum * (1.0 - f)) for c in (r, g, b))


def _hue(r, g, b, f):
    return tuple(_hue_shift(r, g, b, f))


_JITTER = (_brightness, _contrast, _saturation, _hue)  # indexed like colour.JITTER_OPS


def _channels(img):
    return img[:, :, 0], img[:, :, 1], img[:, :, 2]


def _color_jitter(img, factors):
    """Fixed order brightness, contrast, saturation, hue on float HWC in [0, 255]."""
    r, g, b = _channels(img)
    for op, f in zip(_JITTER, factors):
        r, g, b = op(r, g, b, f)
    return fn.stack(r, g, b, axis=2, axis_name="C")


def _color_jitter_random(img, factors, order):
    """torchvision's random order: slot k applies op order[k] (a per-sample permutation of 0..3)."""
    r, g, b = _channels(img)
    for slot in order:
        if slot == 0:
            r, g, b = _brightness(r, g, b, factors[0])
        elif slot == 1:
            r, g, b = _contrast(r, g, b, factors[1])
        elif slot == 2:
            r, g, b = _saturation(r, g, b, factors[2])
        else:
            r, g, b = _hue(r, g, b, factors[3])
    return fn.stack(r, g, b, axis=2, axis_name="C")


def _grayscale(img):
    lum = _luma(*_channels(img))
    return fn.stack(lum, lum, lum, axis=2, axis_name="C")


def _solarize(img, threshold: float):
    """Pixels >= threshold (0-255 scale) become 255 - x: DALI has no CPU solarize, so arithmetic."""
    hit = img >= threshold
    return img + hit * (255.0 - 2.0 * img)


def _normalize(img, recipe: Recipe, spec: ViewSpec | None = None, mirror=0):
    """CHW float: normalised, or plain [0, 1] for views whose colour stage the method runs."""
    if spec is not None and spec.color_stage == "model":
        mean, std = [0.0] * 3, [255.0] * 3
    else:
        mean, std = [255.0 * m for m in recipe.mean], [255.0 * s for s in recipe.std]
    return fn.crop_mirror_normalize(
        img, mirror=mirror, dtype=DALIDataType.FLOAT, output_layout="CHW", mean=mean, std=std
    )


def _input(name: str, dtype, ndim: int):
    return fn.external_source(name=name, dtype=dtype, ndim=ndim)


# Per-view external sources: name -> (dtype, ndim per sample). Filled by _view_feed.
_GEOMETRY_INPUTS = {"start": (DALIDataType.INT32, 1), "shape": (DALIDataType.INT32, 1), "flip": (DALIDataType.INT32, 0)}
_JITTER_INPUTS = {
    "jitter_on": (DALIDataType.BOOL, 0),
    "brightness": (DALIDataType.FLOAT, 0),
    "contrast": (DALIDataType.FLOAT, 0),
    "saturation": (DALIDataType.FLOAT, 0),
    "hue": (DALIDataType.FLOAT, 0),
}
_BLUR_INPUTS = {"blur_on": (DALIDataType.BOOL, 0), "sigma": (DALIDataType.FLOAT, 0), "window": (DALIDataType.INT32, 0)}


def _view_inputs(spec: ViewSpec) -> dict[str, tuple]:
    """The external sources one view's graph reads: only the ops its spec can use (DALI rejects feeding an
    input the graph does not consume)."""
    inputs = dict(_GEOMETRY_INPUTS)
    colour_here = spec.color_stage == "executor"
    if colour_here and spec.p_jitter > 0:
        inputs.update(_JITTER_INPUTS)
        if spec.jitter_order == "random":
            inputs.update({f"order{k}": (DALIDataType.INT32, 0) for k in range(4)})
    if colour_here and spec.p_gray > 0:
        inputs["gray"] = (DALIDataType.BOOL, 0)
    if spec.p_blur > 0:
        inputs.update(_BLUR_INPUTS)
    if spec.p_solarize > 0:
        inputs["solarize_on"] = (DALIDataType.BOOL, 0)
    return inputs  # strong-op slots have their own sources: strong_dali.strong_inputs


@pipeline_def(enable_conditionals=True)
def _views_pipeline(recipe: Recipe, gpu: bool):
    encoded = _input("encoded", DALIDataType.UINT8, 1)
    outputs = []
    for v, spec in enumerate(recipe.views):
        p = {k: _input(f"v{v}_{k}", dtype, nd) for k, (dtype, nd) in _view_inputs(spec).items()}
        # Fused decode + crop. With axes=[0, 1], start = (y, x) and shape = (h, w) in absolute
        # pixels (the default axes=[1, 0] would mean x, y); tests check it on a coordinate image.
        img = fn.decoders.image_slice(
            encoded,
            start=p["start"],
            shape=p["shape"],
            axes=[0, 1],
            device="mixed" if gpu else "cpu",
            output_type=DALIImageType.RGB,
        )
        resized = fn.resize(
            img,
            resize_x=spec.size,
            resize_y=spec.size,
            antialias=True,
            interp_type=DALIInterpType.INTERP_LINEAR,
            dtype=DALIDataType.FLOAT,
        )
        img = cast(DataNode, resized)  # one node: without save_attrs, resize returns no sizes
        mirror = p["flip"]
        if spec.strong_ops:  # the strong ops are not flip-equivariant (shear, translate): flip first
            img = fn.flip(img, horizontal=p["flip"])
            mirror = 0
        if "jitter_on" in p:
            # Scalars used in arithmetic must live where the image lives.
            num = [p[k].gpu() if gpu else p[k] for k in ("brightness", "contrast", "saturation", "hue")]
            if p["jitter_on"]:
                if spec.jitter_order == "random":
                    img = _color_jitter_random(img, num, [p[f"order{k}"] for k in range(4)])
                else:
                    img = _color_jitter(img, num)
        if "gray" in p:
            if p["gray"]:
                img = _grayscale(img)
        if "blur_on" in p:
            if p["blur_on"]:
                img = fn.gaussian_blur(img, sigma=p["sigma"], window_size=p["window"])
        if "solarize_on" in p:
            if p["solarize_on"]:
                img = _solarize(img, 255.0 * spec.solarize_threshold)
        if spec.strong_ops:
            op, on, mag = strong_inputs(prefix=f"v{v}_")
            img = apply_strong_dali(img, op, on, mag, spec.strong_ops)
        outputs.append(_normalize(img, recipe, spec, mirror=mirror))
    return tuple(outputs)


@pipeline_def
def _eval_pipeline(recipe: Recipe, size: int, gpu: bool):
    encoded = _input("encoded", DALIDataType.UINT8, 1)
    rh, rw = _input("resize_h", DALIDataType.FLOAT, 0), _input("resize_w", DALIDataType.FLOAT, 0)
    start = _input("start", DALIDataType.INT32, 1)
    img = fn.decoders.image(encoded, device="mixed" if gpu else "cpu", output_type=DALIImageType.RGB)
    resized = fn.resize(
        img,
        resize_x=rw,
        resize_y=rh,
        antialias=True,
        interp_type=DALIInterpType.INTERP_LINEAR,
        dtype=DALIDataType.FLOAT,
    )
    img = cast(DataNode, resized)  # one node: without save_attrs, resize returns no sizes
    img = fn.slice(img, start=start, shape=[size, size], axes=[0, 1])
    return _normalize(img, recipe)


def _view_feed(params: Params, idx: np.ndarray, spec: ViewSpec) -> dict[str, np.ndarray]:
    """Host arrays for one view's external sources, rows `idx`."""
    crop = params["crop"][idx].astype(np.int32)
    blur_on = (params["blur_on"][idx] > 0) & (params["sigma"][idx] > 0)  # sigma 0 = no blur, as in torch
    # Blur args only reach samples in the blur branch; keep the others valid anyway.
    sigma = np.where(blur_on, params["sigma"][idx], 1.0).astype(np.float32)
    feed = {
        "start": np.ascontiguousarray(crop[:, :2]),
        "shape": np.ascontiguousarray(crop[:, 2:]),
        "flip": params["flip"][idx].astype(np.int32),
        "jitter_on": params["jitter_on"][idx] > 0,
        "brightness": params["brightness"][idx].astype(np.float32),
        "contrast": params["contrast"][idx].astype(np.float32),
        "saturation": params["saturation"][idx].astype(np.float32),
        "hue": params["hue"][idx].astype(np.float32),
        "gray": params["gray"][idx] > 0,
        "blur_on": blur_on,
        "sigma": sigma,
        "window": np.array([blur_window(s) if on else 1 for s, on in zip(sigma, blur_on)], np.int32),
    }
    if spec.jitter_order == "random":
        order = params["jitter_order"][idx].astype(np.int32)
        feed.update({f"order{k}": np.ascontiguousarray(order[:, k]) for k in range(4)})
    if spec.p_solarize > 0:
        feed["solarize_on"] = params["solarize_on"][idx] > 0
    used = _view_inputs(spec)
    feed = {k: v for k, v in feed.items() if k in used}
    if spec.strong_ops:
        feed.update(strong_feed(params, idx))
    return feed
