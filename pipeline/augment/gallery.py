"""The gallery: a PNG grid of views annotated with the parameters that made them.

One row per source image: the image itself, then every view of the recipe, each titled with its view
name and a few lines of its parameters (crop box, flip, jitter factors, blur sigma, solarize, strong
ops with magnitudes, Spirograph nuisance values). Views whose colour stage belongs to the method
(InvCLR) are shown after that stage, as the encoder sees them.
"""

from __future__ import annotations

from itertools import islice
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from pipeline.augment import colour
from pipeline.augment.executors import Views
from pipeline.augment.strong import AFFINE_OPS, NO_MAG_OPS, OPS
from pipeline.augment.torch_exec import decode_rgb
from pipeline.augment.view_makers import build_view_maker, eval_settings, image_recipe
from pipeline.data.manifest import read_manifest
from pipeline.data.reader import image_key, iter_samples

_JITTER_NAMES = ("b", "c", "s", "h")
FONT_PT = 9  # the smallest text in the grid


def _magnitude(op: str, m: float) -> str:
    """An op's magnitude as a person reads it: 2 decimals at most, signed for the signed (affine) ops, integers
    for Solarize's threshold and Posterize's bits, nothing for the on/off ops."""
    if op in NO_MAG_OPS:
        return ""
    if op in ("Solarize", "Posterize"):
        return f" {m:.0f}"
    text = f"{m:+.2f}" if op in AFFINE_OPS else f"{m:.2f}"
    return " " + (text.rstrip("0").rstrip(".") if "." in text else text)


def display_images(views: Views, aug: Mapping[str, Any]) -> list[torch.Tensor]:
    """Each view's images as float [B, 3, H, W] in [0, 1] (undoing the normalisation)."""
    _, mean, std = eval_settings(aug)
    specs = image_recipe(aug).views if aug.get("kind", "views") == "views" else [None] * len(views.images)
    out = []
    for img, p, spec in zip(views.images, views.params, specs):
        img = img.detach().float().cpu()
        if spec is not None and spec.color_stage == "model":
            out.append(colour.colour_distort(img, {k: v.cpu() for k, v in p.items()}, spec.hue_mode).clamp(0, 1))
            continue
        m = torch.tensor(mean).view(1, 3, 1, 1)
        s = torch.tensor(std).view(1, 3, 1, 1)
        out.append((img * s + m).clamp(0, 1))
    return out


def describe(p: Mapping[str, np.ndarray], i: int, pool: Sequence[str] | None = None) -> str:
    """Short multi-line text of sample i's parameters in one view."""
    v = {k: np.asarray(t)[i] for k, t in p.items()}
    lines = []
    if "crop" in v:
        y, x, h, w = (int(a) for a in v["crop"])
        lines.append(f"crop {h}x{w}@({y},{x})" + (" flip" if v.get("flip") else ""))
    if v.get("jitter_on"):
        f = [float(v[k]) for k in ("brightness", "contrast", "saturation", "hue")]
        order = v.get("jitter_order")
        names = [_JITTER_NAMES[k] for k in order] if order is not None else list(_JITTER_NAMES)
        lines.append(" ".join(f"{n}{f[_JITTER_NAMES.index(n)]:.2f}" for n in names))
    extra = []
    if v.get("gray"):
        extra.append("gray")
    if v.get("blur_on") and float(v.get("sigma", 0)) > 0:
        extra.append(f"blur {float(v['sigma']):.2f}")
    if v.get("solarize_on"):
        extra.append("solarize")
    if extra:
        lines.append(" ".join(extra))
    if "strong_op" in v:
        ops = [
            f"{OPS[int(o)]}{_magnitude(OPS[int(o)], float(m))}"
            for o, on, m in zip(v["strong_op"], v["strong_on"], v["strong_mag"])
            if on
        ]
        lines.extend(ops)  # one op a line: full names stay within the column
        if not ops:
            lines.append("strong: none applied")
    spiro = [k for k in ("h", "f_g", "f_b", "b_r", "b_g", "b_b") if k in v]  # Spirograph nuisance alpha
    for k in range(0, len(spiro), 3):
        lines.append(" ".join(f"{n}={float(v[n]):.2f}" for n in spiro[k : k + 3]))
    return "\n".join(lines)


def gallery_figure(
    originals: Sequence[torch.Tensor], views: Views, aug: Mapping[str, Any], view_names: Sequence[str], title: str = ""
):
    """A matplotlib figure: row = source image (originals[i] float [3, h, w] in [0, 1]), columns = views."""
    import matplotlib  # matplotlib: its Agg backend chosen when a figure is drawn, not when this module loads

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = display_images(views, aug)
    params = [{k: t.cpu().numpy() for k, t in p.items()} for p in views.params]
    rows, cols = len(views.kept), 1 + len(shown)
    titles = [
        [f"{view_names[c]} {img.shape[-1]}px\n{describe(p, r)}" for c, (img, p) in enumerate(zip(shown, params))]
        for r in range(rows)
    ]
    # Sized for its text: 9 pt titles (legible at the PNG's own size), each row as tall as its longest title.
    lines = max((t.count("\n") + 1 for row in titles for t in row), default=1)
    fig, axes = plt.subplots(rows, cols, figsize=(2.6 * cols, (2.4 + 0.22 * lines) * rows), squeeze=False)
    for r, src in enumerate(views.kept):
        axes[r, 0].imshow(originals[src].permute(1, 2, 0).numpy())
        axes[r, 0].set_title(f"source #{src}", fontsize=FONT_PT)
        for c, img in enumerate(shown):
            ax = axes[r, c + 1]
            ax.imshow(img[r].permute(1, 2, 0).numpy(), interpolation="nearest")
            ax.set_title(titles[r][c], fontsize=FONT_PT)
    for ax in axes.flat:
        ax.set_xticks([])
        ax.set_yticks([])
    if title:
        fig.suptitle(title, fontsize=FONT_PT + 2)
    fig.tight_layout()
    return fig


def sample_batch(root: str, n: int, scan: int = 32) -> dict[str, np.ndarray]:
    """n samples of a shard set as a raw batch (the columns Ray Data would hand the loop): taken in turn from up to
    n shards spread over the set, each time a sample of a class (`cls`) not shown yet where its shard has one
    among its first `scan` samples. The first shard alone is often a single class."""
    _, uris = read_manifest(root)
    picked = sorted(set(np.linspace(0, len(uris) - 1, min(n, len(uris))).round().astype(int).tolist()))
    pools = [list(islice(iter_samples([uris[i]]), scan)) for i in picked]
    rows: list[dict[str, Any]] = []
    classes: set[Any] = set()
    while len(rows) < n and any(pools):
        for pool in pools:
            if pool and len(rows) < n:
                j = next((j for j, smp in enumerate(pool) if smp.get("cls") not in classes), 0)
                rows.append(pool.pop(j))
                classes.add(rows[-1].get("cls"))
    cols = [k for k in rows[0] if not k.startswith("__")]
    return {k: np.array([r.get(k) for r in rows], dtype=object) for k in cols}


def write_gallery(cfg: Mapping[str, Any], path: str, n_images: int = 4, seed: int = 0) -> dict:
    """Views of the first n_images of data.train under cfg's recipe (executor as configured), as a PNG.
    Returns {"path", "n_images", "n_views", "skipped"}."""
    aug = cfg["augment"]
    batch = sample_batch(cfg["data"]["train"], n_images)
    # one batch: a compile would cost more than the views (augment.fuse is for training)
    maker = build_view_maker({**aug, "fuse": False}, batch_size=n_images, num_threads=1, seed=seed)
    views = maker(batch, np.random.default_rng(seed))
    originals = []
    for e in batch[image_key(batch)]:
        try:
            originals.append(decode_rgb(e).float() / 255.0)
        except RuntimeError:  # an undecodable sample: the executor dropped it too
            originals.append(torch.zeros(3, 8, 8))
    if aug.get("kind", "views") == "views":
        names = [spec.name for spec in image_recipe(aug).views]
    else:
        names = [f"view{v}" for v in range(len(views.images))]
    executor = getattr(maker, "executor", None)
    ran_on = {"DaliExecutor": "DALI", "TorchExecutor": "torch", "BatchedExecutor": "batched"}.get(
        type(executor).__name__, "torch renderer"
    )
    title = f"augment={aug.get('name', '?')} data={cfg['data']['name']}  executor={ran_on}"
    fig = gallery_figure(originals, views, aug, names, title=title)
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt  # matplotlib: see gallery_figure

    plt.close(fig)
    return {"path": path, "n_images": len(views.kept), "n_views": len(views.images), "skipped": maker.skipped}
