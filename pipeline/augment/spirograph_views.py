"""Spirograph views: the sample's downstream factors x = (m, b, sigma, f_r), re-rendered with fresh
nuisance parameters alpha = (h, f_g, f_b, b_r, b_g, b_b) for every view (docs/methods/invclr.md §2.2, §3.3).

The sampler is `sample_nuisance`, the apply is the differentiable torch renderer; alpha travels with
each view as its parameters, which is what InvCLR's gradient penalty differentiates.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from pipeline.data.spirograph import TARGETS, render_flat, sample_nuisance


@dataclass
class SpirographRecipe:
    size: int = 32
    n_views: int = 2


def factors(json_rows: Sequence[bytes | str]) -> dict[str, torch.Tensor]:
    """The four downstream factors of each sample, from the shard's json member."""
    rows = [json.loads(r) for r in json_rows]
    return {t: torch.tensor([r[t] for r in rows], dtype=torch.float32) for t in TARGETS}


def render_views(
    x: dict[str, torch.Tensor], recipe: SpirographRecipe, generator: torch.Generator
) -> tuple[list[torch.Tensor], list[dict[str, torch.Tensor]]]:
    """n_views renders of the same factors, each with its own nuisance draw: (images, params) per view."""
    n = next(iter(x.values())).shape[0]
    images, params = [], []
    for _ in range(recipe.n_views):
        alpha = sample_nuisance(n, generator)
        images.append(render_flat({**x, **alpha}, recipe.size))
        params.append(alpha)
    return images, params


def generator_from(rng: np.random.Generator) -> torch.Generator:
    return torch.Generator().manual_seed(int(rng.integers(2**62)))
