"""BYOL, SimSiam and SupCon: losses against direct float64 computations of their equations, stop-gradients, the
BYOL target EMA and its schedule, training steps on a tiny ResNet, the CoCor embeddings, and SupCon and BYOL on one
process vs two gloo processes (BN-free encoders, so per-rank batch statistics cannot differ)."""

import math
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
import yaml
from torch import nn

from helpers import assert_close_at_scale, init_gloo, loss_and_grads, run_process_group
from pipeline.build import build_method
from pipeline.losses.contrastive import supcon_loss
from pipeline.losses.predictive import byol_loss, negative_cosine
from pipeline.methods import METHODS
from pipeline.methods.base import Encoder
from pipeline.methods.predictor import PredictorEncoder
from pipeline.models.momentum import momentum_copy

CONF = Path(__file__).resolve().parents[2] / "conf" / "method"
MODEL = {"backbone": "resnet18", "cifar_stem": True, "width": 8}
HEAD = {"num_layers": 2, "hidden_dim": None, "out_dim": 16, "bn": True}
CFGS = {
    "byol": {
        "seed": 0,
        "model": MODEL,
        "method": {
            "kind": "byol",
            "name": "byol",
            "momentum": 0.9,
            "momentum_cosine": True,
            "head": HEAD,
            "predictor": {"num_layers": 2, "hidden_dim": 32, "bn": True},
        },
    },
    "simsiam": {
        "seed": 0,
        "model": MODEL,
        "method": {
            "kind": "simsiam",
            "name": "simsiam",
            "head": {**HEAD, "num_layers": 3},
            "predictor": {"num_layers": 2, "hidden_dim": None},
        },
    },
    "supcon": {
        "seed": 0,
        "model": MODEL,
        "method": {"kind": "supcon", "name": "supcon", "temperature": 0.1, "head": {**HEAD, "bn": False}},
    },
}
LABELS = torch.tensor([0, 1, 0, 2, 1, 1, 3, 2])


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _randn(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _images(n=8, size=16, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, 3, size, size, generator=g), torch.randn(n, 3, size, size, generator=g)]


def _params(labels=LABELS):
    return [{"label": labels}, {"label": labels}]


def _cos(a, b):
    return float(a @ b) / (float(a.norm()) * float(b.norm()))


# ---------------------------------------------------------------------------------------------------------- losses


def test_byol_loss_matches_equation():
    p, z = _randn(6, 9, seed=0), _randn(6, 9, seed=1)
    direct = sum(2 - 2 * _cos(p[i], z[i]) for i in range(6)) / 6
    assert byol_loss(p, z).item() == pytest.approx(direct, rel=1e-12)
    assert byol_loss(z, z).item() == pytest.approx(0.0, abs=1e-12)


def test_negative_cosine_matches_equation():
    p, z = _randn(6, 9, seed=2), _randn(6, 9, seed=3)
    direct = -sum(_cos(p[i], z[i]) for i in range(6)) / 6
    assert negative_cosine(p, z).item() == pytest.approx(direct, rel=1e-12)
    assert negative_cosine(z, z).item() == pytest.approx(-1.0, rel=1e-12)


def _supcon_direct(z, labels, t):
    z = F.normalize(z, dim=1)
    m = z.shape[0]
    total = 0.0
    for i in range(m):
        denom = sum(math.exp(float(z[i] @ z[a]) / t) for a in range(m) if a != i)
        pos = [p for p in range(m) if p != i and labels[p] == labels[i]]
        if pos:
            total += -sum(math.log(math.exp(float(z[i] @ z[p]) / t) / denom) for p in pos) / len(pos)
    return total / m


@pytest.mark.parametrize("t", [0.1, 0.5])
def test_supcon_loss_matches_equation(t):
    z = _randn(16, 5, seed=4)
    labels = torch.cat([LABELS, LABELS])  # two views per image; images 0 and 2 share class 0, etc.
    assert supcon_loss(z, labels, t).item() == pytest.approx(_supcon_direct(z, labels, t), rel=1e-10)
    lonely = torch.arange(16)  # no positive anywhere: every anchor contributes 0
    assert supcon_loss(z, lonely, t).item() == pytest.approx(_supcon_direct(z, lonely, t), abs=1e-12)


def test_supcon_anchor_slices_average_to_the_full_loss():
    """The gathered layout (anchors = one rank's views, candidates = all ranks' views) averaged over ranks."""
    b, n = 4, 8
    c1, c2 = _randn(n, 5, seed=5), _randn(n, 5, seed=6)
    full = supcon_loss(torch.cat([c1, c2]), torch.cat([LABELS, LABELS]), 0.2)
    parts = []
    for r in range(2):
        s = slice(r * b, (r + 1) * b)
        local = torch.arange(b) + r * b
        parts.append(
            supcon_loss(
                torch.cat([c1[s], c2[s]]),
                torch.cat([LABELS[s], LABELS[s]]),
                0.2,
                candidates=torch.cat([c1, c2]),
                candidate_labels=torch.cat([LABELS, LABELS]),
                self_index=torch.cat([local, local + n]),
            )
        )
    assert (sum(parts) / 2).item() == pytest.approx(full.item(), rel=1e-12)


@pytest.mark.parametrize("loss", [byol_loss, negative_cosine])
def test_no_gradient_reaches_the_target_side(loss):
    p, z = _randn(5, 7, seed=7).requires_grad_(), _randn(5, 7, seed=8).requires_grad_()
    loss(p, z).backward()
    assert p.grad is not None and p.grad.abs().sum() > 0
    assert z.grad is None


def test_supcon_gradient_is_exact():
    z = _randn(8, 4, seed=9).requires_grad_()
    labels = torch.tensor([0, 1, 0, 1, 2, 2, 0, 1])
    assert torch.autograd.gradcheck(lambda x: supcon_loss(x, labels, 0.3), (z,))


# ---------------------------------------------------------------------------------------------------------- methods


def test_registry_and_yaml_configs_build():
    for kind in ("byol", "simsiam", "supcon"):
        m = yaml.safe_load((CONF / f"{kind}.yaml").read_text())
        assert m["kind"] == kind and kind in METHODS
        method = build_method({"seed": 0, "model": MODEL, "method": m})
        assert type(method) is METHODS[kind]
    simsiam = build_method({"seed": 0, "model": MODEL, "method": yaml.safe_load((CONF / "simsiam.yaml").read_text())})
    proj, pred = simsiam.online.projector, simsiam.online.predictor
    assert isinstance(proj[-1], nn.BatchNorm1d) and not proj[-1].affine and proj[-2].bias is None
    assert pred[0].out_features == proj[-1].num_features // 4 and not isinstance(pred[-1], nn.BatchNorm1d)


@pytest.mark.parametrize("kind", ["byol", "simsiam", "supcon"])
def test_training_step_trains_every_online_parameter(kind):
    torch.manual_seed(0)
    m = build_method(CFGS[kind])
    out = m.total_loss(_images(), _params())
    assert torch.isfinite(out["loss"]) and out["loss"].dim() == 0
    out["loss"].backward()
    for name, p in m.online.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
    if kind != "supcon":
        assert any(p.grad.abs().sum() > 0 for p in m.online.predictor.parameters())
    if kind == "byol":
        assert all(not p.requires_grad and p.grad is None for p in m.target.parameters())


@pytest.mark.parametrize("kind", ["byol", "simsiam"])
def test_loss_is_symmetric_over_view_orders(kind):
    torch.manual_seed(0)
    m = build_method(CFGS[kind])
    x1, x2 = _images()
    out = m.framework_loss([x1, x2])
    with torch.no_grad():  # train-mode BN: recomputing gives the same outputs
        z1, p1 = m.online(x1, predict=True)
        z2, p2 = m.online(x2, predict=True)
        if kind == "byol":
            expected = byol_loss(p1, m.target(x2)) + byol_loss(p2, m.target(x1))
        else:
            expected = 0.5 * negative_cosine(p1, z2) + 0.5 * negative_cosine(p2, z1)
    assert out["loss"].item() == pytest.approx(expected.item(), rel=1e-5)
    if kind == "byol":
        q, k = out["ctx"].pairs[0]
        torch.testing.assert_close(q, F.normalize(p1, dim=1))
        torch.testing.assert_close(k, F.normalize(m.target(x2), dim=1))
        assert out["ctx"].queue is None  # BYOL has no queue, and no stand-in for one
        torch.testing.assert_close(m.query(x1), q)
    assert len(out["ctx"].features) == 2


def test_byol_target_follows_the_momentum_rule_and_schedule():
    m = build_method(CFGS["byol"])
    assert m.momentum.at(0.0) == pytest.approx(0.9) and m.momentum.at(1.0) == 1.0
    assert m.momentum.at(0.5) == pytest.approx(1 - 0.1 * 0.5)
    # target = backbone + projector, same shapes as online's; the predictor has no twin
    online = list(m.online.backbone.parameters()) + list(m.online.projector.parameters())
    assert len(online) == len(list(m.target.parameters()))
    with torch.no_grad():
        for p in m.online.parameters():
            p.add_(torch.randn_like(p))
    for progress in (0.25, 1.0):
        before = [t.clone() for t in m.target.parameters()]
        m.update_momentum(progress)
        tau = 1 - 0.1 * (math.cos(math.pi * progress) + 1) / 2
        assert m.momentum.value == pytest.approx(tau)
        for t, b, o in zip(m.target.parameters(), before, online):
            torch.testing.assert_close(t, tau * b + (1 - tau) * o)
    assert any(not torch.equal(t, o) for t, o in zip(m.target.parameters(), online))


def test_supcon_needs_labels():
    m = build_method(CFGS["supcon"])
    for params in (None, [{}, {}]):
        with pytest.raises(ValueError, match="supcon needs class labels: use a dataset whose shards carry cls"):
            m.framework_loss(_images(), params)


@pytest.mark.parametrize("kind", ["byol", "simsiam", "supcon"])
def test_cocor_embeddings(kind):
    torch.manual_seed(0)
    m = build_method(CFGS[kind])
    x = _images()[0]
    e = m.embed(x)
    a = m.embed_target(x)
    assert e.dtype == a.dtype == torch.float32 and e.requires_grad and not a.requires_grad
    torch.testing.assert_close(e.norm(dim=1), torch.ones(8))
    torch.testing.assert_close(a.norm(dim=1), torch.ones(8))
    with torch.no_grad():
        z = m.online(x)  # the projection (backbone + projector)
    torch.testing.assert_close(a, F.normalize(z, dim=1))
    e.sum().backward()
    if kind == "supcon":
        torch.testing.assert_close(e.detach(), a)
    else:  # augmented views go through the predictor
        assert all(p.grad is not None for p in m.online.predictor.parameters())
        torch.testing.assert_close(e.detach(), m.query(x).detach())


# ------------------------------------------------------------------------------------------------------- 2 workers


def _linear_encoder():
    torch.manual_seed(0)
    return Encoder(nn.Sequential(nn.Flatten(), nn.Linear(3 * 4 * 4, 12)), nn.Linear(12, 16))


def _step(kind, images, labels, distributed):
    """One step with a BN-free linear online network; returns the loss and the online gradients."""
    m = build_method(CFGS[kind])
    enc = _linear_encoder()
    if kind == "byol":  # two forwards (one per view) through DDP, and a predictor
        m.online = PredictorEncoder(enc.backbone, enc.projector, nn.Linear(16, 16))
        m.target = momentum_copy(enc)
    else:
        m.online = enc
    return loss_and_grads(m, images, _params(labels), distributed=distributed)


def _worker(rank, world, port, q):
    init_gloo(rank, world, port)
    images = [v.chunk(world)[rank] for v in _images(size=4)]
    labels = LABELS.chunk(world)[rank]
    res = {kind: _step(kind, images, labels, True) for kind in ("supcon", "byol")}
    # numpy, not tensors: torch's queue shares tensor storage with the parent, which races with this exit
    q.put((rank, {k: (loss, [g.numpy() for g in grads]) for k, (loss, grads) in res.items()}))
    dist.barrier()
    dist.destroy_process_group()


def test_supcon_and_byol_same_on_one_and_two_workers():
    results = [
        {k: (loss, [torch.from_numpy(g) for g in grads]) for k, (loss, grads) in res.items()}
        for _, res in run_process_group(_worker, 2)
    ]
    for kind in ("supcon", "byol"):
        loss1, grads1 = _step(kind, _images(size=4), LABELS, False)
        # each rank's loss covers its own anchors (SupCon: against every rank's views); their mean is the
        # full-batch loss, and DDP's averaged gradient is the full-batch gradient
        assert sum(r[kind][0] for r in results) / 2 == pytest.approx(loss1, rel=1e-5), kind
        for g1, g2 in zip(grads1, results[0][kind][1], strict=True):
            assert_close_at_scale(g2, g1)
        for g_a, g_b in zip(results[0][kind][1], results[1][kind][1], strict=True):
            torch.testing.assert_close(g_a, g_b)
