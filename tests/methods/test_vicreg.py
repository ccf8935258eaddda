"""VICReg (pipeline/methods/vicreg.py): each term against the paper's equations computed by loops, the loss
against the authors' code (facebookresearch/vicreg, main_vicreg.py) as it computes it; one worker against two; a
step with each plug-in its contract allows is in tests/train/test_device_step.py (method=vicreg plugin=[invclr]
among them)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from helpers import assert_close_at_scale, init_gloo, loss_and_grads, run_process_group
from pipeline.build import build_method
from pipeline.config import compose_config
from pipeline.methods.base import Encoder
from pipeline.methods.vicreg import vicreg_loss, vicreg_terms


def _z(n=6, d=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g, dtype=torch.float64), 0.3 * torch.randn(
        n, d, generator=g, dtype=torch.float64
    )


def test_each_term_is_its_equation():
    """Eq. 1-2: v(Z) = (1/d) sum_j max(0, 1 - sqrt(Var(z_j) + 1e-4)), Var unbiased; Eq. 3-4: c(Z) = (1/d) sum over
    i != j of C_ij^2, C = (1/(n-1)) sum_b (z_b - mean)(z_b - mean)^T; Eq. 5: s = (1/n) sum_b ||z_b - z'_b||^2."""
    z1, z2 = _z()
    n, d = z1.shape

    def v(z):
        out = 0.0
        for j in range(d):
            m = sum(float(z[b, j]) for b in range(n)) / n
            var = sum((float(z[b, j]) - m) ** 2 for b in range(n)) / (n - 1)
            out += max(0.0, 1 - (var + 1e-4) ** 0.5)
        return out / d

    def c(z):
        m = [sum(float(z[b, j]) for b in range(n)) / n for j in range(d)]
        out = 0.0
        for i in range(d):
            for j in range(d):
                if i != j:
                    cij = sum((float(z[b, i]) - m[i]) * (float(z[b, j]) - m[j]) for b in range(n)) / (n - 1)
                    out += cij**2
        return out / d

    s = sum(sum((float(z1[b, j]) - float(z2[b, j])) ** 2 for j in range(d)) for b in range(n)) / n
    t = vicreg_terms(z1, z2)
    assert t["invariance"].item() == pytest.approx(s, rel=1e-9)
    assert t["variance"].item() == pytest.approx(v(z1) + v(z2), rel=1e-9)
    assert t["covariance"].item() == pytest.approx(c(z1) + c(z2), rel=1e-9)
    paper = vicreg_loss(z1, z2, 25.0, 25.0, 1.0, form="paper")["loss"]
    assert paper.item() == pytest.approx(25 * s + 25 * (v(z1) + v(z2)) + (c(z1) + c(z2)), rel=1e-9)  # Eq. 6


def test_the_code_form_is_what_the_authors_code_computes():
    """main_vicreg.py's VICReg.forward (one process, so its FullGatherLayer is the identity): repr_loss =
    F.mse_loss(x, y); x, y centred; std = sqrt(var + 0.0001); std_loss = mean(relu(1 - std_x)) / 2 +
    mean(relu(1 - std_y)) / 2; cov = x.T @ x / (batch_size - 1); cov_loss = off-diagonal cov_x^2 summed / d + the same
    for y; loss = 25 repr_loss + 25 std_loss + 1 cov_loss."""
    x, y = (z.float() for z in _z(n=32, d=16, seed=1))
    repr_loss = F.mse_loss(x, y)
    x, y = x - x.mean(0), y - y.mean(0)
    std_x, std_y = torch.sqrt(x.var(0) + 0.0001), torch.sqrt(y.var(0) + 0.0001)
    std_loss = torch.mean(F.relu(1 - std_x)) / 2 + torch.mean(F.relu(1 - std_y)) / 2
    cov_x, cov_y = x.T @ x / 31, y.T @ y / 31

    def off(c):
        return (c - torch.diag(torch.diagonal(c))).pow(2).sum() / 16

    expected = 25 * repr_loss + 25 * std_loss + off(cov_x) + off(cov_y)
    ours = vicreg_loss(*_z(n=32, d=16, seed=1), 25.0, 25.0, 1.0, form="code")["loss"]
    assert ours.item() == pytest.approx(expected.item(), rel=1e-5)


def test_the_terms_run_in_float32_under_autocast():
    with torch.autocast("cpu", dtype=torch.bfloat16):
        a, b = (t.bfloat16() for t in _z(n=16, d=8))
        assert all(v.dtype == torch.float32 for v in vicreg_terms(a, b).values())


def _images(n=8):
    g = torch.Generator().manual_seed(2)
    return [torch.randn(n, 3, 4, 4, generator=g) for _ in range(2)]


def _step(images, distributed):
    """A step on a BN-free encoder, so one process and two see the same maths."""
    m = build_method(compose_config(["method=vicreg", "model.width=4"]))
    torch.manual_seed(0)
    # bias-free: both views share a bias, which z - z' and the centred terms cancel (its gradient is 0 up to rounding)
    m.online = Encoder(nn.Sequential(nn.Flatten(), nn.Linear(48, 12, bias=False)), nn.Linear(12, 6, bias=False))
    return loss_and_grads(m, images, distributed=distributed)


def _worker(rank, world, port, q):
    init_gloo(rank, world, port)
    loss, grads = _step([v.chunk(world)[rank] for v in _images()], True)
    q.put((rank, loss, [g.numpy() for g in grads]))
    dist.barrier()
    dist.destroy_process_group()


def test_two_workers_compute_the_whole_batchs_loss_and_gradient():
    """Variance and covariance over every worker's projections (the code gathers them): each worker's loss is
    the one-process loss, DDP's averaged gradient its gradient."""
    loss1, grads1 = _step(_images(), False)
    for _, loss, grads in run_process_group(_worker, 2):
        assert loss == pytest.approx(loss1, rel=1e-5)
        for g1, g2 in zip(grads1, grads, strict=True):
            assert_close_at_scale(torch.from_numpy(g2), g1)
