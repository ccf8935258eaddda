"""The executors: which one `augment.executor` names (auto: `auto_kind`), making it (`make_executor`), and running
one over a batch (`make_views`: encoded bytes -> Views, the images per view + the parameters that made them).
view_makers.py builds on this for each recipe family."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np
import torch

from .params import Params, header_sizes, sample_views, select
from .recipe import Recipe

log = logging.getLogger(__name__)


class Executor(Protocol):
    recipe: Recipe
    skipped: int

    def __call__(
        self, encoded: Sequence[bytes], params: Sequence[Params], sizes: Sequence[tuple[int, int]] | None = None
    ) -> tuple[list[torch.Tensor], np.ndarray]: ...

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


def cuda_usable_by_dali() -> bool:
    """DALI importable and able to see a CUDA device (its mixed GPU pipeline can run)."""
    if not (dali_available() and torch.cuda.is_available()):
        return False
    from .dali_exec import _cuda_usable

    return _cuda_usable()


EXECUTOR_KINDS = ("auto", "dali", "torch", "batched")


def _batched_device(device: str, torch_device: torch.device | str | None) -> torch.device:
    """Where the batched executor runs: the CPU when augment.device=cpu asks for it, else `torch_device` (the
    training worker's) when given, else CUDA when available, else the CPU."""
    if device not in ("auto", "cpu", "gpu"):
        raise ValueError(f"device must be auto|cpu|gpu, got {device!r}")
    if device == "cpu":
        return torch.device("cpu")
    if torch_device is not None:
        where = torch.device(torch_device)
    else:
        where = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "gpu" and where.type != "cuda":
        raise ValueError(
            f"augment.device=gpu but the batched executor would run on {where}: CUDA is not available "
            "or the worker's device is not a GPU"
        )
    return where


# Where executor=auto runs the batched executor on a CPU: views of at most this many pixels a side. Past it the
# batched colour passes, each over the whole batch, cost a memory-bound CPU more than the per-sample torch
# executor's subsets (benchmarks/views_cpu.py on this 2-core EPYC: 2.9x at 32 px, 1.2x at 64, 0.98x at 96, 0.27x at
# 224; docs/performance.md).
CPU_BATCHED_MAX_SIZE = 96


def auto_kind(recipe: Recipe, device: str = "auto", torch_device: torch.device | str | None = None) -> str:
    """What executor=auto resolves to. On a GPU: the batched executor, the one executor measured there
    (docs/gpu.md); DALI's GPU pipeline has never run on one, so it stays a choice (executor=dali) rather than
    every GPU user's default. On a CPU: the batched executor for views up to CPU_BATCHED_MAX_SIZE px (every CPU
    run this project ships), the torch executor above it. Both make the same views to float rounding."""
    if _batched_device(device, torch_device).type != "cpu" or max(recipe.sizes) <= CPU_BATCHED_MAX_SIZE:
        return "batched"
    return "torch"


def make_executor(
    kind: str,
    recipe: Recipe,
    batch_size: int,
    device: str = "auto",
    num_threads: int = 1,
    seed: int = 0,
    torch_device: torch.device | str | None = None,
    fuse: bool = False,
) -> Executor:
    """kind: "dali" | "torch" | "batched" | "auto" (see auto_kind). `device` is augment.device (auto | cpu | gpu:
    DALI's backend); `torch_device` is where the batched executor runs and puts its views (None: CUDA when
    available, else the CPU; augment.device=cpu means the CPU whatever `torch_device` says). fuse: augment.fuse,
    the batched executor's photometric stage compiled (fused.py); another executor has no such stage."""
    if kind == "gpu":
        raise ValueError("augment.executor=gpu is now called batched (the batched torch executor, on any device)")
    if kind not in EXECUTOR_KINDS:
        raise ValueError(f"executor kind must be one of {'|'.join(EXECUTOR_KINDS)}, got {kind!r}")
    if kind == "auto":
        kind = auto_kind(recipe, device, torch_device)
        log.info("view executor: %s (auto)", kind)
        if fuse and kind != "batched":  # auto's choice stands: the torch executor is faster there even so
            log.warning("augment.fuse=true has no effect: executor=auto picked the %s executor here", kind)
            fuse = False
    if fuse and kind != "batched":
        raise ValueError(f"augment.fuse=true compiles the batched executor's photometric stage; {kind} has none")
    if kind == "torch":
        from .torch_exec import TorchExecutor

        return TorchExecutor(recipe)
    if kind == "batched":
        from .batched import BatchedExecutor

        executor = BatchedExecutor(recipe, _batched_device(device, torch_device), fuse=fuse, batch_size=batch_size)
        log.info("view executor: batched on %s%s", executor.device, ", fused" if fuse else "")
        return executor

    from .dali_exec import DaliExecutor

    dali = DaliExecutor(recipe, batch_size, device=device, num_threads=num_threads, seed=seed)
    log.info("view executor: DALI on %s", dali.device)
    return dali


def params_to_tensors(params: Params, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(np.ascontiguousarray(v)).to(device) for k, v in params.items()}


def make_views(encoded: Sequence[bytes], recipe: Recipe, executor: Executor, rng: np.random.Generator) -> Views:
    """Sample every view's parameters, apply them, and keep params only for samples that made it. The headers
    are read once, here: the sampler and the executor's validity check share the sizes."""
    sizes = header_sizes(encoded)
    params = sample_views(encoded, recipe, rng, sizes)
    images, kept = executor(encoded, params, sizes)
    device = images[0].device if images else "cpu"
    return Views(images=images, params=[params_to_tensors(select(p, kept), device) for p in params], kept=kept)
