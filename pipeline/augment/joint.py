"""Joint samplers for the two views of a positive pair: JointCrop / JointBlur / JointColor.

Spec: docs/methods/jointcrop.md (Zhang et al., AAAI 2025, "Enhancing Contrastive Learning Inspired by the
Philosophy of 'The Blind Men and the Elephant'", Alg. 1). The two views' parameters x1, x2 stay inside
[low, high], but they are no longer independent: the log-ratio r = log(x2/x1) is drawn first from JC(beta)
on [-s_b, s_b], s_b = log(high/low), and then x1 is drawn given r (section 1.2):

    JC(beta > 0): N(0, (s_b/beta)^2) truncated to [-s_b, s_b]
    JC(0):        U[-s_b, s_b]
    JC(beta < 0): x ~ JC(|beta|), then r = -s_b - x if x < 0 else s_b - x   (section 1.2 step 2: each half
                  of JC(|beta|) reflected about -s_b/2 resp. +s_b/2; mass moves to the extreme ratios)
    x1 | r ~ U[low * max(1, e^-r), high * min(1, e^-r)],  x2 = x1 * e^r

Choices where the spec is open (section numbers of docs/methods/jointcrop.md):
- s_b = log(high/low), the paper's value. The official code's log(high/low - 0.1) (section 1.2, section 6.1)
  is not used; at |r| = s_b the interval for x1 then shrinks to one point, which is harmless.
- The truncated normal is sampled exactly by rejection (section 6.1 leaves the method open): from a uniform
  proposal on [-s_b, s_b] when |beta| <= 1, from the untruncated normal otherwise (acceptance >= 0.68 both ways).
- x1 given r is uniform in the LINEAR domain, as Alg. 1 step 4 and the official code write it.
- beta None is the independent control: x1, x2 i.i.d. U[low, high] (what RandomResizedCrop / GaussianBlur /
  ColorJitter draw per view).
- JointCrop retries and fallback (sections 1.2, 6.3): the official code's rule. 10 tries per view with the area
  fixed, then the whole image. Optionally (fallback="fit") an area-keeping box instead; see sample_joint_crops.
- Gates (section 6.5): the apply/skip Bernoullis stay independent per view. The pair is drawn for every
  sample and a view whose gate is off takes the identity value; a joint value never forces an op on.
All randomness is numpy (params.py convention); the torch entry point seeds a numpy Generator from the
torch Generator, so both follow the one implementation below.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import torch

from .crops import sample_crop

CROP_TRIES = 10  # section 1.2 / 6.3: official code, per view, area kept fixed
MIN_COLOR_FACTOR = 1e-3  # lower bound of a joint colour factor when 1 - strength <= 0 (see joint_color_factors)


def _truncnorm(n: int, sigma: float, bound: float, rng: np.random.Generator) -> np.ndarray:
    """n draws of N(0, sigma^2) conditioned on [-bound, bound], exact (rejection)."""
    c = bound / sigma  # truncation point in standard deviations (= |beta| here)
    out = np.empty(n)
    filled = 0
    # Expected acceptance, only used to size the batches (the law does not depend on it).
    acc = math.erf(c / math.sqrt(2.0))
    if c <= 1.0:  # uniform proposal: acceptance = mean of exp(-x^2/2sigma^2) over [-b, b]
        acc = acc * math.sqrt(math.pi / 2.0) / c if c > 0 else 1.0  # c = 0: sigma overflowed to inf
    while filled < n:
        m = int((n - filled) / acc * 1.1) + 16
        if c <= 1.0:
            x = rng.uniform(-bound, bound, m)
            x = x[rng.random(m) < np.exp(-0.5 * (x / sigma) ** 2)]
        else:
            x = rng.normal(0.0, sigma, m)
            x = x[np.abs(x) <= bound]
        take = min(len(x), n - filled)
        out[filled : filled + take] = x[:take]
        filled += take
    return out


def sample_log_ratio(beta: float, s_b: float, n: int, rng: np.random.Generator) -> np.ndarray:
    """n draws of JC(beta) on [-s_b, s_b] (spec section 1.2 step 2), float64."""
    if s_b < 0 or not math.isfinite(s_b) or not math.isfinite(beta):
        raise ValueError(f"JC(beta) needs a finite beta and a finite s_b >= 0, got beta={beta}, s_b={s_b}")
    if s_b == 0.0:
        return np.zeros(n)
    if beta == 0.0:
        return rng.uniform(-s_b, s_b, n)
    x = _truncnorm(n, s_b / abs(beta), s_b, rng)
    if beta > 0:
        return x
    return np.where(x < 0, -s_b - x, s_b - x)


class JointSampler:
    """Pairs (x1, x2) in [low, high] with log(x2/x1) ~ JC(beta); beta None = independent uniform pairs."""

    def __init__(self, low: float, high: float, beta: float | None) -> None:
        low, high = float(low), float(high)
        if not (math.isfinite(low) and math.isfinite(high) and 0.0 < low <= high) or (
            beta is not None and not math.isfinite(float(beta))
        ):
            raise ValueError(
                f"JointSampler needs finite 0 < low <= high and a finite beta (or None), "
                f"got low={low}, high={high}, beta={beta}"
            )
        self.low, self.high = low, high
        self.beta = None if beta is None else float(beta)
        self.s_b = math.log(high / low)

    def __repr__(self) -> str:
        return f"JointSampler(low={self.low}, high={self.high}, beta={self.beta})"

    def sample_np(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """x1, x2: float64 arrays [n], both in [low, high]."""
        lo, hi = self.low, self.high
        if self.beta is None:
            return rng.uniform(lo, hi, n), rng.uniform(lo, hi, n)
        r = sample_log_ratio(self.beta, self.s_b, n, rng)
        inv = np.exp(-r)
        a = lo * np.maximum(1.0, inv)  # x1 >= low and x2 = x1 e^r >= low
        b = hi * np.minimum(1.0, inv)  # x1 <= high and x2 <= high
        # Uniform in the linear domain (Alg. 1 step 4, official code); clips only absorb rounding.
        x1 = np.clip(a + (b - a) * rng.random(n), lo, hi)
        x2 = np.clip(x1 * np.exp(r), lo, hi)
        return x1, x2

    def sample(self, n: int, generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Same law as sample_np, drawn from a torch Generator (one int64 draw seeds a numpy Generator).
        float64 tensors [n], so the bounds hold exactly."""
        seed = int(torch.randint(0, 2**63 - 1, (1,), generator=generator, dtype=torch.int64))
        x1, x2 = self.sample_np(n, np.random.default_rng(seed))
        return torch.from_numpy(x1), torch.from_numpy(x2)


def _boxes_for_areas(
    hs: np.ndarray, ws: np.ndarray, frac: np.ndarray, ratio: Sequence[float], fallback: str, rng: np.random.Generator
) -> np.ndarray:
    """(y, x, h, w) int32 [n, 4]: one crop per image with area fraction `frac`, kept fixed across tries.
    See sample_joint_crops for the retry and fallback rules."""
    n = len(frac)
    if n == 0:
        return np.zeros((0, 4), dtype=np.int32)
    area = frac * hs * ws
    log_r0, log_r1 = math.log(ratio[0]), math.log(ratio[1])
    aspect = np.exp(rng.uniform(log_r0, log_r1, (n, CROP_TRIES)))
    cw = np.rint(np.sqrt(area[:, None] * aspect)).astype(np.int64)  # rint = Python round (half to even)
    ch = np.rint(np.sqrt(area[:, None] / aspect)).astype(np.int64)
    fits = (cw > 0) & (cw <= ws[:, None]) & (ch > 0) & (ch <= hs[:, None])
    ok = fits.any(axis=1)
    rows = np.arange(n)
    first = fits.argmax(axis=1)
    ch, cw = ch[rows, first], cw[rows, first]
    if fallback == "image":
        ch, cw = np.where(ok, ch, hs), np.where(ok, cw, ws)
    else:  # "fit": keep the area; draw the aspect ratio log-uniformly from the part of `ratio` where the
        # box fits, i.e. ar in [A/H^2, W^2/A]; if that part is empty, use the feasible ratio nearest to `ratio`.
        # The draw is made for every row (fixed draw count) and used only where the tries all missed.
        with np.errstate(divide="ignore"):
            f_lo = np.log(np.maximum(area, 1e-300) / hs.astype(float) ** 2)
            f_hi = np.log(ws.astype(float) ** 2 / np.maximum(area, 1e-300))
        lo, hi = np.maximum(log_r0, f_lo), np.minimum(log_r1, f_hi)
        u = rng.random(n)
        log_ar = np.where(lo <= hi, lo + (hi - lo) * u, np.where(log_r1 < f_lo, f_lo, f_hi))
        ar = np.exp(log_ar)
        fw = np.clip(np.rint(np.sqrt(area * ar)), 1, ws).astype(np.int64)  # clip: rounding, tiny images
        fh = np.clip(np.rint(np.sqrt(area / ar)), 1, hs).astype(np.int64)
        ch, cw = np.where(ok, ch, fh), np.where(ok, cw, fw)
    y = rng.integers(0, hs - ch + 1)  # whole-image fallback: H - h = 0, so y = x = 0
    x = rng.integers(0, ws - cw + 1)
    return np.stack([y, x, ch, cw], axis=1).astype(np.int32)


def sample_joint_crops(
    sizes: Sequence[tuple[int, int]],
    scale: Sequence[float],
    ratio: Sequence[float],
    beta: float | None,
    rng: np.random.Generator,
    fallback: str = "image",
) -> tuple[np.ndarray, np.ndarray]:
    """JointCrop boxes for views 1 and 2: two int32 [n, 4] arrays of (y, x, h, w) in source pixels,
    for images of the given (height, width) sizes.

    beta not None (JointCrop, spec section 1.2): the area fractions s1, s2 are drawn once per image from
    JointSampler(scale[0], scale[1], beta). Then each view on its own makes up to 10 tries, following the
    official code (sections 1.2, 6.3):
    - each try redraws only the aspect ratio w/h, log-uniform on `ratio`. The area A = s_k*H*W stays fixed;
      it is NOT resampled, unlike torchvision.
    - w = round(sqrt(A*ar)), h = round(sqrt(A/ar)).
    - the first box with 0 < w <= W and 0 < h <= H is accepted and placed uniformly: y in [0, H-h],
      x in [0, W-w].
    If all 10 tries miss, that view falls back (the other view keeps its box):
    - fallback="image" (default; official code): the whole image (0, 0, H, W).
    - fallback="fit" (an option of this module, not in the paper or code): keep the area and draw the aspect
      log-uniformly from the part of `ratio` where the box fits. If no ratio in the range fits (a very
      elongated image), use the fitting aspect nearest to the range, so h = H or w = W. The box is then
      placed uniformly.
    Both fallbacks stay inside the image. Misses only happen when the area is too large for the image shape
    within `ratio`. On a 400x300 image with ratio (3/4, 4/3), that means s > 0.5625. They are NOT rare at
    the default scale: with scale (0.2, 1) and beta = 0, about 7% of the views fall back. "image" raises
    those views' area to 1 and changes the achieved ratio; "fit" keeps it. Rounding also moves the achieved
    ratio, by about 1/h + 1/w relative.

    beta None: the independent control. Each view is params.sample_crop, i.e. torchvision RandomResizedCrop:
    the area is redrawn on each of its 10 tries, and its fallback is the ratio-clamped central crop.
    `fallback` is ignored in this case.
    """
    if fallback not in ("image", "fit"):
        raise ValueError(f"fallback must be 'image' or 'fit', got {fallback!r}")
    hs = np.array([s[0] for s in sizes], dtype=np.int64).reshape(-1)
    ws = np.array([s[1] for s in sizes], dtype=np.int64).reshape(-1)
    n = len(hs)
    if beta is None:
        v1, v2 = (
            np.array([sample_crop(int(h), int(w), scale, ratio, rng) for h, w in zip(hs, ws)], dtype=np.int32).reshape(
                n, 4
            )
            for _ in range(2)
        )
        return v1, v2
    s1, s2 = JointSampler(scale[0], scale[1], beta).sample_np(n, rng)
    return (_boxes_for_areas(hs, ws, s1, ratio, fallback, rng), _boxes_for_areas(hs, ws, s2, ratio, fallback, rng))


def joint_factor_pair(
    low: float,
    high: float,
    beta: float | None,
    on1: np.ndarray,
    on2: np.ndarray,
    rng: np.random.Generator,
    off: float = 0.0,
) -> tuple[np.ndarray, np.ndarray]:
    """Values of views 1 and 2 for a gated per-view op: float32 [n] each, n = len(on1).

    The pair comes from JointSampler(low, high, beta) for every sample. A view whose gate is off gets `off`
    (its identity value). The gates are the caller's independent per-view Bernoulli draws (section 6.5);
    they are not tied together. So when only one view is on, its value has the marginal law of the joint
    pair, and the pair is never redrawn based on the gates.
    """
    on1, on2 = np.asarray(on1), np.asarray(on2)
    if on1.shape != on2.shape or on1.ndim != 1:
        raise ValueError(f"gates must be two 1-d arrays of one length, got {on1.shape} and {on2.shape}")
    x1, x2 = JointSampler(low, high, beta).sample_np(len(on1), rng)
    return (np.where(on1 > 0, x1, off).astype(np.float32), np.where(on2 > 0, x2, off).astype(np.float32))


def joint_blur_sigmas(
    sigma: Sequence[float], beta: float | None, on1: np.ndarray, on2: np.ndarray, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """JointBlur (section 1.3): sigma_1, sigma_2 on [sigma[0], sigma[1]] (default 0.1, 2.0), with
    log(sigma_2/sigma_1) ~ JC(beta). A view whose blur gate is off gets sigma 0 (params.py: 0 = off)."""
    return joint_factor_pair(sigma[0], sigma[1], beta, on1, on2, rng, off=0.0)


def joint_color_factors(
    strength: float,
    beta: float | None,
    on1: np.ndarray,
    on2: np.ndarray,
    rng: np.random.Generator,
    min_factor: float = MIN_COLOR_FACTOR,
) -> tuple[np.ndarray, np.ndarray]:
    """JointColor (section 1.4): a brightness or contrast factor for each view on
    [max(0, 1 - strength), 1 + strength], with log(f2/f1) ~ JC(beta). A view whose jitter gate is off gets
    1 (identity).

    The log-ratio law needs a positive lower bound. When strength >= 1, ColorJitter's interval starts at 0,
    so the lower bound is clipped to `min_factor` (default 1e-3, the same value params.apply_joint uses).
    Note that s_b = log((1 + strength)/min_factor) then depends on that choice (log 2000 ~ 7.6 at strength 1).
    strength 0 gives factor 1 for every view.
    """
    if not strength >= 0:
        raise ValueError(f"colour strength must be >= 0, got {strength}")
    low = max(float(min_factor), 1.0 - strength)
    return joint_factor_pair(low, 1.0 + strength, beta, on1, on2, rng, off=1.0)
