"""How MoCo's key encoder keeps a query from sharing BatchNorm statistics with its own positive key
(`method.key_bn`), and the exchange that shuffles keys across ranks.

- `shuffle` (MoCo's shuffle-BN): the global key batch is permuted, each rank's key encoder normalises the slice it
  is dealt, and the keys go back to their owners. Each rank receives only its slice (an all-to-all), not the global
  batch, and under bf16 autocast the views travel in bf16 (what the first layer would cast them to anyway).
- `shuffle_node`: the same, each node's batch permuted among that node's ranks only: the exchange stays on NVLink.
- `sync`: no shuffle; the key encoder's BatchNorm uses the statistics of every rank's batch (models/sync_bn.py), one
  small all-reduce per layer. The query encoder keeps per-rank statistics, so the two differ.
- `split` (one device): both encoders normalise in `method.bn_splits` groups and the keys are shuffled across the
  groups of the rank's own batch (models/split_bn.py); no exchange.
- `auto`: split on one worker, shuffle on one node, shuffle_node on several nodes when every node has two or more
  workers (docs/scale.md: it moves the fewest bytes across nodes), else shuffle.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pipeline import dist

MODES = ("auto", "shuffle", "shuffle_node", "sync", "split")


def split_groups(splits: int | str, key: str | None, workers: int) -> int:
    """method.bn_splits resolved: `auto` is 4 where the key encoder's BN splits within a worker (method.key_bn
    split, or auto on one worker), else 1."""
    if splits != "auto":
        return int(splits)
    key = key or "auto"
    return 4 if key == "split" or (key == "auto" and workers == 1) else 1


def resolve(mode: str, nodes: list[int]) -> str:
    """The mode to run with, given every rank's node (`dist.node_ranks()`)."""
    if mode not in MODES:
        raise ValueError(f"method.key_bn={mode}: one of {', '.join(MODES)}")
    if mode != "auto":
        return mode
    if len(nodes) == 1:
        return "split"
    per_node = [nodes.count(n) for n in set(nodes)]
    return "shuffle_node" if len(per_node) > 1 and min(per_node) >= 2 else "shuffle"


def shuffle_groups(mode: str, nodes: list[int]) -> list[list[int]]:
    """The ranks whose batches are shuffled together: all of them (shuffle), each node's (shuffle_node), each rank
    alone (split: across its BN groups; sync: a permutation that changes nothing)."""
    ranks = range(len(nodes))
    if mode == "shuffle":
        return [list(ranks)]
    if mode == "shuffle_node":
        return [[r for r in ranks if nodes[r] == n] for n in sorted(set(nodes))]
    return [[r] for r in ranks]


def permutation(b: int, groups: list[list[int]], generator: torch.Generator) -> torch.Tensor:
    """perm[slot] = the global sample a key slot gets; slot j and sample i both live on rank j // b (i // b). Every
    group's samples are dealt at random to that group's slots."""
    n = sum(len(g) for g in groups)
    perm = torch.empty(n * b, dtype=torch.long)
    for group in groups:
        idx = torch.cat([torch.arange(r * b, (r + 1) * b) for r in group])
        perm[idx] = idx[torch.randperm(len(idx), generator=generator)]
    return perm


@dataclass
class Plan:
    """One rank's side of an exchange: which of its samples go to which rank, and where what arrives belongs."""

    send_idx: torch.Tensor  # local samples in the order they are sent (grouped by destination rank)
    send_counts: list[int]
    recv_counts: list[int]
    recv_slots: torch.Tensor  # the key slot of each row received (rows arrive grouped by source rank)


def plan(perm: torch.Tensor, b: int, rank: int, world: int) -> Plan:
    mine = (perm // b == rank).nonzero().squeeze(1)  # slots (any rank's) dealt one of my samples, in slot order
    src = perm[rank * b : (rank + 1) * b] // b  # the owner of each of my slots' samples
    return Plan(
        send_idx=perm[mine] % b,
        send_counts=torch.bincount(mine // b, minlength=world).tolist(),
        recv_counts=torch.bincount(src, minlength=world).tolist(),
        recv_slots=torch.sort(src, stable=True).indices,
    )


def wire_dtype(x: torch.Tensor) -> torch.dtype:
    """bf16 when bf16 autocast is on for x's device (the first layer casts the views to bf16 anyway: nothing is
    lost), else the views' own dtype."""
    kind = x.device.type
    if x.is_floating_point() and torch.is_autocast_enabled(kind) and torch.get_autocast_dtype(kind) == torch.bfloat16:
        return torch.bfloat16
    return x.dtype


@torch.no_grad()
def shuffled_keys(encode, x: torch.Tensor, perm: torch.Tensor, local: bool) -> torch.Tensor:
    """encode(views) for this rank's views `x`, each computed on the rank (and in the batch) `perm` deals it to, and
    returned in x's order. `local`: every group is one rank, so nothing is exchanged."""
    b, me = x.shape[0], dist.rank()
    fmt = torch.channels_last if x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last) else None
    if local:
        order = (perm[me * b : (me + 1) * b] - me * b).to(x.device)
        k = encode(x[order])
        out = torch.empty_like(k)
        out[order] = k
        return out
    p = plan(perm, b, me, dist.world_size())  # on the CPU: a few thousand indices, same on every rank
    send_idx, recv_slots = p.send_idx.to(x.device), p.recv_slots.to(x.device)
    got = dist.exchange(x[send_idx].to(wire_dtype(x)), p.send_counts, p.recv_counts)
    dealt = torch.empty_like(got)
    dealt[recv_slots] = got
    dealt = dealt.to(x.dtype)
    k = encode(dealt.contiguous(memory_format=fmt) if fmt else dealt)
    back = dist.exchange(k[recv_slots], p.recv_counts, p.send_counts)
    out = torch.empty_like(back)
    out[send_idx] = back
    return out
