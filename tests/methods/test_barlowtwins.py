"""Barlow Twins (pipeline/methods/barlowtwins.py): the loss against the paper's Eq. 1-2 computed term by term, and
against the authors' code (facebookresearch/barlowtwins, main.py) as it computes it; one worker against two; a
step with each plug-in its contract allows is in tests/train/test_device_step.py."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

from helpers import assert_close_at_scale, init_gloo, loss_and_grads, run_process_group
from pipeline.build import build_method
from pipeline.config import compose_config
from pipeline.methods.barlowtwins import barlow_twins_loss
from pipeline.methods.base import Encoder


def _z(n=6, d=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g, dtype=torch.float64), torch.randn(n, d, generator=g, dtype=torch.float64)


def test_the_loss_is_eq_1_with_the_cross_correlation_of_eq_2():
    """Eq. 2: C_ij = sum_b z^A_bi z^B_bj / (sqrt(sum_b (z^A_bi)^2) sqrt(sum_b (z^B_bj)^2)) over batch-centred
    projections; Eq. 1: sum_i (1 - C_ii)^2 + lambda sum_i sum_{j != i} C_ij^2. Loops in float64; the module
    standardises with BatchNorm's eps, hence the tolerance."""
    za, zb = _z()
    za, zb = za - za.mean(0), zb - zb.mean(0)
    n, d = za.shape
    lambd = 0.3
    total = 0.0
    for i in range(d):
        for j in range(d):
            num = sum(za[b, i] * zb[b, j] for b in range(n))
            den = sum(za[b, i] ** 2 for b in range(n)) ** 0.5 * sum(zb[b, j] ** 2 for b in range(n)) ** 0.5
            c = float(num / den)
            total += (1 - c) ** 2 if i == j else lambd * c**2
    assert barlow_twins_loss(*_z(), lambd).item() == pytest.approx(total, rel=1e-4)


def test_the_loss_is_what_the_authors_code_computes():
    """main.py's BarlowTwins.forward: c = bn(z1).T @ bn(z2) / batch_size with bn a BatchNorm1d without affine
    parameters (in training mode), on_diag = sum((diag(c) - 1)^2), off_diag = sum of the off-diagonal c^2,
    loss = on_diag + lambd * off_diag (lambd 0.0051)."""
    z1, z2 = (z.float() for z in _z(n=32, d=16, seed=1))
    bn = nn.BatchNorm1d(16, affine=False).train()
    c = bn(z1).T @ bn(z2) / 32
    on_diag = (torch.diagonal(c) - 1).pow(2).sum()
    off_diag = (c - torch.diag(torch.diagonal(c))).pow(2).sum()
    assert barlow_twins_loss(z1, z2, 0.0051).item() == pytest.approx((on_diag + 0.0051 * off_diag).item(), rel=1e-5)


def test_identical_decorrelated_views_have_zero_loss_and_the_loss_runs_in_float32():
    z = torch.linalg.qr(torch.randn(64, 8, dtype=torch.float64))[0] * 8  # orthogonal, standardised columns
    z = z - z.mean(0)
    assert barlow_twins_loss(z, z, 0.0051).item() == pytest.approx(0.0, abs=1e-3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        a, b = (t.bfloat16() for t in _z(n=16, d=8))
        assert barlow_twins_loss(a, b, 0.0051).dtype == torch.float32


def _images(n=8):
    g = torch.Generator().manual_seed(2)
    return [torch.randn(n, 3, 4, 4, generator=g) for _ in range(2)]


def _step(images, distributed):
    """A step on a BN-free encoder, so one process and two see the same maths."""
    m = build_method(compose_config(["method=barlowtwins", "model.width=4"]))
    torch.manual_seed(0)
    # bias-free: the loss does not depend on a shift of z, so a bias's gradient is 0 up to rounding
    m.online = Encoder(nn.Sequential(nn.Flatten(), nn.Linear(48, 12, bias=False)), nn.Linear(12, 6, bias=False))
    return loss_and_grads(m, images, distributed=distributed)


def _worker(rank, world, port, q):
    init_gloo(rank, world, port)
    loss, grads = _step([v.chunk(world)[rank] for v in _images()], True)
    q.put((rank, loss, [g.numpy() for g in grads]))
    dist.barrier()
    dist.destroy_process_group()


def test_two_workers_compute_the_whole_batchs_loss_and_gradient():
    """The cross-correlation is over every worker's projections (the code's all_reduce of c over the global
    batch): each worker's loss is the one-process loss, DDP's averaged gradient its gradient."""
    loss1, grads1 = _step(_images(), False)
    for _, loss, grads in run_process_group(_worker, 2):
        assert loss == pytest.approx(loss1, rel=1e-5)
        for g1, g2 in zip(grads1, grads, strict=True):
            assert_close_at_scale(torch.from_numpy(g2), g1)
