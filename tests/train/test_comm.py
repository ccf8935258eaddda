"""pipeline/dist.py's byte counting (trainer.count_bytes) and DDP's bf16 gradient compression
(trainer.grad_compression), on 2 gloo ranks: each count against the ring formula written out here, and the compressed
gradients against the uncompressed ones within bf16's rounding."""

import io

import pytest
import torch
import torch.distributed as tdist
from torch import nn

from helpers import init_gloo, run_process_group
from pipeline import dist


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8))


def _worker(rank, world, port, q, compression):
    init_gloo(rank, world, port)
    dist.count_bytes(True)
    x = torch.full((3, 5), float(rank))
    dist.gather_nograd(x)
    dist.all_reduce_(torch.zeros(10))
    dist.exchange(torch.arange(4.0).view(4, 1), [1, 3] if rank == 0 else [2, 2], [1, 2] if rank == 0 else [3, 2])
    counts = dist.take_traffic()
    model = nn.parallel.DistributedDataParallel(_net(), **dist.ddp_options())
    dist.register_grad_hook(model, compression)
    g = torch.Generator().manual_seed(rank)
    model(torch.randn(16, 32, generator=g)).square().mean().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    buf = io.BytesIO()
    torch.save((dict(counts.sent), dict(counts.received), dict(dist.take_traffic().sent), grads), buf)
    q.put((rank, buf.getvalue()))
    tdist.barrier()
    tdist.destroy_process_group()


def _run(compression):
    return [(r, *torch.load(io.BytesIO(b))) for r, b in run_process_group(_worker, 2, (compression,))]


def test_each_collective_counts_its_ring_bytes_and_ddp_its_gradient_buckets():
    results = _run(None)
    grad_bytes = sum(p.numel() * 4 for p in _net().parameters())
    for rank, sent, received, after, _ in results:
        assert sent["all_gather"] == received["all_gather"] == 1 * 3 * 5 * 4  # (N - 1) x the chunk
        assert sent["all_reduce"] == received["all_reduce"] == 2 * 1 / 2 * 10 * 4  # 2 (N - 1) / N x B
        # the all-to-all: only the rows for (from) the other rank, 4 bytes a row
        assert sent["all_to_all"] == (3 if rank == 0 else 2) * 4
        assert received["all_to_all"] == (2 if rank == 0 else 3) * 4
        assert after["grad_all_reduce"] == pytest.approx(2 * 1 / 2 * grad_bytes, abs=1)


def test_bf16_compression_halves_the_bytes_and_keeps_the_gradient_within_bf16_rounding():
    plain, bf16 = _run(None), _run("bf16")
    for (_, _, _, after_p, g_p), (_, _, _, after_b, g_b) in zip(plain, bf16):
        assert after_b["grad_all_reduce"] * 2 == pytest.approx(after_p["grad_all_reduce"], abs=2)
        assert any(not torch.equal(a, b) for a, b in zip(g_p, g_b))  # it did go through bf16
        for a, b in zip(g_p, g_b):  # bf16 keeps 8 bits of mantissa: 2^-8 of each value, summed over 2 ranks
            assert (a - b).abs().max() <= 2**-7 * a.abs().max() + 1e-8


def test_counting_is_off_by_default_and_a_report_reduction_is_not_counted():
    assert dist.take_traffic().sent == {}
    dist.count_bytes(True)
    try:
        with dist.uncounted():
            dist._count("all_reduce", 8, 8)
        dist._count("all_gather", 4, 4)
        assert dict(dist.take_traffic().sent) == {"all_gather": 4}
    finally:
        dist.count_bytes(False)
