"""Spirograph images (App. E of the invariance spec), rendered differentiably in torch.

Generative process for one image with parameters (m, b, h, sigma, fg, bg):

    curve (hypotrochoid), t_i = linspace(0, 2*pi, 40):
        x_i = (m - h) cos(t_i) + h cos((m - h) t_i / b)
        y_i = (m - h) sin(t_i) - h sin((m - h) t_i / b)

    intensity on the grid u, v in linspace(-6, 6, size) (rows <-> u <-> x, columns <-> v <-> y):
        i(u, v) = (1/40) sum_i exp((-(u - x_i)^2 - (v - y_i)^2) / sigma)      (divisor sigma, not sigma^2)
        i <- i / (max_{u,v} i + 1e-8)                                            (per image)

    colour:
        c(u, v) = i(u, v) * fg + (1 - i(u, v)) * bg                              (fg, bg in R^3)

Targets x = (m, b, sigma, f_r); nuisance alpha = (h, f_g, f_b, b_r, b_g, b_b).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

TARGETS = ("m", "b", "sigma", "f_r")
NUISANCE = ("h", "f_g", "f_b", "b_r", "b_g", "b_b")
PARAM_NAMES = TARGETS + NUISANCE
RANGES: dict[str, tuple[float, float]] = {
    "m": (2.0, 5.0),
    "b": (0.1, 1.1),
    "sigma": (0.25, 1.0),
    "f_r": (0.4, 1.0),
    "h": (0.5, 2.5),
    "f_g": (0.4, 1.0),
    "f_b": (0.4, 1.0),
    "b_r": (0.0, 0.6),
    "b_g": (0.0, 0.6),
    "b_b": (0.0, 0.6),
}

N_POINTS = 40
GRID_LIMIT = 6.0


def _sample_uniform(names: tuple[str, ...], n: int, generator: torch.Generator | None) -> dict[str, Tensor]:
    # One draw per name in a fixed order, so a seeded generator gives reproducible parameters.
    out = {}
    for name in names:
        low, high = RANGES[name]
        out[name] = torch.rand(n, generator=generator, dtype=torch.float32) * (high - low) + low
    return out


def sample_params(n: int, generator: torch.Generator | None = None) -> dict[str, Tensor]:
    """Draw all ten parameters, each a float32 tensor [n] uniform in RANGES."""
    return _sample_uniform(PARAM_NAMES, n, generator)


def sample_nuisance(n: int, generator: torch.Generator | None = None) -> dict[str, Tensor]:
    """Draw only the six nuisance parameters (alpha), each a float32 tensor [n]."""
    return _sample_uniform(NUISANCE, n, generator)


def to_render_params(flat: dict[str, Tensor]) -> dict[str, Tensor]:
    """Flat names -> render form: m, b, h, sigma as [N]; fg, bg as [N, 3]."""
    return {
        "m": flat["m"],
        "b": flat["b"],
        "h": flat["h"],
        "sigma": flat["sigma"],
        "fg": torch.stack([flat["f_r"], flat["f_g"], flat["f_b"]], dim=-1),
        "bg": torch.stack([flat["b_r"], flat["b_g"], flat["b_b"]], dim=-1),
    }


def curve_points(m: Tensor, b: Tensor, h: Tensor) -> tuple[Tensor, Tensor]:
    """The 40 hypotrochoid points per image: (x, y), each [N, 40]."""
    t = torch.linspace(0.0, 2.0 * math.pi, N_POINTS, dtype=m.dtype, device=m.device)
    r = (m - h)[:, None]
    inner = r * t / b[:, None]
    x = r * torch.cos(t) + h[:, None] * torch.cos(inner)
    y = r * torch.sin(t) - h[:, None] * torch.sin(inner)
    return x, y


def render(params: dict[str, Tensor], size: int = 32) -> Tensor:
    """Render images [N, 3, size, size] in [0, 1]; see the module docstring for the equations.

    params: m, b, h, sigma as [N] tensors; fg, bg as [N, 3]. Differentiable in all of them. Runs in the
    parameters' precision even inside a bf16 autocast step (InvCLR re-renders views there): a bf16 einsum would
    coarsen the image and the gradient the penalty takes through it.
    """
    with torch.autocast(device_type=params["m"].device.type, enabled=False):
        return _render(params, size)


def _render(params: dict[str, Tensor], size: int) -> Tensor:
    m, b, h, sigma = params["m"], params["b"], params["h"], params["sigma"]
    x, y = curve_points(m, b, h)
    grid = torch.linspace(-GRID_LIMIT, GRID_LIMIT, size, dtype=m.dtype, device=m.device)
    s = sigma[:, None, None]
    # The Gaussian factorises over the two axes, so the [N, size, size, 40] tensor is never built:
    # i[n, u, v] = mean_k ex[n, u, k] * ey[n, v, k].
    ex = torch.exp(-((grid[None, :, None] - x[:, None, :]) ** 2) / s)
    ey = torch.exp(-((grid[None, :, None] - y[:, None, :]) ** 2) / s)
    intensity = torch.einsum("nuk,nvk->nuv", ex, ey) / N_POINTS
    peak = intensity.amax(dim=(1, 2), keepdim=True)
    intensity = (intensity / (peak + 1e-8))[:, None]
    fg = params["fg"][:, :, None, None]
    bg = params["bg"][:, :, None, None]
    return intensity * fg + (1.0 - intensity) * bg


def render_flat(flat: dict[str, Tensor], size: int = 32) -> Tensor:
    """render() for the flat ten-name parameter dict."""
    return render(to_render_params(flat), size=size)
