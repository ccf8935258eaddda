import math

import pytest
import torch
from torch import nn

from pipeline.train.optim import LARS, build_optimizer, lr_at, param_groups, scaled_lr


def test_lr_schedule_warmup_then_cosine():
    peak, total, warm = 0.4, 100, 10
    assert lr_at(0, total, warm, peak) == pytest.approx(0.04)
    assert lr_at(9, total, warm, peak) == pytest.approx(peak)
    assert lr_at(10, total, warm, peak) == pytest.approx(peak)
    mid = 10 + 45
    assert lr_at(mid, total, warm, peak) == pytest.approx(peak / 2)
    assert lr_at(total, total, warm, peak) == pytest.approx(0.0, abs=1e-12)
    lrs = [lr_at(s, total, warm, peak) for s in range(warm, total)]
    assert all(a >= b for a, b in zip(lrs, lrs[1:]))


def test_scaled_lr():
    assert scaled_lr(0.03, 512) == pytest.approx(0.06)


def test_param_groups_exclude_bias_and_norm_from_decay():
    m = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    decay, no_decay = param_groups(m, 1e-4)
    assert [p.shape for p in decay["params"]] == [torch.Size([4, 4])]
    assert len(no_decay["params"]) == 3 and no_decay["weight_decay"] == 0.0


def test_lars_step_is_trust_ratio_scaled_sgd():
    torch.manual_seed(0)
    w = nn.Parameter(torch.randn(3, 3))
    w.grad = torch.randn(3, 3)
    w0, g = w.detach().clone(), w.grad.clone()
    opt = LARS([{"params": [w], "weight_decay": 0.1, "lars": True}], lr=0.5, momentum=0.9, eta=0.02)
    opt.step()
    d = g + 0.1 * w0
    expected = w0 - 0.5 * (0.02 * w0.norm() / d.norm()) * d
    torch.testing.assert_close(w.detach(), expected)


def test_build_optimizer_rejects_unknown():
    with pytest.raises(ValueError, match="unknown optimizer"):
        build_optimizer(nn.Linear(2, 2), {"name": "adamx", "weight_decay": 0, "momentum": 0.9}, 0.1)


def test_sgd_optimizer_groups():
    opt = build_optimizer(nn.Linear(2, 2), {"name": "sgd", "weight_decay": 1e-4, "momentum": 0.9}, 0.1)
    assert isinstance(opt, torch.optim.SGD)
    assert [g["weight_decay"] for g in opt.param_groups] == [1e-4, 0.0]
    assert not math.isnan(opt.param_groups[0]["lr"])
