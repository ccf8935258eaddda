"""Methods on one process and on two gloo processes: the same global batch must give the same loss
gradients, keys and queue (BN-free encoders, so per-rank batch statistics cannot differ)."""

import pytest
import torch
import torch.distributed as dist
from torch import nn

from helpers import assert_close_at_scale, init_gloo, loss_and_grads, run_process_group
from pipeline.build import build_method
from pipeline.losses.contrastive import info_nce
from pipeline.methods.base import Encoder

CFG = {
    "seed": 0,
    "model": {"backbone": "resnet18", "cifar_stem": True, "width": 8},
    "method": {
        "kind": "simclr",
        "name": "simclr",
        "temperature": 0.5,
        "head": {"num_layers": 2, "hidden_dim": None, "out_dim": 16, "bn": True},
    },
}
MOCO = {
    **CFG,
    "method": {
        "kind": "moco",
        "name": "mocov2",
        "temperature": 0.2,
        "momentum": 0.9,
        "queue_size": 32,
        "bn_splits": 1,
        "head": {"num_layers": 2, "hidden_dim": None, "out_dim": 16, "bn": False},
    },
}


def _linear_encoder():
    torch.manual_seed(0)
    return Encoder(nn.Sequential(nn.Flatten(), nn.Linear(3 * 4 * 4, 12)), nn.Linear(12, 16))


def _batch(n=8):
    g = torch.Generator().manual_seed(1)
    return [torch.randn(n, 3, 4, 4, generator=g), torch.randn(n, 3, 4, 4, generator=g)]


def _simclr_step(images, distributed):
    m = build_method(CFG)
    m.online = _linear_encoder()
    return loss_and_grads(m, images, distributed=distributed)


def _worker(rank, world, port, q, kind):
    init_gloo(rank, world, port)
    images = [v.chunk(world)[rank] for v in _batch()]
    if kind == "simclr":
        loss, grads = _simclr_step(images, True)
        q.put((rank, loss, grads))
    else:
        m = build_method(MOCO)
        m.online, m.key_encoder = _linear_encoder(), _linear_encoder()
        m.queue.keys.zero_()
        out = m.framework_loss(images)
        q.put((rank, out["loss"].item(), m.queue.keys.clone()))
    dist.barrier()
    dist.destroy_process_group()


def _run(kind, world=2):
    return run_process_group(_worker, world, (kind,))


def test_simclr_gradient_same_on_one_and_two_workers():
    loss1, grads1 = _simclr_step(_batch(), False)
    results = _run("simclr")
    # each rank's loss covers its own anchors; their mean is the full-batch loss
    assert sum(r[1] for r in results) / 2 == pytest.approx(loss1, rel=1e-5)
    for g1, g2 in zip(grads1, results[0][2]):
        assert_close_at_scale(g2, g1)
    for g_a, g_b in zip(results[0][2], results[1][2]):
        torch.testing.assert_close(g_a, g_b)


def test_moco_keys_and_queue_same_on_one_and_two_workers():
    m = build_method(MOCO)
    m.online, m.key_encoder = _linear_encoder(), _linear_encoder()
    m.queue.keys.zero_()
    out = m.framework_loss(_batch())
    results = _run("moco")
    # every rank holds the same queue, filled with all 8 keys in global batch order
    torch.testing.assert_close(results[0][2], results[1][2])
    torch.testing.assert_close(results[0][2], m.queue.keys)
    assert sum(r[1] for r in results) / 2 == pytest.approx(out["loss"].item(), rel=1e-5)


def test_moco_step_trains_and_updates_key_encoder():
    cfg = {**MOCO, "method": {**MOCO["method"], "bn_splits": 2}}
    m = build_method(cfg)
    images = [torch.randn(8, 3, 16, 16), torch.randn(8, 3, 16, 16)]
    before = [p.clone() for p in m.key_encoder.parameters()]
    out = m.framework_loss(images)
    out["loss"].backward()
    assert all(p.grad is not None for p in m.online.parameters())
    assert all(p.grad is None for p in m.key_encoder.parameters())
    with torch.no_grad():
        for p in m.online.parameters():
            p.add_(1.0)
    m.update_momentum(0.5)
    after = list(m.key_encoder.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, after))
    assert int(m.queue.ptr) == 8


def test_moco_symmetric_loss_is_both_directions():
    import torch.nn.functional as F

    cfg = {**MOCO, "method": {**MOCO["method"], "symmetric": True}}
    m = build_method(cfg)
    m.online, m.key_encoder = _linear_encoder(), _linear_encoder()
    queue = m.queue.keys.clone()
    x1, x2 = _batch()
    out = m.framework_loss([x1, x2])
    with torch.no_grad():
        z1, z2 = F.normalize(m.online(x1), dim=1), F.normalize(m.online(x2), dim=1)
    expected = info_nce(z1, z2, queue, 0.2) + info_nce(z2, z1, queue, 0.2)
    assert out["loss"].item() == pytest.approx(expected.item(), rel=1e-5)
    torch.testing.assert_close(m.queue.keys[:16], torch.cat([z1, z2]))


def test_loss_again_gives_the_steps_loss_and_leaves_no_trace():
    """Method.loss_again (CoCor's re-evaluation after the step): the framework's loss of the same views, with the
    queue and the BatchNorm statistics as they were; framework_loss itself moves both."""
    from pipeline.config import compose_config

    m = build_method(compose_config(["method=mocov2", "model.width=4", "method.queue_size=32"]))
    g = torch.Generator().manual_seed(0)
    images = [torch.randn(8, 3, 16, 16, generator=g) for _ in range(2)]
    before = {name: b.clone() for name, b in m.named_buffers()}
    torch.manual_seed(5)
    again = m.loss_again(images)
    assert not again.requires_grad
    assert all(torch.equal(b, before[name]) for name, b in m.named_buffers())
    torch.manual_seed(5)  # the same shuffle of the keys' BatchNorm groups
    loss = m.framework_loss(images)["loss"]
    assert again.item() == pytest.approx(loss.item(), rel=1e-6)
    assert not all(torch.equal(b, before[name]) for name, b in m.named_buffers())
