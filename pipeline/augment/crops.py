"""The crop box law every sampler shares (torchvision RandomResizedCrop's): its own module, so params.py (the
per-view samplers) and joint.py (the joint ones) both import it and neither imports the other at load time."""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np


def sample_crop(
    h: int, w: int, scale: Sequence[float], ratio: Sequence[float], rng: np.random.Generator
) -> tuple[int, int, int, int]:
    """(y, x, ch, cw) of a crop box, following torchvision RandomResizedCrop's law.

    Up to 10 tries: area fraction uniform in `scale`, aspect ratio (w/h) log-uniform in `ratio`;
    accept the first box that fits, at a uniform position. Otherwise a central crop of the whole
    image, clamped to the ratio range.
    """
    area = h * w
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    for _ in range(10):
        target = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(log_lo, log_hi))
        cw = int(round(math.sqrt(target * aspect)))
        ch = int(round(math.sqrt(target / aspect)))
        if 0 < cw <= w and 0 < ch <= h:
            y = int(rng.integers(0, h - ch + 1))
            x = int(rng.integers(0, w - cw + 1))
            return y, x, ch, cw
    # Fallback: the largest central box whose aspect ratio lies in the range.
    aspect = w / h
    if aspect < ratio[0]:
        cw, ch = w, int(round(w / ratio[0]))
    elif aspect > ratio[1]:
        ch, cw = h, int(round(h * ratio[1]))
    else:
        ch, cw = h, w
    return (h - ch) // 2, (w - cw) // 2, ch, cw
