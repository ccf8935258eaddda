"""CoCor's parts (docs/methods/cocor.md): the monotone target network, the consistency loss forms, the finite-difference
hypergradient of the target network."""

import pytest
import torch
import torch.nn.functional as F

from pipeline.losses.cocor import COCOR_FORMS, cocor_consistency, cocor_target_surrogate
from pipeline.models.mmnn import MonotoneTarget, random_counts


def _scrambled(seed: int) -> MonotoneTarget:
    """A target network with arbitrary (not just initial) weights: monotonicity must hold for every θd."""
    torch.manual_seed(seed)
    g = MonotoneTarget(14, 32)
    with torch.no_grad():
        for p in g.parameters():
            p.copy_(torch.randn_like(p) * 2)
    return g


@pytest.mark.parametrize("seed", range(5))
def test_target_is_non_increasing_when_any_count_grows(seed):
    g = _scrambled(seed)
    gen = torch.Generator().manual_seed(seed)
    v = random_counts(2000, 3, 14, gen) * torch.randint(0, 3, (2000, 1), generator=gen)
    extra = torch.randint(0, 3, (2000, 14), generator=gen) * (torch.rand(2000, 14, generator=gen) < 0.3)
    stronger = v + extra  # contains every op of v, plus more: v(A_i) ≻ v(A_j) where extra > 0
    grew = extra.sum(1) > 0
    assert grew.sum() > 1000
    with torch.no_grad():
        a, b = g(v), g(stronger)
    assert (b[grew] <= a[grew] + 1e-6).all()
    assert (a < 1.0).all()  # a cosine similarity target stays below 1
    # and it is not constant: the check above would pass trivially for a flat network
    assert (a[grew] - b[grew]).max() > 1e-3


def test_random_counts_follow_definition_2():
    gen = torch.Generator().manual_seed(0)
    v = random_counts(20000, 3, 14, gen)
    assert (v.sum(1) == 3).all() and (v >= 0).all()
    # uniform with replacement: each op's mean count is 3/14, and doubles occur (P = 1 - 13·12/14² for some repeat)
    assert torch.allclose(v.mean(0), torch.full((14,), 3 / 14), atol=0.02)
    repeat = (v.max(1).values > 1).float().mean()
    assert abs(float(repeat) - (1 - 13 * 12 / 14**2)) < 0.02


def test_fit_constants_starts_from_table_9():
    torch.manual_seed(0)
    g = MonotoneTarget(14, 64)
    table9 = {1: 0.80, 2: 0.75, 3: 0.65}
    mse = g.fit_constants(table9, 14, steps=300)
    assert mse < 1e-3
    per = g.per_length(14, [1, 2, 3])
    assert per == pytest.approx([0.80, 0.75, 0.65], abs=0.03)


def test_fit_constants_runs_once_per_start_and_constants_and_gives_what_a_fresh_fit_gives(monkeypatch):
    """The fit is kept per process (the config check builds the plug-in, and the reproductions name dozens of
    runs): the same start and constants load the kept weights, which are the fit's own; another start or other
    constants fit anew; the caller's thread count is left as it was."""
    from pipeline.models import mmnn

    monkeypatch.setattr(mmnn, "_FITTED", {})
    table9 = {1: 0.80, 2: 0.75, 3: 0.65}
    threads = torch.get_num_threads()
    first = MonotoneTarget(14, 64, seed=3)
    fresh = MonotoneTarget(14, 64, seed=3)
    mse = first.fit_constants(table9, 14, steps=50)
    assert torch.get_num_threads() == threads and len(mmnn._FITTED) == 1
    fits = []
    monkeypatch.setattr(MonotoneTarget, "_fit", lambda self, *a: fits.append(a) or 0.0)
    assert fresh.fit_constants(table9, 14, steps=50) == mse and not fits  # kept, not fitted again
    for a, b in zip(first.parameters(), fresh.parameters()):
        assert torch.equal(a, b)
    MonotoneTarget(14, 64, seed=4).fit_constants(table9, 14, steps=50)  # another start
    MonotoneTarget(14, 64, seed=3).fit_constants({**table9, 3: 0.6}, 14, steps=50)  # other constants
    assert len(fits) == 2
    monkeypatch.undo()
    monkeypatch.setattr(mmnn, "_FITTED", {})  # the kept weights are exactly what fitting from scratch gives
    again = MonotoneTarget(14, 64, seed=3)
    again.fit_constants(table9, 14, steps=50)
    for a, b in zip(first.parameters(), again.parameters()):
        assert torch.equal(a, b)


def _reference(sims, targets, form):
    s = [x.double() for x in sims]
    t = [x.double() for x in targets]
    sp = lambda x: torch.log1p(torch.exp(x))  # noqa: E731
    if form == "code":
        return sum(sp(sum(tt) / len(tt) - sum(ss) / len(ss)) for ss, tt in zip(s, t))
    if form == "eq11":
        return sum(sp(ss.mean() - tt.mean()) for ss, tt in zip(s, t)) / len(s)
    per = [sum(abs(float(a) - float(b)) for a, b in zip(ss, tt)) / len(ss) for ss, tt in zip(s, t)]
    if form == "eq7":
        return sum(sp(torch.tensor(p, dtype=torch.float64)) for p in per) / len(per)
    return sum(per) / len(per)


@pytest.mark.parametrize("form", COCOR_FORMS)
def test_consistency_forms_match_their_equations(form):
    g = torch.Generator().manual_seed(1)
    sims = [torch.rand(16, generator=g) * 2 - 1 for _ in range(3)]
    targets = [torch.rand(16, generator=g) for _ in range(3)]
    got = cocor_consistency(sims, targets, form)
    assert float(got) == pytest.approx(float(_reference(sims, targets, form)), rel=1e-5)


def test_consistency_sign_pulls_a_low_similarity_up_and_leaves_a_high_one():
    """The known case: a composite whose similarity is below its target is pulled towards the original (the
    gradient on s is negative, so descent raises s); one above its target gets a smaller push."""
    target = [torch.full((8,), 0.7)]
    low = [torch.full((8,), 0.1, requires_grad=True)]
    high = [torch.full((8,), 0.99, requires_grad=True)]
    cocor_consistency(low, target, "code").backward()
    cocor_consistency(high, target, "code").backward()
    g_low, g_high = low[0].grad.sum(), high[0].grad.sum()
    assert g_low < 0 and g_high < 0
    # softplus at unit scale: σ(0.7 − 0.99) ≈ 0.43 against σ(0.7 − 0.1) ≈ 0.65, so the push fades above the target
    assert abs(g_high) < abs(g_low)
    assert float(g_high) == pytest.approx(-torch.sigmoid(torch.tensor(0.7 - 0.99)).item(), rel=1e-4)
    # eq11 as printed does the opposite: it pushes every similarity down, hardest when above the target
    high2 = [torch.full((8,), 0.99, requires_grad=True)]
    cocor_consistency(high2, target, "eq11").backward()
    assert high2[0].grad.sum() > 0


def test_consistency_rejects_unknown_form():
    with pytest.raises(ValueError, match="unknown CoCor consistency form"):
        cocor_consistency([torch.zeros(2)], [torch.zeros(2)], "abs")


def test_surrogate_gradient_is_eq_20():
    theta = torch.tensor([0.3, -0.2, 0.5], requires_grad=True)
    g_bar = torch.tanh(theta)  # any differentiable ḡ_l(θd)
    s0, s1 = torch.tensor([0.9, 0.8, 0.7]), torch.tensor([0.92, 0.79, 0.75])
    sur = cocor_target_surrogate(g_bar, s0, s1, ce_before=2.0, ce_after=1.9, lu_before=5.0, lu_after=4.8, sign=1.0)
    sur.backward()
    k = (s1 - g_bar).detach().double()
    slope = torch.exp(k) / (1 + torch.exp(k)) ** 2
    expected = slope * ((1.9 - 2.0) / (4.8 - 5.0)) * (s1 - s0).double() * (1 - torch.tanh(theta.detach()).double() ** 2)
    assert torch.allclose(theta.grad.double(), expected, atol=1e-6)
    # the denominator guard: |L_u' - L_u| below 1e-4 is replaced by ±1e-4, keeping its sign
    theta.grad = None
    cocor_target_surrogate(torch.tanh(theta), s0, s1, 2.0, 1.9, 5.0, 5.0 - 1e-7, sign=1.0).backward()
    assert torch.allclose(theta.grad.double(), expected * (-0.2 / -1e-4), rtol=1e-4)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("form", ["code", "eq11"])
def test_surrogate_follows_the_exact_hypergradient(seed, form):
    """A one-parameter encoder where d CE(θe'(θd))/dθd is computed exactly by autograd through the encoder step:
    the derived sign (−1) agrees with it in sign and nearly in size; Eq. 20's printed sign (+1) points the other way."""
    gen = torch.Generator().manual_seed(seed)
    a, t, c0, theta_e = (torch.randn(4, generator=gen, dtype=torch.float64)).unbind()
    eta = 1e-3
    sim = lambda th: torch.tanh(a * th)  # noqa: E731  latent similarity s(θe)
    ce = lambda th: (th - t) ** 2  # noqa: E731  labelled loss CE(θe)
    contrast = lambda th: (th - c0) ** 2  # noqa: E731

    def lu(th, g):
        k = g - sim(th) if form == "code" else sim(th) - g
        return contrast(th) + F.softplus(k)

    theta_d = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
    th = theta_e.clone().requires_grad_(True)
    (grad_e,) = torch.autograd.grad(lu(th, theta_d), th, create_graph=True)
    th1 = th - eta * grad_e
    (exact,) = torch.autograd.grad(ce(th1), theta_d)

    with torch.no_grad():
        s_before, s_after = sim(theta_e), sim(th1)
        before = (float(ce(theta_e)), float(lu(theta_e, theta_d)))
        after = (float(ce(th1)), float(lu(th1, theta_d)))
    theta_d.grad = None
    g_bar = theta_d.reshape(1) * 1.0
    cocor_target_surrogate(
        g_bar,
        s_before.reshape(1),
        s_after.reshape(1),
        before[0],
        after[0],
        before[1],
        after[1],
        min_denominator=0.0,
        sign=-1.0,
    ).backward()
    # the secants carry the encoder step's η (Δθe = −η∇L_u), so the surrogate estimates the hypergradient itself
    assert float(theta_d.grad) == pytest.approx(float(exact), rel=0.05, abs=1e-9)
    assert float(theta_d.grad) * float(exact) >= 0


# ----------------------------------------------------------------------------- the plug-in on its frameworks
from torch import nn  # noqa: E402

from pipeline.build import build_method  # noqa: E402
from pipeline.config import compose_config  # noqa: E402
from pipeline.data.labelled import LabelledBatches  # noqa: E402
from pipeline.data.reader import Split  # noqa: E402
from pipeline.losses.contrastive import info_nce  # noqa: E402
from pipeline.methods.base import Encoder  # noqa: E402
from pipeline.train.plugin_optim import PluginOptimizers  # noqa: E402


class _Backbone(nn.Sequential):
    feat_dim = 12


def _linear_encoder():
    torch.manual_seed(0)
    return Encoder(_Backbone(nn.Flatten(), nn.Linear(3 * 4 * 4, 12)), nn.Linear(12, 16))


def _cfg(*overrides):
    cfg = compose_config(
        [
            "+experiment=cocor_mocov2",
            "data=spirograph",
            "model.width=8",
            "method.queue_size=32",
            "method.head.out_dim=16",
            "method.bn_splits=1",
            "method.symmetric=false",
            *overrides,
        ]
    )
    return cfg


def _views(n=8, seed=1):
    g = torch.Generator().manual_seed(seed)
    images = [torch.randn(n, 3, 4, 4, generator=g) for _ in range(5)]
    params = [{}, {}] + [{"counts": random_counts(n, length, 14, g)} for length in (1, 2, 3)]
    return images, params


def test_fixed_targets_add_the_consistency_of_table_9_to_moco():
    m = build_method(_cfg("plugin.cocor.target=fixed"))
    m.online, m.key_encoder = _linear_encoder(), _linear_encoder()
    queue = m.queue.keys.clone()
    images, params = _views()
    out = m.total_loss(images, params)
    with torch.no_grad():
        f = lambda x: F.normalize(m.online(x), dim=1)  # noqa: E731
        anchor = F.normalize(f(images[0]) + f(images[1]), dim=1)
        k = F.normalize(m.key_encoder(images[1]), dim=1)
    sims = [(f(images[i]) * anchor).sum(1) for i in (2, 3, 4)]
    term = sum(F.softplus(torch.tensor(c) - s.mean()) for c, s in zip((0.80, 0.75, 0.65), sims))
    assert out["cocor_consistency"].item() == pytest.approx(term.item(), rel=1e-5)
    base = info_nce(f(images[0]), k, queue, 0.2)
    assert out["loss"].item() == pytest.approx((base + term).item(), rel=1e-5)
    assert out["cocor_target_l3"].item() == pytest.approx(0.65)
    out["loss"].backward()
    assert all(p.grad is not None for p in m.online.parameters())


def test_fixed_targets_follow_the_framework_table_9_gives():
    """SimSiam's row of Table 9 (0.75, 0.70, 0.60), not MoCo's, and the constants are the targets of every sample."""
    m = build_method(
        compose_config(["+experiment=cocor_simsiam", "data=spirograph", "model.width=8", "plugin.cocor.target=fixed"])
    )
    plugin = m.plugins[0]
    assert plugin.constants == {1: 0.75, 2: 0.70, 3: 0.60}
    _, params = _views()
    targets = plugin._targets(params, "cpu")
    expected = torch.tensor([0.75, 0.70, 0.60]).repeat_interleave(8).view(3, 8)  # float32, as the loop's
    assert torch.equal(torch.stack(targets), expected)


def _learned(*overrides):
    m = build_method(_cfg("plugin.cocor.target_freeze_epochs=0", "plugin.cocor.target_warmup_epochs=0", *overrides))
    m.online, m.key_encoder = _linear_encoder(), _linear_encoder()
    plugin = m.plugins[0]
    plugin.attach(m)
    # a labelled subset in memory instead of shards: 4 regression targets from a fixed linear map of the pixels
    g = torch.Generator().manual_seed(5)
    x_all = torch.randn(32, 3, 4, 4, generator=g)
    y_all = x_all.flatten(1)[:, :4].numpy()
    split = Split([bytes([i]) for i in range(32)], y_all, ["m", "b", "sigma", "f_r"])
    pre = lambda enc: (x_all[[e[0] for e in enc]], np.arange(len(enc)))  # noqa: E731
    plugin._labelled = LabelledBatches(
        split, pre, plugin.labelled_batch, torch.Generator().manual_seed(0), "regression"
    )
    return m, plugin


def _outer_step(m, images, params, out, progress, owned=None):
    """The loop's step of the plug-in's own optimisers after the encoder's (pipeline.train.plugin_optim)."""
    return (owned or PluginOptimizers(m.plugins)).step(m, images, params, out, progress)


import numpy as np  # noqa: E402


def test_learned_target_update_leaves_the_encoder_and_its_buffers_alone():
    m, plugin = _learned()
    opt = torch.optim.SGD(m.online.parameters(), lr=0.5)
    images, params = _views()
    target0 = [p.detach().clone() for p in plugin.target.parameters()]
    head0 = [p.detach().clone() for p in plugin.classifier.parameters()]
    out = m.total_loss(images, params)
    opt.zero_grad()
    out["loss"].backward()
    opt.step()
    online = [p.detach().clone() for p in m.online.parameters()]
    buffers = {n: b.clone() for n, b in m.named_buffers()}
    logged = _outer_step(m, images, params, out, progress=0.5)
    assert set(logged) >= {"cocor_outer_loss", "cocor_outer_gain", "cocor_target_lr"}
    assert all(np.isfinite(v) for v in logged.values()) and logged["cocor_target_lr"] > 0
    # the second forward at θe' changed nothing of the encoder's: weights, queue, BN statistics
    assert all(torch.equal(a, b) for a, b in zip(online, m.online.parameters()))
    assert all(torch.equal(buffers[n], b) for n, b in m.named_buffers())
    # the target network and the linear head moved, and the target is still monotone
    assert any(not torch.equal(a, b) for a, b in zip(target0, plugin.target.parameters()))
    assert any(not torch.equal(a, b) for a, b in zip(head0, plugin.classifier.parameters()))
    per = plugin.target.per_length(14, [1, 2, 3, 6])
    assert per == sorted(per, reverse=True)


def _one_outer_step(m, owned):
    images, params = _views()
    out = m.total_loss(images, params)
    owned.step(m, images, params, out, progress=0.5)


def test_the_loop_checkpoints_the_plugins_optimisers():
    """The optimisers' state (momentum) and the step count round-trip through the loop's checkpoint entry."""
    m, _ = _learned()
    owned = PluginOptimizers(m.plugins)
    for _ in range(2):
        _one_outer_step(m, owned)
    saved = owned.state_dict()
    assert saved["cocor"]["updates"] == 2 and set(saved["cocor"]["optimizers"]) == {"target", "classifier"}
    fresh, _ = _learned()
    restored = PluginOptimizers(fresh.plugins)
    restored.load_state_dict(saved)
    assert restored.updates == {"cocor": 2}
    for name in ("target_opt", "classifier_opt"):
        a, b = getattr(m.plugins[0], name).state_dict(), getattr(fresh.plugins[0], name).state_dict()
        assert a["state"].keys() == b["state"].keys() and a["state"]
        for k in a["state"]:
            assert torch.equal(a["state"][k]["momentum_buffer"], b["state"][k]["momentum_buffer"])


def test_a_step_without_the_plugins_optimisers_is_refused():
    from pipeline.train.step import optimisation_step

    m, _ = _learned()
    images, params = _views()
    with pytest.raises(ValueError, match="optimisers of their own"):
        optimisation_step(
            m, torch.optim.SGD(m.online.parameters(), lr=0.1), images, params, "fp32", torch.device("cpu"), 0.5
        )


def test_target_network_waits_for_its_warm_up():
    m, plugin = _learned("plugin.cocor.target_freeze_epochs=3")
    plugin.freeze_steps = 3
    images, params = _views()
    before = [p.detach().clone() for p in plugin.target.parameters()]
    owned = PluginOptimizers(m.plugins)
    for _ in range(2):
        out = m.total_loss(images, params)
        _outer_step(m, images, params, out, 0.1, owned)
    assert all(torch.equal(a, b) for a, b in zip(before, plugin.target.parameters()))


def _two_rank_worker(rank, world, port, q):
    from helpers import init_gloo

    init_gloo(rank, world, port)
    m, plugin = _learned()
    plugin._labelled.generator.manual_seed(rank)  # each rank draws its own labelled batch
    images, params = _views(seed=rank + 3)
    m.online = nn.parallel.DistributedDataParallel(m.online)
    opt = torch.optim.SGD(m.online.parameters(), lr=0.5)
    out = m.total_loss(images, params)
    out["loss"].backward()
    opt.step()  # θe -> θe': without an encoder step the hypergradient is zero (s' = s)
    _outer_step(m, images, params, out, progress=0.5)
    # numpy arrays travel by value (tensors would be shared with a process that is about to exit)
    q.put(
        (
            rank,
            [p.detach().numpy().copy() for p in plugin.target.parameters()],
            [p.detach().numpy().copy() for p in plugin.classifier.parameters()],
        )
    )
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def test_target_network_and_head_stay_identical_across_workers():
    from helpers import run_process_group

    results = run_process_group(_two_rank_worker, 2)
    (_, t0, h0), (_, t1, h1) = [
        (r, [torch.from_numpy(a) for a in t], [torch.from_numpy(a) for a in h]) for r, t, h in results
    ]
    assert all(torch.equal(a, b) for a, b in zip(t0, t1)), [float((a - b).abs().max()) for a, b in zip(t0, t1)]
    assert all(torch.equal(a, b) for a, b in zip(h0, h1)), [float((a - b).abs().max()) for a, b in zip(h0, h1)]
    # and they did move (the average of two different updates)
    fresh = _learned()[1]
    assert any(not torch.equal(a, b) for a, b in zip(t0, fresh.target.parameters()))


def test_cocor_misconfigurations_fail_with_one_line():
    with pytest.raises(ValueError, match="composite"):
        build_method(_cfg("augment=mocov2"))
    with pytest.raises(ValueError, match="form"):
        build_method(_cfg("plugin.cocor.form=abs"))
    with pytest.raises(ValueError, match="no target for composite lengths"):
        build_method(_cfg("plugin.cocor.target=fixed", "plugin.cocor.fixed_targets=[0.8]"))
    for bad in ("0", "-3", "1.5", "true"):
        with pytest.raises(ValueError, match=f"plugin.cocor.target_lr_match={bad}: expected an integer >= 1 or null"):
            build_method(_cfg(f"+plugin.cocor.target_lr_match={bad}"))


def test_a_non_finite_outer_loss_never_reaches_the_target_network():
    m, plugin = _learned()
    with torch.no_grad():
        plugin.classifier.weight.fill_(float("inf"))
    images, params = _views()
    target0 = [p.detach().clone() for p in plugin.target.parameters()]
    out = m.total_loss(images, params)
    logged = _outer_step(m, images, params, out, progress=0.5)
    assert logged["cocor_skipped_updates"] == 1.0
    assert all(torch.equal(a, b) for a, b in zip(target0, plugin.target.parameters()))


def test_a_matched_target_step_adds_up_to_the_codes_number_of_updates():
    """target_lr_match=N scales the target network's schedule so that the run's updates add up to the learning rate
    of N updates at the code's step: 10x for N = 10 x the run's updates, the schedule's shape unchanged."""

    def lrs(*overrides):
        _, plugin = _learned("train.epochs=10", *overrides)
        plugin.schedule(50)  # 500 updates, none frozen (the helper sets no freeze, no warm-up)
        out = []
        for u in range(500):
            out.append(plugin._target_lr(u))
        return np.array(out)

    base, matched = lrs(), lrs("+plugin.cocor.target_lr_match=5000")
    assert base[0] == pytest.approx(0.05) and matched == pytest.approx(10 * base)
    assert matched.sum() == pytest.approx(5000 / 500 * base.sum())


def test_surrogate_from_tensors_equals_the_one_from_python_numbers():
    """The plug-in passes 0-dim tensors (no read back to the host mid-step): the same gradient, bit for bit, as
    from the numbers they hold, the denominator's floor included."""
    gen = torch.Generator().manual_seed(3)
    s0, s1 = torch.rand(3, generator=gen), torch.rand(3, generator=gen)
    for lu_after in (4.8, 5.0 - 1e-7, 5.0 + 3e-5):
        tensors = tuple(torch.tensor(v) for v in (2.0, 1.9, 5.0, lu_after))  # float32, as the losses are
        grads = []
        for args in (tensors, tuple(float(t) for t in tensors)):
            theta = torch.tensor([0.3, -0.2, 0.5], requires_grad=True)
            cocor_target_surrogate(torch.tanh(theta), s0, s1, *args, sign=-1.0).backward()
            grads.append(theta.grad)
        assert torch.equal(grads[0], grads[1]) and grads[0].abs().sum() > 0


def test_labelled_batches_drawn_ahead_are_the_same_batches_in_the_same_order():
    decoded = []

    def transform(encoded):
        decoded.append(len(encoded))
        return torch.stack([torch.full((3, 2, 2), float(e[0])) for e in encoded]), np.arange(len(encoded))

    split = Split([bytes([i]) for i in range(40)], np.arange(40) % 5, None)
    serial = LabelledBatches(split, transform, 8, torch.Generator().manual_seed(4), "classification")
    ahead = LabelledBatches(split, transform, 8, torch.Generator().manual_seed(4), "classification", ahead=True)
    for _ in range(6):
        (xa, ya), (xb, yb) = serial.next(), ahead.next()
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    # the next batch is already being made: 6 drawn by the serial one, 7 by the one ahead
    ahead._next.result()
    assert len(decoded) == 13


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (none on this machine)")
def test_the_outer_step_reads_nothing_back_from_the_gpu_but_its_finite_check():
    """On an H100 the project's CoCor step ran at 0.79x a bare loop's: floats read back mid-step stall the GPU's
    queue. Under CUDA's sync debug mode, the labelled batch (drawn ahead into pinned memory), its labelled loss,
    outer_loss and after_outer_step make no synchronising call."""
    m, plugin = _learned()
    m.cuda()
    plugin.cuda()
    old = plugin._labelled
    plugin._labelled = LabelledBatches(
        old.split, old.transform, old.batch, torch.Generator().manual_seed(0), "regression", ahead=True, pin=True
    )
    images, params = _views()
    images = [x.cuda() for x in images]
    params = [{k: v.cuda() for k, v in p.items()} for p in params]
    out = m.total_loss(images, params)  # the framework's step, outside the check
    out["loss"].backward()
    device = images[0].device
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        x, y = plugin._labelled_batch(device)
        assert x.is_pinned() and y.is_pinned()
        plugin._outer_loss(m, x, y)
        loss, logged = plugin.outer_loss(m, images, params, out)
        loss.backward()
        plugin.after_outer_step(m, params)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert all(torch.is_tensor(v) for v in logged.values())


def test_a_regression_sets_labelled_subset_is_its_fraction_floored_at_eight(tmp_path):
    """1 % of 512 Spirograph samples is 5; a regression head's outer loss needs more: the plug-in's subset is 8 of
    them (classes get at least one each instead: choose's per-class rule)."""
    from pipeline.data.labelled import choose, labelled_subset
    from pipeline.data.spirograph_shards import make_spirograph_splits

    make_spirograph_splits(tmp_path, n_train=512, n_val=8, maxcount=256, progress=False)
    targets = ["m", "b", "sigma", "f_r"]  # conf/data/spirograph.yaml's
    split = labelled_subset(str(tmp_path / "train"), "regression", targets, 0.01, seed=0)
    assert len(split.encoded) == 8 and len({bytes(e) for e in split.encoded}) == 8
    assert len(labelled_subset(str(tmp_path / "train"), "regression", targets, 0.05, seed=0).encoded) == 26
    classes = np.arange(512) % 4
    picked = choose(classes, 512, 0.01, seed=0, min_count=8)
    assert len(picked) == 4 and sorted(classes[picked]) == [0, 1, 2, 3]  # round(1 % of 128) = 1 per class
