import pytest
import torch
from torch import nn

from pipeline.models.backbones import build_backbone
from pipeline.models.momentum import Queue, ema_update, momentum_copy
from pipeline.models.split_bn import SplitBatchNorm2d, convert_split_bn


@pytest.mark.parametrize("name,dim", [("resnet18", 512), ("resnet50", 2048)])
def test_backbone_feature_dims(name, dim):
    net = build_backbone({"backbone": name, "cifar_stem": True})
    assert net.feat_dim == dim
    assert net(torch.randn(2, 3, 32, 32)).shape == (2, dim)


def test_cifar_stem_keeps_resolution_and_width_scales():
    net = build_backbone({"backbone": "resnet18", "cifar_stem": True, "width": 16})
    assert net.feat_dim == 128
    assert isinstance(net.maxpool, nn.Identity) and net.conv1.stride == (1, 1)
    # the CIFAR stem keeps 32x32 through layer1
    x = net.relu(net.bn1(net.conv1(torch.randn(1, 3, 32, 32))))
    assert net.layer1(net.maxpool(x)).shape[-1] == 32


@pytest.mark.parametrize("name", ["resnet18", "resnet50"])
def test_zero_init_residual_starts_each_block_as_its_shortcut(name):
    """torchvision's zero_init_residual (SimSiam's, SimCLR's and MoCo v3's ResNets): every block's last BN scale 0,
    so in train mode a block's output is relu(shortcut(x)); every other BN keeps scale 1."""
    from torchvision.models.resnet import BasicBlock, Bottleneck

    torch.manual_seed(0)
    net = build_backbone({"backbone": name, "cifar_stem": True, "width": 8, "zero_init_residual": True})
    blocks = [m for m in net.modules() if isinstance(m, (BasicBlock, Bottleneck))]
    last = [b.bn3 if isinstance(b, Bottleneck) else b.bn2 for b in blocks]
    assert len(blocks) == (8 if name == "resnet18" else 16) and all(not bn.weight.any() for bn in last)
    others = [m for m in net.modules() if isinstance(m, nn.BatchNorm2d) and all(m is not bn for bn in last)]
    assert others and all(bool((m.weight == 1).all()) for m in others)
    block = blocks[1]  # no downsample: the shortcut is the identity
    x = torch.randn(2, block.conv1.in_channels, 8, 8)
    torch.testing.assert_close(block(x), torch.relu(x))
    plain = build_backbone({"backbone": name, "cifar_stem": True, "width": 8})
    assert all(bool((bn.weight == 1).all()) for bn in plain.modules() if isinstance(bn, nn.BatchNorm2d))


def test_split_bn_equals_bn_per_group():
    torch.manual_seed(0)
    x = torch.randn(8, 3, 4, 4)
    split = SplitBatchNorm2d(3, splits=2).train()
    ref = nn.BatchNorm2d(3).train()
    out = split(x)
    # group g holds samples g, g+2, g+4, ...
    for g in range(2):
        torch.testing.assert_close(out[g::2], ref(x[g::2]))


@pytest.mark.slow
def test_compiled_split_bn_gives_the_eager_output_gradients_and_running_statistics():
    """torch.compile of a split-BN layer (MoCo on one worker with train.compile=true): the whole-model compile test
    runs one BN group, since split BN there costs minutes of inductor C++ builds on a cold cache."""
    torch.manual_seed(0)
    x, w = torch.randn(8, 3, 4, 4), torch.randn(8, 4, 4, 4)  # w: a sum of squares of BN's output has ~0 gradient
    runs = []
    for compiled in (False, True):
        torch.manual_seed(1)
        net = nn.Sequential(nn.Conv2d(3, 4, 1), SplitBatchNorm2d(4, splits=2)).train()
        if compiled:
            net.compile()
        xi = x.clone().requires_grad_()
        out = net(xi)
        (out * w).sum().backward()
        bn = net[1]
        runs.append([out, xi.grad, net[0].weight.grad, bn.running_mean, bn.running_var, bn.num_batches_tracked])
    # Inductor's fused kernels sum in another order than eager's, and the order depends on the CPU's vector width:
    # CI's CPU put the conv weight's gradient 1.1e-5 off (rel 4e-5); a broken split BN puts the output and gradients
    # 0.1 to 10 off. The running statistics keep float32's default: whole-batch statistics move running_var by 6e-6.
    for i, (eager, compiled) in enumerate(zip(*runs)):
        torch.testing.assert_close(compiled, eager, **({"rtol": 1e-4, "atol": 1e-4} if i < 3 else {}))
    assert int(runs[1][-1]) == 1 and not torch.equal(runs[1][3], torch.zeros(4))  # the statistics did move


def test_convert_split_bn_replaces_all_bn2d():
    net = convert_split_bn(build_backbone({"backbone": "resnet18", "cifar_stem": True, "width": 8}), 4)
    bns = [m for m in net.modules() if isinstance(m, nn.BatchNorm2d)]
    assert bns and all(isinstance(m, SplitBatchNorm2d) for m in bns)
    net(torch.randn(8, 3, 16, 16))
    with pytest.raises(ValueError):
        net(torch.randn(6, 3, 16, 16))


def test_ema_update_and_frozen_copy():
    online = nn.Linear(3, 2)
    target = momentum_copy(online)
    assert not any(p.requires_grad for p in target.parameters())
    before = target.weight.clone()
    with torch.no_grad():
        online.weight.add_(1.0)
    ema_update(target, online, 0.9)
    torch.testing.assert_close(target.weight, 0.9 * before + 0.1 * online.weight)


def test_queue_is_fifo_and_wraps():
    q = Queue(5, 2)
    a = torch.arange(6.0).view(3, 2)
    q.push(a)
    torch.testing.assert_close(q.keys[:3], a)
    b = torch.arange(6.0, 12.0).view(3, 2)
    q.push(b)
    torch.testing.assert_close(q.keys[3:], b[:2])
    torch.testing.assert_close(q.keys[0], b[2])
    assert int(q.ptr) == 1
