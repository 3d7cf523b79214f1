"""The three fields, energy, mobility and slope: closed forms, autograd, PyTorch's attention modules."""

import numpy as np
import pytest
import torch

import attnflow as af
from attnflow.core.heads import Heads
from helpers import random_masses, random_sym, random_tokens


def direct_Z(x, A, a):
    """Z_h(x_i) = sum_j a_j exp(x_i^T A_h x_j), shape (H, N), by explicit loops over heads."""
    return np.stack([np.exp(x @ A[h] @ x.T) @ a for h in range(A.shape[0])])


def test_velocity_is_tangent_and_keeps_type(rng):
    x, A = random_tokens(rng, 20, 4), rng.standard_normal((3, 4, 4))
    for model in ("mha", "usa"):
        v = af.velocity(x, A, model=model)
        assert isinstance(v, np.ndarray) and v.shape == (20, 4)
        np.testing.assert_allclose((x * v).sum(1), 0.0, atol=1e-13)
    vt = af.velocity(torch.from_numpy(x), torch.from_numpy(A))
    assert isinstance(vt, torch.Tensor)
    np.testing.assert_allclose(vt.numpy(), af.velocity(x, A), rtol=1e-14)


def test_fields_match_model_formulas(rng):
    H, N, d = 3, 12, 3
    x, A, V = random_tokens(rng, N, d), random_sym(rng, H, d), rng.standard_normal((H, d, d))
    a, w = random_masses(rng, N), random_masses(rng, H)
    Z = direct_Z(x, A, a)  # (H, N)
    num = lambda M: np.stack([(np.exp(x @ A[h] @ x.T) * a) @ (x @ M[h].T) for h in range(H)])
    P = lambda u: u - x * (x * u).sum(1, keepdims=True)
    mha = P(sum(w[h] * num(V)[h] / Z[h][:, None] for h in range(H)))
    usa = P(sum(w[h] * num(V)[h] for h in range(H)))
    S = (w[:, None] * Z).sum(0)
    gf = P(sum(w[h] * num(A)[h] for h in range(H)) / S[:, None])
    kw = dict(token_weights=a, head_weights=w)
    np.testing.assert_allclose(af.velocity(x, A, V, model="mha", **kw), mha, rtol=1e-11, atol=1e-12)
    np.testing.assert_allclose(af.velocity(x, A, V, model="usa", **kw), usa, rtol=1e-11, atol=1e-12)
    np.testing.assert_allclose(af.velocity(x, A, model="gf", **kw), gf, rtol=1e-11, atol=1e-12)
    np.testing.assert_allclose(af.energy(x, A, **kw), -0.5 * (w[:, None] * Z * a).sum(), rtol=1e-12)
    # Effective mobility: w-weighted harmonic mean of the head mobilities m_h = 1 / Z_h.
    m = 1.0 / Z
    np.testing.assert_allclose(af.mobility(x, A, **kw), 1.0 / (w[:, None] / m).sum(0), rtol=1e-12)
    np.testing.assert_allclose(af.log_mobility(x, A, **kw), -np.log(S), rtol=1e-12)


def test_gf_with_one_head_is_mha_with_V_equal_A(rng):
    x, A = random_tokens(rng, 30, 5), random_sym(rng, 1, 5, 2.0)
    a = random_masses(rng, 30)
    np.testing.assert_allclose(
        af.velocity(x, A, model="gf", token_weights=a), af.velocity(x, A, A, model="mha", token_weights=a), rtol=1e-12
    )


def test_gf_rejects_non_gradient_heads(rng):
    x = random_tokens(rng, 5, 3)
    with pytest.raises(ValueError, match="symmetric"):
        af.velocity(x, rng.standard_normal((2, 3, 3)), model="gf")
    A = random_sym(rng, 2, 3)
    with pytest.raises(ValueError, match="V_h = A_h"):
        af.velocity(x, A, -A, model="gf")
    with pytest.raises(ValueError, match="unknown model"):
        af.velocity(x, A, model="softmax")


def test_bad_masses_are_rejected(rng):
    x, A = random_tokens(rng, 4, 3), random_sym(rng, 2, 3)
    with pytest.raises(ValueError, match="sum to 1"):
        af.velocity(x, A, token_weights=np.ones(4))
    with pytest.raises(ValueError, match="shape"):
        af.energy(x, A, head_weights=np.ones(3) / 3)
    with pytest.raises(ValueError, match="dimension"):
        af.energy(random_tokens(rng, 4, 4), A)


def test_slope_against_autograd_gradient(rng):
    """|dF|^2 = sum_i a_i b(x_i) |P_{x_i} grad_{x_i} F / a_i|^2, the gradient taken by torch autograd."""
    H, N, d = 3, 15, 4
    x, A = random_tokens(rng, N, d), random_sym(rng, H, d, 1.5)
    a, w = random_masses(rng, N), random_masses(rng, H)
    xt = torch.tensor(x, requires_grad=True)
    At, at, wt = map(torch.from_numpy, (A, a, w))
    F = -0.5 * sum(wt[h] * (at[:, None] * at[None, :] * torch.exp(xt @ At[h] @ xt.T)).sum() for h in range(H))
    (grad,) = torch.autograd.grad(F, xt)
    g = (grad / at[:, None]).numpy()
    g = g - x * (x * g).sum(1, keepdims=True)
    b = 1.0 / (w[:, None] * direct_Z(x, A, a)).sum(0)
    expected = np.sqrt((a * b * (g * g).sum(1)).sum())
    kw = dict(token_weights=a, head_weights=w)
    np.testing.assert_allclose(af.slope(x, A, **kw), expected, rtol=1e-11)
    np.testing.assert_allclose(af.log_slope(x, A, **kw), np.log(expected), rtol=1e-11)
    # Along the gf flow the metric speed equals the slope.
    v = af.velocity(x, A, model="gf", **kw)
    np.testing.assert_allclose(af.metric_speed(x, v, A, **kw), expected, rtol=1e-11)
    # And the gf field is -b g.
    np.testing.assert_allclose(v, -b[:, None] * g, rtol=1e-10, atol=1e-12)


def test_mha_matches_torch_multihead_attention(rng):
    """project=False: our mha field is exactly torch.nn.MultiheadAttention's output (heads summed
    through W_O), with Q_h, K_h carrying the 1/sqrt(d_k) scale and V_h = H W_O^h W_V^h."""
    torch.manual_seed(0)
    d, H, N = 8, 4, 11
    dk = d // H
    mha = torch.nn.MultiheadAttention(d, H, bias=False, batch_first=True, dtype=torch.float64)
    Wq, Wk, Wv = mha.in_proj_weight.detach().chunk(3)
    Wo = mha.out_proj.weight.detach()
    sl = lambda h: slice(h * dk, (h + 1) * dk)
    Q = torch.stack([Wq[sl(h)] for h in range(H)]) / dk**0.25
    K = torch.stack([Wk[sl(h)] for h in range(H)]) / dk**0.25
    V = torch.stack([H * Wo[:, sl(h)] @ Wv[sl(h)] for h in range(H)])
    x = torch.from_numpy(random_tokens(rng, N, d))
    heads = Heads.from_factors(Q, K, V)
    ours = af.velocity(x, heads, model="mha", project=False)
    theirs = mha(x[None], x[None], x[None], need_weights=False)[0][0].detach()
    torch.testing.assert_close(ours, theirs, rtol=1e-10, atol=1e-12)
    # One explicit Euler step of size 1 without P_x is the residual block x + MHA(x).
    torch.testing.assert_close(x + ours, x + theirs, rtol=1e-10, atol=1e-12)
    # The low-rank Heads agree with the dense A = Q^T K form.
    dense = af.velocity(x, heads.A, V, model="mha", project=False)
    torch.testing.assert_close(ours, dense, rtol=1e-10, atol=1e-12)


def test_low_rank_heads_cost_scales_with_rank(rng):
    d, k, H = 64, 2, 2
    Q, K = rng.standard_normal((H, k, d)), rng.standard_normal((H, k, d))
    heads = Heads.from_factors(Q, K)
    q, kk = heads.factors(torch.from_numpy(random_tokens(rng, 10, d)))
    assert q.shape == (H, 10, k) and kk.shape == (H, 10, k)  # logits are (Q x).(K y): O(N^2 k)


def test_large_beta_stability(rng):
    N, d, H = 60, 3, 2
    x = random_tokens(rng, N, d)
    A = random_sym(rng, H, d)
    A = A + 3 * np.eye(d)
    for beta in (1.0, 1000.0):
        v = af.velocity(x, beta * A, model="gf")
        assert np.isfinite(v).all()
    # beta = 1000: compare gf against a float64 log-domain reference built from the numpy kernel.
    from attnflow.kernels.dense import attention_stats_reference

    out, logZ = attention_stats_reference(x, 1000 * A, 1000 * A, np.full(N, 1 / N))
    c = np.exp(logZ - logZ.max(0))
    c /= c.sum(0)
    u = (c[:, :, None] * out).sum(0)
    np.testing.assert_allclose(
        af.velocity(x, 1000 * A, model="gf"), u - x * (x * u).sum(1, keepdims=True), rtol=1e-9, atol=1e-8
    )
    # Quantities that truly overflow raise and point to their log-scale variants.
    with pytest.raises(OverflowError, match="log_energy"):
        af.energy(x, 1000 * A)
    sign, logabs = af.log_energy(x, 1000 * A)
    from scipy.special import logsumexp

    expected = logsumexp(np.log(0.5 / H) + np.log(1 / N) + logZ.ravel())
    assert sign == -1.0 and np.isclose(logabs, expected, rtol=1e-12)
    with pytest.raises(OverflowError, match="log_mobility"):
        af.mobility(x, 1000 * A)
    assert np.isfinite(af.log_mobility(x, 1000 * A)).all()
    with pytest.raises(OverflowError, match="usa"):
        af.velocity(x, 1000 * A, model="usa")
    assert np.isfinite(af.log_slope(x, 1000 * A))


def test_energy_gradient_is_the_autograd_gradient_of_F(rng):
    """``dF/dx_i = a_i g(x_i)`` in R^d for symmetric A (autograd of the closed-form F); control: for a
    non-symmetric A the query-side formula misses the key side and differs."""
    from attnflow.dynamics.fields import field_stats

    H, N, d = 3, 15, 4
    x, a = torch.from_numpy(random_tokens(rng, N, d)), torch.from_numpy(random_masses(rng, N))
    w = torch.full((H,), 1.0 / H, dtype=torch.float64)
    for A, same in ((random_sym(rng, H, d), True), (rng.standard_normal((H, d, d)), False)):
        heads = Heads(K=torch.from_numpy(A))
        xg = x.clone().requires_grad_(True)
        F = -0.5 * sum(w[h] * (a * (torch.exp(xg @ heads.A[h] @ xg.T) @ a)).sum() for h in range(H))
        (grad,) = torch.autograd.grad(F, xg)
        g = field_stats(x, heads, a, w).energy_gradient(x)
        close = torch.allclose(a[:, None] * g, grad, rtol=1e-12, atol=1e-14)
        assert close == same
