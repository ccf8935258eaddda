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


def ddp_options() -> dict:
    """DistributedDataParallel's arguments: no buffer sync inside forward. Several methods run the online encoder
    more than once before backward (symmetric MoCo, BYOL, DINO's crops, CLSA, CoCor); on torch 2.11 DDP's sync at
    the second forward rewrites BatchNorm's running statistics in place, which the first forward saved for
    backward, and backward fails ("modified by an inplace operation"). sync_buffers_ does it once a step instead.
    torch >= 2.14 names the option forward_sync_buffers and deprecates broadcast_buffers."""
    import inspect

    from torch.nn.parallel import DistributedDataParallel

    accepted = inspect.signature(DistributedDataParallel.__init__).parameters
    return {"forward_sync_buffers": False} if "forward_sync_buffers" in accepted else {"broadcast_buffers": False}


@torch.no_grad()
def sync_buffers_(module: torch.nn.Module, src: int = 0) -> None:
    """Every rank's buffers (BatchNorm's running statistics) set to rank `src`'s, in one broadcast per dtype: what
    DDP did at each forward, done once before a step's first forward (running statistics only matter in eval
    mode, on rank 0's checkpoints and monitors, so once a step keeps every rank on rank 0's trajectory)."""
    if not is_dist():
        return
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for b in module.buffers():
        by_dtype.setdefault(b.dtype, []).append(b)
    for tensors in by_dtype.values():
        flat = torch.cat([t.reshape(-1) for t in tensors])
        dist.broadcast(flat, src)
        offset = 0
        for t in tensors:
            t.copy_(flat[offset : offset + t.numel()].view_as(t))
            offset += t.numel()
