"""Losses against direct float64 computations of their equations, looping over the batch."""

import math

import pytest
import torch
import torch.nn.functional as F

from pipeline.losses.contrastive import info_nce, nt_xent, nt_xent_anchors


def _unit(*shape, seed):
    g = torch.Generator().manual_seed(seed)
    return F.normalize(torch.randn(*shape, generator=g, dtype=torch.float64), dim=-1)


def _info_nce_direct(q, k, queue, t):
    total = 0.0
    for i in range(q.shape[0]):
        pos = math.exp(float(q[i] @ k[i]) / t)
        neg = sum(math.exp(float(q[i] @ queue[j]) / t) for j in range(queue.shape[0]))
        total += -math.log(pos / (pos + neg))
    return total / q.shape[0]


def _nt_xent_direct(z1, z2, t):
    z = F.normalize(torch.cat([z1, z2]), dim=1)
    n = z.shape[0]
    b = n // 2
    total = 0.0
    for i in range(n):
        j = (i + b) % n
        denom = sum(math.exp(float(z[i] @ z[k]) / t) for k in range(n) if k != i)
        total += -math.log(math.exp(float(z[i] @ z[j]) / t) / denom)
    return total / n


@pytest.mark.parametrize("t", [0.07, 0.2, 1.0])
def test_info_nce_matches_equation(t):
    q, k, queue = _unit(6, 8, seed=0), _unit(6, 8, seed=1), _unit(20, 8, seed=2)
    assert info_nce(q, k, queue, t).item() == pytest.approx(_info_nce_direct(q, k, queue, t), rel=1e-10)


def test_info_nce_gradient_reaches_queries_only():
    q = _unit(4, 8, seed=0).requires_grad_()
    k = _unit(4, 8, seed=1).requires_grad_()
    queue = _unit(10, 8, seed=2).requires_grad_()
    info_nce(q, k, queue, 0.2).backward()
    assert q.grad is not None and q.grad.abs().sum() > 0
    assert k.grad is None and queue.grad is None


def test_info_nce_is_lower_when_query_matches_key():
    k, queue = _unit(8, 16, seed=1), _unit(32, 16, seed=2)
    assert info_nce(k, k, queue, 0.2) < info_nce(_unit(8, 16, seed=3), k, queue, 0.2)


@pytest.mark.parametrize("t", [0.1, 0.5])
def test_nt_xent_matches_equation(t):
    g = torch.Generator().manual_seed(0)
    z1 = torch.randn(5, 7, generator=g, dtype=torch.float64)
    z2 = torch.randn(5, 7, generator=g, dtype=torch.float64)
    assert nt_xent(z1, z2, t).item() == pytest.approx(_nt_xent_direct(z1, z2, t), rel=1e-10)


def test_nt_xent_sharded_anchors_average_to_full_loss():
    """Each rank scores its own anchors against all gathered candidates; the mean over ranks is the
    single-process loss (what DDP's gradient averaging then differentiates)."""
    g = torch.Generator().manual_seed(1)
    z1 = torch.randn(8, 5, generator=g, dtype=torch.float64)
    z2 = torch.randn(8, 5, generator=g, dtype=torch.float64)
    parts = [
        nt_xent_anchors(z1[r * 4 : (r + 1) * 4], z2[r * 4 : (r + 1) * 4], z1, z2, 0.3, offset=r * 4) for r in range(2)
    ]
    assert (sum(parts) / 2).item() == pytest.approx(nt_xent(z1, z2, 0.3).item(), rel=1e-10)


def test_nt_xent_symmetric_in_views():
    g = torch.Generator().manual_seed(2)
    z1, z2 = torch.randn(6, 4, generator=g), torch.randn(6, 4, generator=g)
    assert nt_xent(z1, z2, 0.5).item() == pytest.approx(nt_xent(z2, z1, 0.5).item(), rel=1e-6)
