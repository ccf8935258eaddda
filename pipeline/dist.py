"""Collectives that are correct on 1 process and on N (gloo on CPU, nccl on GPU), and the bytes they move.

Counting (`count_bytes(True)`, trainer.count_bytes): each collective adds what this rank sends and receives over the
wire under the ring algorithms NCCL uses for large messages, the formulas benchmarks/scale_model.py models:
all-gather of a c-byte chunk (N - 1) c each way; all-reduce of B bytes 2 (N - 1) / N B each way (DDP's gradient
buckets too, through its comm hook); broadcast B received by every rank but the source, sent by every rank but the
last of the chain; all-to-all exactly what goes to and comes from other ranks. Pickled objects (gather_objects: once
a run, not a step) are not counted.
"""

from __future__ import annotations

import contextlib
import warnings
from collections import Counter

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_fn


def is_dist() -> bool:
    return dist.is_available() and dist.is_initialized()


def world_size() -> int:
    return dist.get_world_size() if is_dist() else 1


def rank() -> int:
    return dist.get_rank() if is_dist() else 0


class Traffic:
    """Bytes sent and received per collective (op name -> bytes) since the last `take_traffic`."""

    def __init__(self) -> None:
        self.sent: Counter[str] = Counter()
        self.received: Counter[str] = Counter()


_traffic: Traffic | None = None
COUNTED_OPS = ("all_gather", "all_gather_grad", "all_reduce", "broadcast", "all_to_all", "grad_all_reduce")


def count_bytes(on: bool = True) -> None:
    """Start (or stop) counting the bytes every collective of this process moves."""
    global _traffic
    _traffic = Traffic() if on else None


def take_traffic() -> Traffic:
    """What was counted since the last call (empty when counting is off), and a fresh count from here."""
    global _traffic
    taken = _traffic or Traffic()
    if _traffic is not None:
        _traffic = Traffic()
    return taken


@contextlib.contextmanager
def uncounted():
    """Collectives inside are not counted (a report's own reductions)."""
    global _traffic
    held, _traffic = _traffic, None
    try:
        yield
    finally:
        _traffic = held


def _count(op: str, sent: float, received: float) -> None:
    if _traffic is not None:
        _traffic.sent[op] += int(sent)
        _traffic.received[op] += int(received)


def nbytes(x: torch.Tensor) -> int:
    return x.numel() * x.element_size()


def allreduce_bytes(b: float, n: int) -> float:
    """Bytes each rank sends (and receives) in a ring all-reduce of b bytes over n ranks."""
    return 2 * (n - 1) / n * b


# ----------------------------------------------------------------------------- where each rank runs
_node_rank = 0
_nodes: list[int] | None = None


def set_node_rank(node: int) -> None:
    """This process's node (Ray Train's node rank); `node_ranks` gathers them at its first call."""
    global _node_rank, _nodes
    _node_rank, _nodes = int(node), None


def node_ranks() -> list[int]:
    """The node of every rank, in rank order ([this node] on one process); gathered once, then cached."""
    global _nodes
    if _nodes is None or len(_nodes) != world_size():
        _nodes = [int(n) for n in gather_objects(_node_rank)]
    return _nodes


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
    n = world_size()
    _count("all_gather", (n - 1) * nbytes(x), (n - 1) * nbytes(x))
    return torch.cat(out)


def gather_grad(x: torch.Tensor) -> torch.Tensor:
    """Concatenate `x` from every rank; the backward pass sends each rank the gradient of its own slice
    summed over all ranks' losses, so DDP's gradient averaging yields the gradient of the mean loss."""
    if not is_dist():
        return x
    # torch 2.14 deprecates this autograd gather in favour of a private module (_functional_collectives); the
    # public one still works, and its warning is not the user's to act on.
    n = world_size()
    # its backward is a reduce-scatter of the same size: counted here, with the forward
    _count("all_gather_grad", 2 * (n - 1) * nbytes(x), 2 * (n - 1) * nbytes(x))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*all_gather is deprecated", category=FutureWarning)
        return torch.cat(dist_fn.all_gather(x.contiguous()))


@torch.no_grad()
def broadcast_(x: torch.Tensor, src: int = 0) -> torch.Tensor:
    if is_dist():
        dist.broadcast(x, src)
        _count_broadcast(nbytes(x), src)
    return x


def _count_broadcast(b: int, src: int) -> None:
    n, r = world_size(), rank()
    _count("broadcast", b if r != (src - 1) % n else 0, b if r != src else 0)


@torch.no_grad()
def exchange(x: torch.Tensor, send_counts: list[int], recv_counts: list[int]) -> torch.Tensor:
    """All-to-all along dim 0: the first send_counts[0] rows of `x` go to rank 0, the next send_counts[1] to rank 1,
    ...; returns recv_counts[r] rows from each rank r, in rank order. Only what another rank needs crosses the wire
    (x itself on one process)."""
    if not is_dist():
        return x
    out = x.new_empty((sum(recv_counts), *x.shape[1:]))
    dist.all_to_all_single(out, x.contiguous(), recv_counts, send_counts)
    row, me = nbytes(x[:1]) if len(x) else 0, rank()
    _count("all_to_all", row * (sum(send_counts) - send_counts[me]), row * (sum(recv_counts) - recv_counts[me]))
    return out


_OPS = {"sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX} if dist.is_available() else {}


def reduce_scalar(x: float, op: str = "sum", device: torch.device | str = "cpu") -> float:
    """`x` reduced over ranks (sum, min or max). The tensor handed to the collective is made on `device`, the
    worker's own: nccl takes only CUDA tensors, gloo CPU ones."""
    t = torch.tensor(float(x), dtype=torch.float64, device=device)
    if is_dist():
        dist.all_reduce(t, op=_OPS[op])
        _count_allreduce(8)
    return float(t)


@torch.no_grad()
def all_reduce_(x: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """`x` summed (or min, max) over ranks in place."""
    if is_dist():
        dist.all_reduce(x, op=_OPS[op])
        _count_allreduce(nbytes(x))
    return x


def _count_allreduce(b: int, op: str = "all_reduce") -> None:
    if _traffic is not None:
        moved = allreduce_bytes(b, world_size())
        _count(op, moved, moved)


@torch.no_grad()
def average_(tensors: list[torch.Tensor]) -> None:
    """Average tensors (all on one device) over ranks in place, in one flat all_reduce instead of one per tensor."""
    if not is_dist() or not tensors:
        return
    flat = torch.cat([t.reshape(-1) for t in tensors])
    all_reduce_(flat)
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
        broadcast_(flat, src)
        offset = 0
        for t in tensors:
            t.copy_(flat[offset : offset + t.numel()].view_as(t))
            offset += t.numel()


def register_grad_hook(model: torch.nn.Module, compression: str | None = None) -> None:
    """A DDP comm hook on `model` (a DistributedDataParallel) that counts each gradient bucket's all-reduce and, with
    compression="bf16", sends it in bfloat16 (PyTorch's bf16_compress_hook: half the bytes, the sum taken in bf16).
    Nothing is registered on one process, or when neither counting nor compression is asked for (DDP's own C++
    all-reduce stays)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    if not is_dist() or not isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return
    if compression not in (None, "bf16"):
        raise ValueError(f"unknown gradient compression {compression!r}: none or bf16")
    if compression is None and _traffic is None:
        return
    inner = default_hooks.bf16_compress_hook if compression == "bf16" else default_hooks.allreduce_hook

    def hook(state, bucket):
        _count_allreduce(
            bucket.buffer().numel() * (2 if compression == "bf16" else bucket.buffer().element_size()),
            "grad_all_reduce",
        )
        return inner(state, bucket)

    model.register_comm_hook(None, hook)
