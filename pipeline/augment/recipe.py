"""Augmentation recipes: plain dataclasses holding the *laws* views are sampled from.

A recipe says nothing about how views are computed; samplers (params.py) read it to draw
per-sample parameters, executors (torch_exec.py, dali_exec.py) read it for the fixed settings
(output size, normalisation).
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Mapping


@dataclass
class TwoViewRecipe:
    """MoCo v2 / SimCLR-style view recipe (defaults = MoCo v2)."""

    size: int = 224
    scale: tuple[float, float] = (0.2, 1.0)  # crop area, fraction of the image
    ratio: tuple[float, float] = (3 / 4, 4 / 3)  # crop aspect ratio w/h
    jitter: tuple[float, float, float, float] = (0.4, 0.4, 0.4, 0.1)  # brightness, contrast, saturation, hue
    p_jitter: float = 0.8
    p_gray: float = 0.2
    blur_sigma: tuple[float, float] = (0.1, 2.0)
    p_blur: float = 0.5
    p_flip: float = 0.5
    mean: tuple[float, float, float] = (0.485, 0.456, 0.406)
    std: tuple[float, float, float] = (0.229, 0.224, 0.225)
    n_views: int = 2

    def __post_init__(self) -> None:
        # Configs arrive as lists (YAML / Hydra ListConfig); store tuples so recipes compare and hash.
        for name in ("scale", "ratio", "jitter", "blur_sigma", "mean", "std"):
            setattr(self, name, tuple(float(v) for v in getattr(self, name)))
        self.size, self.n_views = int(self.size), int(self.n_views)
        _check(len(self.scale) == 2 and 0 < self.scale[0] <= self.scale[1], f"bad scale {self.scale}")
        _check(len(self.ratio) == 2 and 0 < self.ratio[0] <= self.ratio[1], f"bad ratio {self.ratio}")
        _check(len(self.jitter) == 4 and min(self.jitter) >= 0, f"bad jitter {self.jitter}")
        _check(self.jitter[3] <= 0.5, f"hue jitter must be <= 0.5 turn, got {self.jitter[3]}")
        _check(len(self.blur_sigma) == 2 and 0 < self.blur_sigma[0] <= self.blur_sigma[1],
               f"bad blur_sigma {self.blur_sigma}")
        for name in ("p_jitter", "p_gray", "p_blur", "p_flip"):
            _check(0.0 <= getattr(self, name) <= 1.0, f"{name} must be in [0, 1]")
        _check(len(self.mean) == 3 and len(self.std) == 3 and min(self.std) > 0, "mean/std need 3 channels")
        _check(self.size > 0 and self.n_views > 0, "size and n_views must be positive")


def _check(ok: bool, msg: str) -> None:
    if not ok:
        raise ValueError(msg)


def recipe_from_dict(d: Mapping[str, Any]) -> TwoViewRecipe:
    """Build a recipe from a plain config mapping; unknown keys are an error (catches typos)."""
    known = {f.name for f in fields(TwoViewRecipe)}
    unknown = sorted(set(d) - known)
    if unknown:
        raise ValueError(f"unknown recipe keys {unknown}; known: {sorted(known)}")
    return TwoViewRecipe(**dict(d))
