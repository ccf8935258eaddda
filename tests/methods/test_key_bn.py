"""MoCo's method.key_bn (pipeline/methods/key_bn.py): the permutation's law, the exchange's bookkeeping, and each
mode on 1, 2 and 4 gloo ranks (2 simulated nodes) against a single-process computation of the same statistics: the
loss, the online encoder's gradients, the key encoder's BN running statistics and the queue."""

import copy
import io

import pytest
import torch
import torch.distributed as tdist
import torch.nn.functional as F
from test_methods import MOCO

from helpers import assert_close_at_scale, init_gloo, loss_and_grads, run_process_group
from pipeline import dist
from pipeline.build import build_method
from pipeline.losses.contrastive import info_nce
from pipeline.methods import key_bn

B = 8  # per rank (split: BN groups of 4; smaller groups make BN ill-conditioned in float32)
# test_methods' MoCo with a narrower net and another seed (the permutations' generator starts from it)
CFG = {**MOCO, "seed": 3, "model": {**MOCO["model"], "width": 4}}
CFG["method"] = {**MOCO["method"], "head": {**MOCO["method"]["head"], "out_dim": 8}}


def _cfg(mode: str) -> dict:
    cfg = copy.deepcopy(CFG)
    cfg["method"].update(key_bn=mode, bn_splits=2 if mode == "split" else 1)
    return cfg


def _global_batch(world: int):
    g = torch.Generator().manual_seed(11)
    return [torch.randn(world * B, 3, 16, 16, generator=g) for _ in range(2)]


# ----------------------------------------------------------------------------- the permutation and its plan
def test_auto_picks_split_shuffle_or_shuffle_node_by_layout():
    assert key_bn.resolve("auto", [0]) == "split"
    assert key_bn.resolve("auto", [0, 0, 0, 0]) == "shuffle"
    assert key_bn.resolve("auto", [0, 0, 1, 1]) == "shuffle_node"
    assert key_bn.resolve("auto", [0, 0, 1]) == "shuffle"  # a node with one worker could not shuffle within itself
    assert key_bn.resolve("sync", [0, 1]) == "sync"
    with pytest.raises(ValueError, match="method.key_bn=bogus"):
        key_bn.resolve("bogus", [0])


def test_each_group_deals_its_own_samples_uniformly_to_its_own_slots():
    """The law: within a group every sample lands in every slot of the group with probability 1 / (group size);
    nothing crosses groups. Counted over 3000 draws (binomial sd ~ 12 at p = 1/4), a 5-sd band."""
    nodes = [0, 1, 0, 1]  # ranks of a node need not be contiguous
    groups = key_bn.shuffle_groups("shuffle_node", nodes)
    assert groups == [[0, 2], [1, 3]]
    b, draws = 2, 3000
    g = torch.Generator().manual_seed(0)
    hits = torch.zeros(8, 8)
    for _ in range(draws):
        perm = key_bn.permutation(b, groups, g)
        assert sorted(perm.tolist()) == list(range(8))
        hits[torch.arange(8), perm] += 1
    group_of = {i: next(k for k, grp in enumerate(groups) if i // b in grp) for i in range(8)}
    for slot in range(8):
        for sample in range(8):
            if group_of[slot] != group_of[sample]:
                assert hits[slot, sample] == 0
            else:  # a group of 2 ranks x 2 = 4 samples
                assert abs(hits[slot, sample] - draws / 4) < 5 * (draws * 0.25 * 0.75) ** 0.5


def test_the_plans_of_every_rank_deliver_each_sample_to_its_slot_and_back():
    """The all-to-all emulated in one process: what rank s sends to rank d, in order, is what d expects from s."""
    world, b = 3, 5
    perm = key_bn.permutation(b, [[0, 1, 2]], torch.Generator().manual_seed(1))
    plans = [key_bn.plan(perm, b, r, world) for r in range(world)]
    samples = torch.arange(world * b)  # each sample named by its global index
    for d in range(world):
        received = []
        for s in range(world):  # rows from s to d: s's send block for d
            start = sum(plans[s].send_counts[:d])
            block = samples[s * b : (s + 1) * b][plans[s].send_idx[start : start + plans[s].send_counts[d]]]
            assert len(block) == plans[d].recv_counts[s]
            received.append(block)
        dealt = torch.empty(b, dtype=torch.long)
        dealt[plans[d].recv_slots] = torch.cat(received)
        assert dealt.tolist() == perm[d * b : (d + 1) * b].tolist()


# ----------------------------------------------------------------------------- each mode against one process
def _bn_stats(module) -> list[torch.Tensor]:
    return [b.clone() for name, b in module.named_buffers() if "running" in name]


def _reference(mode: str, nodes: list[int]):
    """One process: every rank's query encoder on its own batch, the key encoder in the batch each mode deals."""
    world = len(nodes)
    cfg = _cfg(mode)
    torch.manual_seed(0)
    m = build_method(cfg)
    x1, x2 = _global_batch(world)
    queue = m.queue.keys.clone()
    keys = torch.empty(world * B, CFG["method"]["head"]["out_dim"])
    stats = []
    if mode == "sync":  # one process: the synced BN is plain BN over the whole batch
        enc = copy.deepcopy(m.key_encoder)
        with torch.no_grad():
            keys = F.normalize(enc(x2), dim=1)
        stats = [_bn_stats(enc)] * world
    else:
        groups = {  # written out here, not taken from key_bn.shuffle_groups: the test must not share its mistakes
            "shuffle": [list(range(world))],
            "shuffle_node": [[r for r in range(world) if nodes[r] == n] for n in sorted(set(nodes))],
            "split": [[r] for r in range(world)],
        }[mode]
        perm = key_bn.permutation(B, groups, torch.Generator().manual_seed(cfg["seed"]))
        for r in range(world):
            enc = copy.deepcopy(m.key_encoder)
            mine = perm[r * B : (r + 1) * B]
            with torch.no_grad():
                keys[mine] = F.normalize(enc(x2[mine]), dim=1)
            stats.append(_bn_stats(enc))
    losses, grads = [], None
    for r in range(world):
        online = copy.deepcopy(m.online)
        q = F.normalize(online(x1[r * B : (r + 1) * B]), dim=1)
        loss = info_nce(q, keys[r * B : (r + 1) * B], queue, CFG["method"]["temperature"])
        loss.backward()
        losses.append(loss.item())
        g = [p.grad / world for p in online.parameters()]
        grads = g if grads is None else [a + c for a, c in zip(grads, g)]
    return losses, grads, stats, keys


def _modes_worker(rank, world, port, q, modes, nodes):
    """Each of `modes` in turn on one process group (a spawn costs seconds; the modes share nothing but the group)."""
    init_gloo(rank, world, port)
    dist.set_node_rank(nodes[rank])
    dist.count_bytes(True)
    got = {}
    for mode in modes:
        torch.manual_seed(0)
        m = build_method(_cfg(mode))
        x1, x2 = (x[rank * B : (rank + 1) * B] for x in _global_batch(world))
        loss, grads = loss_and_grads(m, [x1, x2], distributed=True)
        traffic = dist.take_traffic()
        sent = dict(traffic.sent)
        got[mode] = (m.key_bn, loss, grads, _bn_stats(m.key_encoder), m.queue.keys[: world * B].clone(), sent)
    buf = io.BytesIO()  # bytes, not tensors: a tensor on the queue is shared memory that dies with this process
    torch.save(got, buf)
    q.put((rank, buf.getvalue()))
    tdist.barrier()
    tdist.destroy_process_group()


def _run_modes(modes: list[str], nodes: list[int]) -> dict[str, list]:
    """{mode: [(rank, resolved mode, loss, grads, BN statistics, queue, bytes sent) for each rank]}."""
    ranks = [(r, torch.load(io.BytesIO(b))) for r, b in run_process_group(_modes_worker, len(nodes), (modes, nodes))]
    return {mode: [(r, *got[mode]) for r, got in ranks] for mode in modes}


def _check_mode(mode: str, nodes: list[int], results: list):
    losses, grads, stats, keys = _reference(mode, nodes)
    for rank, resolved, loss, g, s, queue, _ in results:
        assert resolved == mode
        assert loss == pytest.approx(losses[rank], rel=1e-4)
        for a, e in zip(g, grads):
            assert_close_at_scale(a, e)
        for a, e in zip(s, stats[rank]):
            assert_close_at_scale(a, e)
        assert_close_at_scale(queue, keys)  # every rank's queue holds all keys, in global batch order


TWO_RANKS, TWO_NODES = ["shuffle", "sync", "split"], ["shuffle_node", "shuffle", "sync"]


@pytest.fixture(scope="module")
def on_two_ranks():
    return _run_modes(TWO_RANKS, [0, 0])


@pytest.fixture(scope="module")
def on_two_nodes():
    return _run_modes(TWO_NODES, [0, 0, 1, 1])


@pytest.mark.parametrize("mode", TWO_RANKS)
def test_each_mode_on_two_ranks_matches_one_process(mode, on_two_ranks):
    results = on_two_ranks[mode]
    _check_mode(mode, [0, 0], results)
    sent = results[0][6]
    if mode == "shuffle":  # only the dealt views (and their keys) cross: never the whole batch
        assert 0 < sent["all_to_all"] <= B * (3 * 16 * 16 * 4 + 8 * 4)
    else:
        assert sent.get("all_to_all", 0) == 0
    if mode == "sync":  # one all-reduce of 2C + 1 float64 per BatchNorm layer instead of views
        assert sent.get("all_reduce", 0) > 0


@pytest.mark.slow
@pytest.mark.parametrize("mode", TWO_NODES)
def test_each_mode_on_two_nodes_of_two_ranks_matches_one_process(mode, on_two_nodes):
    _check_mode(mode, [0, 0, 1, 1], on_two_nodes[mode])


def test_one_process_split_is_the_old_split_bn_shuffle():
    losses, grads, stats, keys = _reference("split", [0])
    torch.manual_seed(0)
    m = build_method(_cfg("split"))
    assert m.key_bn == "split"
    x1, x2 = _global_batch(1)
    loss, g = loss_and_grads(m, [x1, x2], distributed=False)
    assert loss == pytest.approx(losses[0], rel=1e-5)
    for a, e in zip(g, grads):
        assert_close_at_scale(a, e)
    for a, e in zip(_bn_stats(m.key_encoder), stats[0]):
        assert_close_at_scale(a, e)
