import copy
import math

import pytest
import torch
from torch import nn

from helpers import optim
from pipeline.schedules import scaled_lr
from pipeline.schedules import warmup_cosine as lr_at
from pipeline.train.optim import LARS, build_optimizer, param_groups


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
    with pytest.raises(ValueError, match="optim.name=adamx: expected one of sgd, lars, adamw"):
        build_optimizer(nn.Linear(2, 2), {"name": "adamx", "weight_decay": 0, "momentum": 0.9}, 0.1)


def test_sgd_optimizer_groups():
    opt = build_optimizer(nn.Linear(2, 2), optim(weight_decay=1e-4), 0.1)
    assert isinstance(opt, torch.optim.SGD)
    assert [g["weight_decay"] for g in opt.param_groups] == [1e-4, 0.0]
    assert not math.isnan(opt.param_groups[0]["lr"])


# ----------------------------------------------------------------------------- multi-tensor LARS and SGD
def _mixed_model() -> nn.Module:
    torch.manual_seed(1)
    m = nn.Sequential(nn.Linear(5, 7), nn.BatchNorm1d(7), nn.Linear(7, 3), nn.Linear(3, 2, bias=False))
    with torch.no_grad():
        m[1].weight.uniform_(0.5, 1.5)
        m[1].bias.normal_()
        m[3].weight.zero_()  # ||w|| = 0: trust ratio 1
    return m


def _lars_reference(
    groups: list[dict],
    grads: list[list[torch.Tensor]],
    lr: float,
    momentum: float,
    eta: float,
    *,
    trust: str = "right",
    decay: str = "lars",
) -> list[torch.Tensor]:
    """The LARS equations per tensor in float64: for lars groups d = g + wd*w, times eta*||w||/||d|| where both
    norms are > 0 (else 1); lars=False groups: d = g; buf = d on the first step, then m*buf + d; w -= lr*buf.
    `grads[t][i]` is parameter i's gradient at step t (None: skipped). The keyword arguments make the wrong
    variants the test must tell apart: trust="gradient" (||g|| instead of ||g + wd*w||), trust="none",
    decay="none" (no weight decay), decay="all" (weight decay on lars=False groups too)."""
    flat = [(p.detach().double().clone(), g) for g in groups for p in g["params"]]
    w = [p for p, _ in flat]
    bufs: list[torch.Tensor | None] = [None] * len(w)
    for step in grads:
        for i, ((_, group), g) in enumerate(zip(flat, step)):
            if g is None:
                continue
            g = g.double()
            wd = group["weight_decay"] if (group["lars"] and decay == "lars") or decay == "all" else 0.0
            d = g + wd * w[i]
            if group["lars"] and trust != "none":
                dn = (g if trust == "gradient" else d).norm()
                wn = w[i].norm()
                d = d * (eta * wn / dn if wn > 0 and dn > 0 else 1.0)
            bufs[i] = d.clone() if bufs[i] is None else momentum * bufs[i] + d
            w[i] = w[i] - lr * bufs[i]
    return w


def test_multi_tensor_lars_equals_the_per_tensor_equations():
    """Three steps on a model with a lars group (two weights, one of them zero), a lars=False group with a
    weight decay that must be ignored, and a parameter without a gradient at step 2."""
    model = _mixed_model()
    decay, no_decay = param_groups(model, 0.5)
    no_decay["weight_decay"] = 0.3  # lars=False groups take no weight decay, whatever their setting
    groups = [decay, no_decay]
    lr, momentum, eta = 0.7, 0.9, 0.02
    start = [{**g, "params": [p.detach().clone() for p in g["params"]]} for g in groups]
    opt = LARS(groups, lr=lr, momentum=momentum, eta=eta)
    params = [p for g in groups for p in g["params"]]
    gen = torch.Generator().manual_seed(0)
    grads = []
    for t in range(3):
        step = [torch.randn(p.shape, generator=gen) for p in params]
        if t == 1:
            step[len(decay["params"])] = None  # the first no-decay parameter sits this step out
        for p, g in zip(params, step):
            p.grad = None if g is None else g.clone()
        opt.step()
        grads.append(step)

    got = [p.detach().double() for p in params]
    expected = _lars_reference(start, grads, lr, momentum, eta)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    # the test sees the mistakes it is there for
    for wrong in ({"trust": "gradient"}, {"trust": "none"}, {"decay": "none"}, {"decay": "all"}):
        off = _lars_reference(start, grads, lr, momentum, eta, **wrong)
        assert max(float((a - b).abs().max()) for a, b in zip(got, off)) > 1e-3, wrong
    # state_dict layout of torch's SGD; the skipped parameter got its buffer at step 1 and kept it
    assert all("momentum_buffer" in opt.state[p] for p in params)
    assert set(opt.state_dict()["state"][0]) == {"momentum_buffer"}


def test_lars_leaves_gradients_alone_and_skips_params_without_grad():
    w = nn.Parameter(torch.randn(4, 3))
    idle = nn.Parameter(torch.randn(4))
    w.grad = torch.randn(4, 3)
    g0, idle0 = w.grad.clone(), idle.detach().clone()
    opt = LARS(
        [{"params": [w], "weight_decay": 0.0, "lars": True}, {"params": [idle], "weight_decay": 0.0, "lars": False}],
        lr=0.1,
        eta=0.01,
    )
    opt.step()
    torch.testing.assert_close(w.grad, g0, rtol=0, atol=0)
    torch.testing.assert_close(idle.detach(), idle0, rtol=0, atol=0)
    assert idle not in opt.state


def test_lars_state_dict_round_trip():
    model = _mixed_model()
    opt = build_optimizer(model, optim(name="lars", weight_decay=1e-3, eta=1e-3), 0.5)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    twin = _mixed_model()
    twin.load_state_dict(model.state_dict())
    opt2 = build_optimizer(twin, optim(name="lars", weight_decay=1e-3, eta=1e-3), 0.5)
    opt2.load_state_dict(copy.deepcopy(opt.state_dict()))  # as from disk: torch shares same-device tensors
    for m_, o in ((model, opt), (twin, opt2)):
        for p in m_.parameters():
            p.grad = torch.full_like(p, 0.5)
        o.step()
    for a, b in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_sgd_uses_foreach_on_cpu_and_matches_the_for_loop():
    cfg = optim(weight_decay=5e-4)
    model, ref_model = _mixed_model(), _mixed_model()
    opt = build_optimizer(model, cfg, 0.3)
    assert opt.defaults["foreach"] is True and not opt.defaults.get("fused")
    ref = torch.optim.SGD(
        [
            {"params": [p for p in ref_model.parameters() if p.ndim > 1], "weight_decay": 5e-4},
            {"params": [p for p in ref_model.parameters() if p.ndim <= 1], "weight_decay": 0.0},
        ],
        lr=0.3,
        momentum=0.9,
        foreach=False,
        fused=False,
    )
    x = torch.randn(16, 5, generator=torch.Generator().manual_seed(3))
    for _ in range(3):
        for m_, o in ((model, opt), (ref_model, ref)):
            o.zero_grad()
            m_(x).square().mean().backward()
            o.step()
    for a, b in zip(model.parameters(), ref_model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_sgd_kernel_choice_and_checkpoints_from_another_machine():
    from types import SimpleNamespace

    from pipeline.train.optim import sgd_kernels

    on = lambda kind: SimpleNamespace(device=torch.device(kind))  # noqa: E731  (no GPU needed)
    assert sgd_kernels([on("cuda"), on("cuda")]) == {"fused": True, "foreach": False}
    assert sgd_kernels([on("cuda"), on("cpu")]) == {"foreach": True, "fused": False}
    assert sgd_kernels([]) == {"foreach": True, "fused": False}
    # a state dict saved with other kernels (e.g. fused, on a GPU) keeps this machine's choice
    model = _mixed_model()
    opt = build_optimizer(model, optim(weight_decay=1e-4), 0.1)
    state = opt.state_dict()
    for g in state["param_groups"]:
        g.update(fused=True, foreach=False)
    opt.load_state_dict(state)
    assert all(g["foreach"] is True and g["fused"] is False for g in opt.param_groups)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    opt.step()


# ----------------------------------------------------------------------------- SimSiam's fixed predictor lr


def test_simsiam_predictor_keeps_the_initial_lr_as_the_authors_adjust_learning_rate_does(tmp_path):
    """facebookresearch/simsiam main_simsiam.py, adjust_learning_rate: cur_lr = init_lr * 0.5 * (1 + cos(pi *
    epoch / epochs)) for every group, but `fix_lr` groups (the predictor's, with --fix-pred-lr) get init_lr. Ours
    steps the same cosine per optimisation step (no warm-up in SimSiam's recipe)."""
    from pipeline.build import build_method
    from pipeline.config import compose_config
    from pipeline.train.step import schedule_step

    cfg = compose_config([f"paths.root={tmp_path}", "method=simsiam", "optim.warmup_epochs=0"])
    assert cfg["method"]["fix_predictor_lr"] is True
    method = build_method(cfg)
    pred = list(method.online.predictor.parameters())
    assert [id(p) for p in method.fixed_lr_parameters()] == [id(p) for p in pred]  # what the loop asks the method
    cfg_off = compose_config([f"paths.root={tmp_path}", "method=simsiam", "method.fix_predictor_lr=false"])
    assert build_method(cfg_off).fixed_lr_parameters() == []
    init_lr, total = 0.05 * 512 / 256, 40
    opt = build_optimizer(method.online, cfg["optim"], init_lr, method.fixed_lr_parameters())
    in_pred = [g for g in opt.param_groups if any(p is q for p in g["params"] for q in pred)]
    assert all(g.get("fixed_lr") for g in in_pred) and sum(len(g["params"]) for g in in_pred) == len(pred)
    rest = [g for g in opt.param_groups if not g.get("fixed_lr")]
    assert sum(len(g["params"]) for g in rest) == len(list(method.online.parameters())) - len(pred)
    for step in (0, 10, 20, 39):
        schedule_step(opt, optim(min_lr=0.0), step, total, 0, init_lr)
        cur_lr = init_lr * 0.5 * (1.0 + math.cos(math.pi * step / total))
        assert all(g["lr"] == pytest.approx(cur_lr) for g in rest)
        assert all(g["lr"] == init_lr for g in in_pred)
    # the predictor's groups follow the same decay rule as the rest: weights decayed, biases and BN not
    assert sorted(g["weight_decay"] for g in in_pred) == [0.0, cfg["optim"]["weight_decay"]]


def test_fix_predictor_lr_refused_without_a_predictor(tmp_path):
    from pipeline.config import ConfigError, compose_config
    from pipeline.schema import validate

    with pytest.raises(ConfigError, match=r"method.fix_predictor_lr=true: .*method=simclr has no predictor"):
        validate(compose_config([f"paths.root={tmp_path}", "method=simclr", "+method.fix_predictor_lr=true"]))
