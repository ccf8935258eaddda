"""Collectives that are correct on 1 process and on N (gloo on CPU, nccl on GPU)."""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_fn


def is_dist() -> bool:
    return dist.is_available() and dist.is_initialized()


def world_size() -> int:
    return dist.get_world_size() if is_dist() else 1


def rank() -> int:
    return dist.get_rank() if is_dist() else 0


def gather_objects(obj) -> list:
    """Every rank's picklable `obj`, in rank order ([obj] on one process)."""
    if not is_dist():
        return [obj]
    out: list = [None] * world_size()
    dist.all_gather_object(out, obj)
    return out


@torch.no_grad()
def gather_nograd(x: torch.Tensor) -> torch.Tensor:
    """Concatenate `x` from every rank along dim 0 (rank order); no gradient flows back."""
    if not is_dist():
        return x
    out = [torch.empty_like(x) for _ in range(world_size())]
    dist.all_gather(out, x.contiguous())
    return torch.cat(out)


def gather_grad(x: torch.Tensor) -> torch.Tensor:
    """Concatenate `x` from every rank; the backward pass sends each rank the gradient of its own slice
    summed over all ranks' losses, so DDP's gradient averaging yields the gradient of the mean loss."""
    if not is_dist():
        return x
    # torch 2.14 deprecates this autograd gather in favour of a private module (_functional_collectives); the
    # public one still works, and its warning is not the user's to act on.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*all_gather is deprecated", category=FutureWarning)
        return torch.cat(dist_fn.all_gather(x.contiguous()))


@torch.no_grad()
def broadcast_(x: torch.Tensor, src: int = 0) -> torch.Tensor:
    if is_dist():
        dist.broadcast(x, src)
    return x


_OPS = {"sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX} if dist.is_available() else {}


def reduce_scalar(x: float, op: str = "sum", device: torch.device | str = "cpu") -> float:
    """`x` reduced over ranks (sum, min or max). The tensor handed to the collective is made on `device`, the
    worker's own: nccl takes only CUDA tensors, gloo CPU ones."""
    t = torch.tensor(float(x), dtype=torch.float64, device=device)
    if is_dist():
        dist.all_reduce(t, op=_OPS[op])
    return float(t)


@torch.no_grad()
def average_(tensors: list[torch.Tensor]) -> None:
    """Average tensors (all on one device) over ranks in place, in one flat all_reduce instead of one per tensor."""
    if not is_dist() or not tensors:
        return
    flat = torch.cat([t.reshape(-1) for t in tensors])
    dist.all_reduce(flat)
    flat /= world_size()
    offset = 0
    for t in tensors:
        t.copy_(flat[offset : offset + t.numel()].view_as(t))
        offset += t.numel()
