"""From a raw batch of shard columns to Views, whichever recipe the config names.

`augment.kind` picks the recipe family: `views` (image ops through the DALI, batched or torch executor) or
`spirograph` (re-rendering the sample's factors with fresh nuisance parameters).
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import torch

from pipeline.augment.executors import Views, make_executor, make_views

# image_recipe lives beside the recipe (no torch there), so the config check imports no torch; kept here too
from pipeline.augment.recipe import EXECUTION_KEYS, image_recipe, recipe_from_dict  # noqa: F401
from pipeline.augment.spirograph_views import SpirographRecipe, factors, generator_from, render_views
from pipeline.data.reader import image_key


def eval_settings(aug: Mapping[str, Any]) -> tuple[int, list[float], list[float]]:
    """(size, mean, std) of the un-augmented evaluation view (kNN monitor, linear probe, model signature):
    the first view's size for image recipes."""
    if aug.get("kind", "views") == "views":
        r = image_recipe(aug)
        return r.size, list(r.mean), list(r.std)
    return int(aug["size"]), list(aug["mean"]), list(aug["std"])


class ImageViewMaker:
    def __init__(
        self,
        aug: Mapping[str, Any],
        batch_size: int,
        num_threads: int,
        seed: int,
        device: torch.device | str | None = None,
    ):
        self.recipe = image_recipe(aug)
        self.executor = make_executor(
            aug["executor"],
            self.recipe,
            batch_size,
            device=aug["device"],
            num_threads=num_threads,
            seed=seed,
            torch_device=device,
            fuse=bool(aug.get("fuse", False)),
        )

    @property
    def skipped(self) -> int:
        return self.executor.skipped

    def __call__(self, batch: Mapping[str, np.ndarray], rng: np.random.Generator) -> Views:
        views = make_views(list(batch[image_key(batch)]), self.recipe, self.executor, rng)
        if "cls" in batch:  # class labels travel with every view (SupCon, CoCor's labelled loss)
            labels = torch.as_tensor(class_labels(batch["cls"])[views.kept])
            views.params = [{**p, "label": labels} for p in views.params]
        return views


def class_labels(column) -> np.ndarray:
    """A shard's `cls` column as int64: raw bytes (b"3") when Ray reads with decoder=None, ints otherwise."""
    return np.array(
        [int(v.decode() if isinstance(v, (bytes, bytearray, np.bytes_)) else v) for v in column], dtype=np.int64
    )


class SpirographViewMaker:
    skipped = 0  # rendering from parameters cannot meet a corrupt image

    def __init__(self, aug: Mapping[str, Any]):
        self.recipe = SpirographRecipe(size=int(aug["size"]), n_views=int(aug.get("n_views", 2)))

    def __call__(self, batch: Mapping[str, np.ndarray], rng: np.random.Generator) -> Views:
        x = factors(list(batch["json"]))
        images, params = render_views(x, self.recipe, generator_from(rng))
        # each view's parameters: its nuisance alpha plus the sample's factors (InvCLR re-renders from both)
        return Views(images=images, params=[{**x, **p} for p in params], kept=np.arange(images[0].shape[0]))


def build_view_maker(
    aug: Mapping[str, Any],
    batch_size: int,
    num_threads: int = 1,
    seed: int = 0,
    device: torch.device | str | None = None,
):
    """`device`: the training worker's torch device; the batched executor (executor=auto's choice) makes
    the views there. None: CUDA when available, else the CPU."""
    kind = aug.get("kind", "views")
    if kind == "views":
        return ImageViewMaker(aug, batch_size, num_threads, seed, device)
    if kind == "spirograph":
        return SpirographViewMaker(aug)
    raise ValueError(f"unknown augment.kind {kind!r}; choose views or spirograph")
