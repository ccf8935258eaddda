"""The view stage: encoded bytes -> Views (images per view + the parameters that made them)."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np
import torch

from .params import Params, sample_views, select
from .recipe import Recipe

log = logging.getLogger(__name__)


class Executor(Protocol):
    recipe: Recipe
    skipped: int

    def __call__(self, encoded: Sequence[bytes], params: Sequence[Params]) -> tuple[list[torch.Tensor], np.ndarray]: ...

    def eval_transform(self, encoded: Sequence[bytes], size: int | None = None) -> tuple[torch.Tensor, np.ndarray]: ...


@dataclass
class Views:
    """images[v]: float32 [B', 3, S_v, S_v] (views may differ in size: multi-crop); params[v]: name ->
    tensor with B' rows;
    kept: indices (into the input batch) of the B' samples that decoded."""

    images: list[torch.Tensor]
    params: list[dict[str, torch.Tensor]]
    kept: np.ndarray


def dali_available() -> bool:
    try:
        import nvidia.dali  # noqa: F401
    except Exception:  # ImportError, or a broken native library
        return False
    return True


def make_executor(kind: str, recipe: Recipe, batch_size: int, device: str = "auto",
                  num_threads: int = 1, seed: int = 0) -> Executor:
    """kind: "dali" | "torch" | "auto" (DALI when importable, else torch)."""
    if kind not in ("dali", "torch", "auto"):
        raise ValueError(f"executor kind must be dali|torch|auto, got {kind!r}")
    if kind == "auto":
        kind = "dali" if dali_available() else "torch"
        log.info("view executor: %s (auto)", kind)
    if kind == "torch":
        from .torch_exec import TorchExecutor
        return TorchExecutor(recipe)
    from .dali_exec import DaliExecutor
    executor = DaliExecutor(recipe, batch_size, device=device, num_threads=num_threads, seed=seed)
    log.info("view executor: DALI on %s", executor.device)
    return executor


def params_to_tensors(params: Params, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(np.ascontiguousarray(v)).to(device) for k, v in params.items()}


def make_views(encoded: Sequence[bytes], recipe: Recipe, executor: Executor,
               rng: np.random.Generator) -> Views:
    """Sample every view's parameters, apply them, and keep params only for samples that made it."""
    params = sample_views(encoded, recipe, rng)
    images, kept = executor(encoded, params)
    device = images[0].device if images else "cpu"
    return Views(images=images, params=[params_to_tensors(select(p, kept), device) for p in params], kept=kept)
