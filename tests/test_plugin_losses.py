"""Plug-in regularisers (CO2, CLSA's DDM, InvCLR's gradient penalty) against direct float64 computations of their
equations, looping over the batch (and the queue / the α′ draws). InvCLR's conditional variance, an evaluation
metric, is tested in tests/eval/test_invariance.py."""

import math

import pytest
import torch
import torch.nn.functional as F

from pipeline.losses.clsa import ddm, strong_infonce
from pipeline.losses.co2 import co2_consistency, co2_consistency_anchors, co2_consistency_inbatch
from pipeline.losses.invclr import gradient_penalty, projection_alpha_grad, rademacher, scalar_projection


def _unit(*shape, seed):
    g = torch.Generator().manual_seed(seed)
    return F.normalize(torch.randn(*shape, generator=g, dtype=torch.float64), dim=-1)


def _randn(*shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64)


def _softmax_list(logits):
    m = max(logits)
    ex = [math.exp(v - m) for v in logits]
    s = sum(ex)
    return [v / s for v in ex]


def _sym_kl(p, q):
    fwd = sum(pi * math.log(pi / qi) for pi, qi in zip(p, q))
    rev = sum(qi * math.log(qi / pi) for pi, qi in zip(p, q))
    return 0.5 * fwd + 0.5 * rev


# ---------------------------------------------------------------------------------------------------------------
# CO2 (Eqs. 2-4)
# ---------------------------------------------------------------------------------------------------------------


def _co2_direct(q, k, queue, t):
    total = 0.0
    for i in range(q.shape[0]):
        Q = _softmax_list([float(q[i] @ queue[j]) / t for j in range(queue.shape[0])])  # Eq. 2
        P = _softmax_list([float(k[i] @ queue[j]) / t for j in range(queue.shape[0])])  # Eq. 3
        total += _sym_kl(P, Q)  # Eq. 4
    return total / q.shape[0]


@pytest.mark.parametrize("t", [0.04, 0.05, 0.2, 1.0])
def test_co2_matches_equation(t):
    q, k, queue = _unit(6, 8, seed=0), _unit(6, 8, seed=1), _unit(20, 8, seed=2)
    assert co2_consistency(q, k, queue, t).item() == pytest.approx(_co2_direct(q, k, queue, t), rel=1e-10)


def test_co2_forward_and_reverse_kl_ablations():
    q, k, queue = _unit(5, 8, seed=3), _unit(5, 8, seed=4), _unit(12, 8, seed=5)
    fwd = rev = 0.0
    for i in range(5):
        Q = _softmax_list([float(q[i] @ queue[j]) / 0.1 for j in range(12)])
        P = _softmax_list([float(k[i] @ queue[j]) / 0.1 for j in range(12)])
        fwd += sum(pi * math.log(pi / qi) for pi, qi in zip(P, Q)) / 5
        rev += sum(qi * math.log(qi / pi) for pi, qi in zip(P, Q)) / 5
    assert co2_consistency(q, k, queue, 0.1, divergence="forward").item() == pytest.approx(fwd, rel=1e-10)
    assert co2_consistency(q, k, queue, 0.1, divergence="reverse").item() == pytest.approx(rev, rel=1e-10)
    assert fwd != pytest.approx(rev, rel=1e-3)  # the two halves really differ, so the ½/½ weighting is tested


def test_co2_is_zero_when_query_equals_key():
    k, queue = _unit(7, 8, seed=1), _unit(30, 8, seed=2)
    assert co2_consistency(k.clone(), k, queue, 0.05).item() == pytest.approx(0.0, abs=1e-14)
    assert co2_consistency(_unit(7, 8, seed=9), k, queue, 0.05).item() > 1e-3


def test_co2_gradient_reaches_query_only():
    q = _unit(4, 8, seed=0).requires_grad_()
    k = _unit(4, 8, seed=1).requires_grad_()
    queue = _unit(10, 8, seed=2).requires_grad_()
    co2_consistency(q, k, queue, 0.2).backward()
    assert q.grad is not None and q.grad.abs().sum() > 0
    assert k.grad is None and queue.grad is None


def test_co2_gradient_matches_derived_logit_gradient():
    """docs/methods/co2.md §1.5: ∂L/∂s_j = ½(Q_j - P_j) + ½ Q_j (log Q_j - log P_j - KL(Q‖P)), s = q·n/τ, per
    sample / B."""
    t, b = 0.1, 3
    q, k, queue = _unit(b, 6, seed=10).requires_grad_(), _unit(b, 6, seed=11), _unit(9, 6, seed=12)
    co2_consistency(q, k, queue, t).backward()
    for i in range(b):
        Q = _softmax_list([float(q[i].detach() @ queue[j]) / t for j in range(9)])
        P = _softmax_list([float(k[i] @ queue[j]) / t for j in range(9)])
        kl_qp = sum(qj * math.log(qj / pj) for pj, qj in zip(P, Q))
        ds = [0.5 * (Q[j] - P[j]) + 0.5 * Q[j] * (math.log(Q[j] / P[j]) - kl_qp) for j in range(9)]
        expect = sum(ds[j] / t * queue[j] for j in range(9)) / b
        torch.testing.assert_close(q.grad[i], expect, rtol=1e-10, atol=1e-12)


# --- SimCLR form --------------------------------------------------------------------------------------------------


def _co2_inbatch_direct(z1, z2, t):
    z = F.normalize(torch.cat([z1, z2]), dim=1)
    n = z.shape[0]
    b = n // 2
    total = 0.0
    for r in range(n):
        tw = (r + b) % n
        negs = [c for c in range(n) if c not in (r, tw)]
        Q = _softmax_list([float(z[r] @ z[c]) / t for c in negs])
        P = _softmax_list([float(z[tw] @ z[c]) / t for c in negs])
        total += _sym_kl(P, Q)
    return total / n


@pytest.mark.parametrize("t", [0.1, 0.5, 1.0])
def test_co2_inbatch_matches_equation(t):
    z1, z2 = _randn(5, 7, seed=0), _randn(5, 7, seed=1)
    assert co2_consistency_inbatch(z1, z2, t).item() == pytest.approx(_co2_inbatch_direct(z1, z2, t), rel=1e-10)
    assert co2_consistency_inbatch(z1, z2, t, detach_target=True).item() == pytest.approx(
        _co2_inbatch_direct(z1, z2, t), rel=1e-10
    )


def test_co2_inbatch_is_zero_for_identical_views():
    z = _randn(6, 5, seed=3)
    assert co2_consistency_inbatch(z, z.clone(), 0.5).item() == pytest.approx(0.0, abs=1e-14)


def test_co2_inbatch_detached_target_halves_the_gradient():
    z1, z2 = _randn(4, 6, seed=4).requires_grad_(), _randn(4, 6, seed=5).requires_grad_()
    co2_consistency_inbatch(z1, z2, 1.0).backward()
    g_full = (z1.grad.clone(), z2.grad.clone())
    z1.grad = z2.grad = None
    co2_consistency_inbatch(z1, z2, 1.0, detach_target=True).backward()
    assert g_full[0].abs().sum() > 0 and g_full[1].abs().sum() > 0
    torch.testing.assert_close(2 * z1.grad, g_full[0], rtol=1e-10, atol=1e-13)
    torch.testing.assert_close(2 * z2.grad, g_full[1], rtol=1e-10, atol=1e-13)


# ---------------------------------------------------------------------------------------------------------------
# CLSA DDM (Eqs. 3, 5, 6)
# ---------------------------------------------------------------------------------------------------------------


def _ddm_direct(qw, qs, k, queue, t, batch_keys=False):
    total = 0.0
    for i in range(qw.shape[0]):
        support = [k[c] for c in range(k.shape[0])] if batch_keys else [k[i]]
        support += [queue[j] for j in range(queue.shape[0])]
        pw = _softmax_list([float(qw[i] @ s) / t for s in support])  # Eq. 3
        ps = _softmax_list([float(qs[i] @ s) / t for s in support])  # Eq. 5
        total += -sum(a * math.log(b) for a, b in zip(pw, ps))  # Eq. 6
    return total / qw.shape[0]


@pytest.mark.parametrize("t", [0.07, 0.2, 1.0])
def test_ddm_matches_equation(t):
    qw, qs, k, queue = _unit(6, 8, seed=0), _unit(6, 8, seed=1), _unit(6, 8, seed=2), _unit(20, 8, seed=3)
    assert ddm(qw, qs, k, queue, t).item() == pytest.approx(_ddm_direct(qw, qs, k, queue, t), rel=1e-10)


@pytest.mark.parametrize("t", [0.2, 0.5])
def test_ddm_batch_keys_variant_matches_code_support(t):
    qw, qs, k, queue = _unit(5, 8, seed=4), _unit(5, 8, seed=5), _unit(5, 8, seed=6), _unit(11, 8, seed=7)
    got = ddm(qw, qs, k, queue, t, batch_keys=True).item()
    assert got == pytest.approx(_ddm_direct(qw, qs, k, queue, t, batch_keys=True), rel=1e-10)
    assert got != pytest.approx(ddm(qw, qs, k, queue, t).item(), rel=1e-6)


def _infonce_direct(qs, k, queue, t, batch_keys=False):
    total = 0.0
    for i in range(qs.shape[0]):
        support = [k[c] for c in range(k.shape[0])] if batch_keys else [k[i]]
        support += [queue[j] for j in range(queue.shape[0])]
        p = _softmax_list([float(qs[i] @ s) / t for s in support])
        total += -math.log(p[i if batch_keys else 0])  # the own key's probability
    return total / qs.shape[0]


@pytest.mark.parametrize("batch_keys", [False, True])
def test_clsas_contrastive_alternative_is_infonce_over_ddms_support(batch_keys):
    """Table 5's "CLSA with contrastive loss": -log p(own key | strong query) over DDM's support, i.e. DDM with a
    one-hot target on the positive."""
    qs, k, queue = _unit(6, 8, seed=1), _unit(6, 8, seed=2), _unit(20, 8, seed=3)
    got = strong_infonce(qs, k, queue, 0.2, batch_keys=batch_keys).item()
    assert got == pytest.approx(_infonce_direct(qs, k, queue, 0.2, batch_keys), rel=1e-10)
    # DDM's target is the weak query's soft distribution, not the one-hot positive: another loss
    assert got != pytest.approx(ddm(_unit(6, 8, seed=0), qs, k, queue, 0.2, batch_keys=batch_keys).item(), rel=1e-3)


def test_clsas_contrastive_alternative_finds_this_workers_keys_in_every_workers_bank():
    """MoCo v3: the support is every worker's keys; this worker's positives start at its offset in the bank."""
    qs, bank = _unit(3, 8, seed=1), _unit(9, 8, seed=2)  # three workers of three
    none = _unit(0, 8, seed=3)
    got = strong_infonce(qs, bank, none, 0.2, batch_keys=True, offset=3).item()
    direct = 0.0
    for i in range(3):
        p = _softmax_list([float(qs[i] @ bank[j]) / 0.2 for j in range(9)])
        direct += -math.log(p[3 + i]) / 3
    assert got == pytest.approx(direct, rel=1e-10)
    assert got != pytest.approx(strong_infonce(qs, bank, none, 0.2, batch_keys=True).item(), rel=1e-3)


def test_ddm_equals_weak_entropy_when_strong_equals_weak():
    qw, k, queue = _unit(6, 8, seed=0), _unit(6, 8, seed=2), _unit(20, 8, seed=3)
    entropy = 0.0
    for i in range(6):
        p = _softmax_list([float(qw[i] @ k[i]) / 0.2] + [float(qw[i] @ queue[j]) / 0.2 for j in range(20)])
        entropy += -sum(v * math.log(v) for v in p) / 6
    assert ddm(qw, qw.clone(), k, queue, 0.2).item() == pytest.approx(entropy, rel=1e-10)
    # Gibbs: any other strong query costs more than the entropy
    assert ddm(qw, _unit(6, 8, seed=1), k, queue, 0.2).item() > entropy


def test_ddm_gradient_reaches_strong_query_only():
    qw = _unit(4, 8, seed=0).requires_grad_()
    qs = _unit(4, 8, seed=1).requires_grad_()
    k = _unit(4, 8, seed=2).requires_grad_()
    queue = _unit(10, 8, seed=3).requires_grad_()
    ddm(qw, qs, k, queue, 0.2).backward()
    assert qs.grad is not None and qs.grad.abs().sum() > 0
    assert qw.grad is None and k.grad is None and queue.grad is None


# ---------------------------------------------------------------------------------------------------------------
# InvCLR: F (Eq. 5), gradient penalty (Eqs. 12-13)
# ---------------------------------------------------------------------------------------------------------------

DX, DA, D = 3, 2, 5


def _render(W, x, alpha):
    """Tiny differentiable 'renderer + encoder': z_i = tanh(W [x_i, α_i]); z_i depends on α_i only."""
    return torch.tanh(torch.cat([x, alpha], dim=1) @ W.t())


def _inputs(k=4, L=6, seed=0):
    W = _randn(D, DX + DA, seed=seed)
    x = _randn(k, DX, seed=seed + 1)
    alpha = _randn(k, DA, seed=seed + 2)
    alpha_prime = _randn(k, L, DA, seed=seed + 3)
    e = rademacher((k, D), generator=torch.Generator().manual_seed(seed + 4), dtype=torch.float64)
    return W, x, alpha, alpha_prime, e


def _grad_F_by_hand(W, x_i, a_i, e_i):
    """∇_α (e·z/‖z‖) for z = tanh(W[x, α]): W_αᵀ diag(1 - z²) (I - ẑẑᵀ) e / ‖z‖."""
    z = torch.tanh(W @ torch.cat([x_i, a_i]))
    nz = z.norm()
    zh = z / nz
    dz = (e_i - zh * (zh @ e_i)) / nz
    return W[:, DX:].t() @ (dz * (1 - z**2))


def _penalty_direct(grads, alpha, alpha_prime, lam, clip, halve=False):
    k, L = alpha_prime.shape[0], alpha_prime.shape[1]
    total = 0.0
    for i in range(k):
        for j in range(L):
            total += float(grads[i] @ (alpha_prime[i, j] - alpha[i])) ** 2
    pen = total / (L * k)
    if halve:
        pen *= 0.5
    if clip is not None:
        pen = min(pen, clip)
    return lam * pen


@pytest.mark.parametrize("lam,clip", [(0.1, None), (0.01, 1000.0), (1.0, 0.05)])
def test_gradient_penalty_matches_equation(lam, clip):
    W, x, alpha, alpha_prime, e = _inputs()
    alpha.requires_grad_()
    grads = [_grad_F_by_hand(W, x[i], alpha[i].detach(), e[i]) for i in range(4)]
    expect = _penalty_direct(grads, alpha.detach(), alpha_prime, lam, clip)
    got = gradient_penalty(_render(W, x, alpha), alpha, alpha_prime, e, clip=clip, lam=lam).item()
    assert got == pytest.approx(expect, rel=1e-10)
    if clip == 0.05:  # this case is actually clipped
        assert got == pytest.approx(lam * clip, rel=1e-12)


def test_gradient_penalty_halve_is_eq12_scale():
    W, x, alpha, alpha_prime, e = _inputs(seed=1)
    alpha.requires_grad_()
    z = _render(W, x, alpha)
    full = gradient_penalty(z, alpha, alpha_prime, e, clip=None, lam=1.0)
    half = gradient_penalty(z, alpha, alpha_prime, e, clip=None, lam=1.0, halve=True)
    grads = [_grad_F_by_hand(W, x[i], alpha[i].detach(), e[i]) for i in range(4)]
    assert half.item() == pytest.approx(_penalty_direct(grads, alpha.detach(), alpha_prime, 1.0, None, True), rel=1e-10)
    assert full.item() == pytest.approx(2 * half.item(), rel=1e-12)


def test_gradient_penalty_closed_form_for_linear_map():
    k, L = 5, 7
    A, c = _randn(D, DA, seed=20), _randn(k, D, seed=21)
    alpha = _randn(k, DA, seed=22).requires_grad_()
    alpha_prime = _randn(k, L, DA, seed=23)
    e = rademacher((k, D), generator=torch.Generator().manual_seed(24), dtype=torch.float64)
    z = alpha @ A.t() + c
    # unnormalised F = e·(Aα + c): ∇_α F = Aᵀ e
    g_raw = [A.t() @ e[i] for i in range(k)]
    got_raw = gradient_penalty(z, alpha, alpha_prime, e, clip=None, lam=0.3, normalize=False).item()
    assert got_raw == pytest.approx(_penalty_direct(g_raw, alpha.detach(), alpha_prime, 0.3, None), rel=1e-10)
    # normalised F = e·z/‖z‖: ∇_α F = Aᵀ (I - ẑẑᵀ) e / ‖z‖
    g_unit = []
    for i in range(k):
        zi = z[i].detach()
        zh = zi / zi.norm()
        g_unit.append(A.t() @ ((e[i] - zh * (zh @ e[i])) / zi.norm()))
    got_unit = gradient_penalty(z, alpha, alpha_prime, e, clip=None, lam=0.3).item()
    assert got_unit == pytest.approx(_penalty_direct(g_unit, alpha.detach(), alpha_prime, 0.3, None), rel=1e-10)


def test_gradient_penalty_is_zero_when_z_ignores_alpha():
    W, x, alpha, alpha_prime, e = _inputs(seed=2)
    W.requires_grad_()
    alpha.requires_grad_()
    z = torch.tanh(x @ W[:, :DX].t())  # depends on W, not on α
    assert gradient_penalty(z, alpha, alpha_prime, e, clip=None, lam=1.0).item() == 0.0
    assert gradient_penalty(z.detach(), alpha, alpha_prime, e, clip=None, lam=1.0).item() == 0.0
    # ...and non-zero as soon as z depends on α (so the zero above is informative)
    assert gradient_penalty(_render(W, x, alpha), alpha, alpha_prime, e, clip=None, lam=1.0).item() > 1e-6


def test_gradient_penalty_gradient_reaches_weights_and_matches_finite_differences():
    W, x, alpha, alpha_prime, e = _inputs(seed=3)
    alpha.requires_grad_()
    Wp = W.clone().requires_grad_()

    def pen(weights):
        return gradient_penalty(_render(weights, x, alpha), alpha, alpha_prime, e, clip=None, lam=0.1)

    (gW,) = torch.autograd.grad(pen(Wp), Wp)
    assert gW.abs().sum() > 0
    h = 1e-6
    fd = torch.zeros_like(W)
    for r in range(W.shape[0]):
        for s in range(W.shape[1]):
            wp, wm = W.clone(), W.clone()
            wp[r, s] += h
            wm[r, s] -= h
            fd[r, s] = (pen(wp).item() - pen(wm).item()) / (2 * h)
    torch.testing.assert_close(gW, fd, rtol=1e-6, atol=1e-9)


def test_gradient_penalty_clipped_has_no_gradient():
    W, x, alpha, alpha_prime, e = _inputs(seed=4)
    alpha.requires_grad_()
    Wp = W.clone().requires_grad_()
    out = gradient_penalty(_render(Wp, x, alpha), alpha, alpha_prime, e, clip=1e-6, lam=0.1)
    assert out.item() == pytest.approx(0.1 * 1e-6, rel=1e-12)
    out.backward()
    assert Wp.grad is None or Wp.grad.abs().sum() == 0


def test_gradient_penalty_draws_rademacher_from_generator():
    W, x, alpha, alpha_prime, _ = _inputs(seed=5)
    alpha.requires_grad_()
    z = _render(W, x, alpha)
    drawn = gradient_penalty(z, alpha, alpha_prime, generator=torch.Generator().manual_seed(7), clip=None)
    e = rademacher(z.shape, generator=torch.Generator().manual_seed(7), dtype=z.dtype)
    assert set(e.unique().tolist()) == {-1.0, 1.0}
    assert drawn.item() == pytest.approx(gradient_penalty(z, alpha, alpha_prime, e, clip=None).item(), rel=1e-12)


def test_batched_alpha_gradient_equals_per_sample_gradients():
    """The batch trick: one backward of Σ_i e_i·ẑ_i gives every ∇_α F_i because z_i depends on α_i only."""
    W, x, alpha, _, e = _inputs(k=5, seed=6)
    alpha.requires_grad_()
    batched = projection_alpha_grad(_render(W, x, alpha), alpha, e)
    for i in range(5):
        a_i = alpha[i : i + 1].detach().clone().requires_grad_()
        F_i = scalar_projection(_render(W, x[i : i + 1], a_i), e[i : i + 1]).sum()
        (g_i,) = torch.autograd.grad(F_i, a_i)
        torch.testing.assert_close(batched[i], g_i[0], rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(
            batched[i], _grad_F_by_hand(W, x[i], alpha[i].detach(), e[i]), rtol=1e-10, atol=1e-13
        )


def test_batched_alpha_gradient_is_not_per_sample_under_batch_coupling():
    """BatchNorm-like coupling (batch centring) adds cross-sample terms: the trick then differs from the true
    per-sample gradient e_iᵀ ∂ẑ_i/∂α_i (the Jacobian's diagonal block) — the caveat in the docstring."""
    W, x, alpha, _, e = _inputs(k=4, seed=7)

    def coupled(a):
        z = _render(W, x, a)
        return z - z.mean(dim=0, keepdim=True)

    alpha.requires_grad_()
    batched = projection_alpha_grad(coupled(alpha), alpha, e)
    jac = torch.autograd.functional.jacobian(lambda a: F.normalize(coupled(a), dim=1), alpha.detach())  # [K,D,K,dα]
    true = torch.stack([e[i] @ jac[i, :, i, :] for i in range(4)])
    assert (batched - true).abs().max() > 1e-3
    # without the coupling the diagonal block is the whole story
    jac_ind = torch.autograd.functional.jacobian(lambda a: F.normalize(_render(W, x, a), dim=1), alpha.detach())
    true_ind = torch.stack([e[i] @ jac_ind[i, :, i, :] for i in range(4)])
    torch.testing.assert_close(projection_alpha_grad(_render(W, x, alpha), alpha, e), true_ind, rtol=1e-12, atol=1e-14)


def test_scalar_projection_matches_eq5():
    k, L = 3, 4
    z = _randn(k, L, D, seed=30)
    e = rademacher((k, D), generator=torch.Generator().manual_seed(31), dtype=torch.float64)
    got = scalar_projection(z, e)
    raw = scalar_projection(z, e, normalize=False)
    for i in range(k):
        for j in range(L):
            norm = math.sqrt(sum(float(v) ** 2 for v in z[i, j]))
            dot = sum(float(e[i, d]) * float(z[i, j, d]) for d in range(D))
            assert got[i, j].item() == pytest.approx(dot / norm, rel=1e-12)
            assert raw[i, j].item() == pytest.approx(dot, rel=1e-12)
    torch.testing.assert_close(scalar_projection(z[:, 0], e), got[:, 0])


def test_co2_anchor_slices_match_the_inbatch_loss():
    g = torch.Generator().manual_seed(4)
    z1, z2 = torch.randn(8, 5, generator=g, dtype=torch.float64), torch.randn(8, 5, generator=g, dtype=torch.float64)
    full = co2_consistency_inbatch(z1, z2, 0.5)
    assert torch.allclose(co2_consistency_anchors(z1, z2, z1, z2, 0.5), full, rtol=1e-12)
    # two "ranks" of 4 anchors each, scored against all 8 candidates: their mean is the global loss
    halves = [
        co2_consistency_anchors(z1[r * 4 : (r + 1) * 4], z2[r * 4 : (r + 1) * 4], z1, z2, 0.5, offset=4 * r)
        for r in range(2)
    ]
    assert torch.allclose(sum(halves) / 2, full, rtol=1e-12)
    assert not torch.allclose(halves[0], halves[1])
