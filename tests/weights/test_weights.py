"""Weight processes: OU exact transition against its closed form, deterministic formulas, seeds."""

import math

import numpy as np
import pytest
import torch

from attnflow.core.errors import InputError
from attnflow.weights.processes import (
    Constant,
    FromCallable,
    Layers,
    OrnsteinUhlenbeck,
    Oscillating,
    Sampled,
    as_process,
)
from helpers import random_sym


def test_ou_transition_mean_and_variance(rng):
    d, rate, sigma, h = 3, 2.0, 0.7, 0.3
    A_bar = random_sym(rng, 1, d)
    A = A_bar + random_sym(rng, 1, d, 3.0)
    ou = OrnsteinUhlenbeck(A_bar, rate, sigma)
    gen = np.random.default_rng(0)
    n = 20000
    draws = np.stack([ou.transition(A, h, gen) for _ in range(n)])[:, 0]
    mean = A_bar[0] + math.exp(-rate * h) * (A - A_bar)[0]
    c2 = sigma**2 * (1 - math.exp(-2 * rate * h)) / (2 * rate)
    var = np.full((d, d), c2 / 2)
    np.fill_diagonal(var, c2)  # S = (G + G^T)/2: diagonal variance 1, off-diagonal 1/2
    se = np.sqrt(var / n)
    assert np.all(np.abs(draws.mean(0) - mean) < 5 * se)
    # Sample variance of a Gaussian has relative standard error sqrt(2/n).
    assert np.all(np.abs(draws.var(0) / var - 1) < 5 * np.sqrt(2 / n))
    np.testing.assert_array_equal(draws, draws.transpose(0, 2, 1))  # symmetric noise keeps A symmetric


def test_ou_sampled_on_a_grid_has_the_exact_law(rng):
    """Composing exact transitions on the integrator's grid gives the law A_bar + e^{-rt}(A0 - A_bar) + c_t S."""
    d, rate, sigma, t = 2, 1.5, 0.8, 1.0
    A_bar, A0 = np.eye(d)[None], 3 * np.eye(d)[None]
    ou = OrnsteinUhlenbeck(A_bar, rate, sigma, A0=A0, symmetric=False)
    finals = []
    for s in range(3000):
        smp = ou.sampler(seed=s)
        for tk in np.linspace(0, t, 11)[1:]:
            A = smp(tk)
        finals.append(A.A.numpy()[0])
    finals = np.stack(finals)
    c2 = sigma**2 * (1 - math.exp(-2 * rate * t)) / (2 * rate)
    np.testing.assert_allclose(finals.mean(0), ou.mean(t)[0], atol=5 * math.sqrt(c2 / 3000))
    assert np.all(np.abs(finals.var(0) / c2 - 1) < 5 * math.sqrt(2 / 3000))


def test_ou_reproducible_and_forward_only():
    ou = OrnsteinUhlenbeck(np.eye(3)[None], 1.0, 1.0, seed=7)
    p1 = [ou.sampler()(t).A.numpy() for t in (0.1,)]
    s1, s2, s3 = ou.sampler(), ou.sampler(), ou.sampler(seed=8)
    a = [s1(t).A.numpy().copy() for t in (0.1, 0.2, 0.5)]
    b = [s2(t).A.numpy().copy() for t in (0.1, 0.2, 0.5)]
    c = [s3(t).A.numpy().copy() for t in (0.1, 0.2, 0.5)]
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(p1[0], a[0])
    assert not np.allclose(a[-1], c[-1])
    with pytest.raises(ValueError, match="forward in time"):
        s1(0.3)
    # Checkpointed state continues the same path.
    s4 = ou.sampler()
    s4(0.1)
    state = s4.get_state()
    s5 = ou.sampler(seed=999)
    s5.set_state(state)
    np.testing.assert_array_equal(s4(0.7).A.numpy(), s5(0.7).A.numpy())


def test_ou_gradient_flow_flag():
    assert OrnsteinUhlenbeck(np.eye(3)[None], 1.0, 1.0).gradient_flow
    assert not OrnsteinUhlenbeck(np.eye(3)[None], 1.0, 1.0, symmetric=False).gradient_flow


def test_oscillating_formula_and_derivative(rng):
    H, d = 3, 3
    A_bar, C = random_sym(rng, H, d), random_sym(rng, H, d)
    omega, phase = np.array([1.0, 2.0, 0.5]), np.array([0.0, 1.0, 2.0])
    osc = Oscillating(A_bar, C, omega, phase)
    smp = osc.sampler()
    t = 0.7
    expected = A_bar + C * np.sin(omega * t + phase)[:, None, None]
    np.testing.assert_allclose(smp(t).A.numpy(), expected, rtol=1e-14)
    eps = 1e-6
    fd = (osc.A_at(t + eps) - osc.A_at(t - eps)) / (2 * eps)
    np.testing.assert_allclose(osc.derivative(t).numpy(), fd, rtol=1e-7, atol=1e-8)
    assert osc.gradient_flow
    assert not Oscillating(A_bar, C, 1.0, value="-A").gradient_flow


def test_layers_blocks_and_boundaries():
    As = [k * np.eye(2)[None] for k in (1.0, 2.0, 3.0)]
    lay = Layers(As, t_end=3.0)
    smp = lay.sampler()
    dt = 0.1
    got = [float(smp(k * dt).A[0, 0, 0]) for k in range(31)]
    expected = [1.0] * 10 + [2.0] * 10 + [3.0] * 11  # 10 * 0.1 in floating point stays in block 1
    assert got == expected
    with pytest.raises(ValueError, match="same"):
        Layers([np.eye(2)[None], np.eye(3)[None]], 1.0)


def test_constant_callable_sampled_and_as_process(rng):
    A = random_sym(rng, 2, 3)
    c = as_process(A)
    assert isinstance(c, Constant) and c.gradient_flow
    assert torch.equal(c.derivative(1.0), torch.zeros(2, 3, 3, dtype=torch.float64))
    f = as_process(lambda t: (A * (1 + t), -A))
    assert isinstance(f, FromCallable)
    h = f.sampler()(0.5)
    np.testing.assert_allclose(h.A.numpy(), 1.5 * A)
    np.testing.assert_allclose(h.values.numpy(), -A)
    s = Sampled([0.0, 1.0], np.stack([A, 3 * A]))
    np.testing.assert_allclose(s.sampler()(0.25).A.numpy(), 1.5 * A)
    with pytest.raises(ValueError, match="increasing"):
        Sampled([1.0, 0.0], np.stack([A, A]))


def test_rotated_is_the_inner_law_turned_in_its_plane(rng):
    """``Rotated``: heads ``R_t A_h(t) R_t^T`` with ``R_t`` the plane rotation by ``rate t`` (``u`` towards ``v``,
    the identity off the plane), and the same noise path as the inner OU process with the same seed."""
    from attnflow.weights.processes import Rotated, plane_rotation

    d, H = 4, 3
    A_bar = random_sym(rng, H, d)
    q = np.linalg.qr(rng.standard_normal((d, d)))[0]
    u, v = q[:, 0], q[:, 1]
    R = plane_rotation(u, v, 0.7)
    assert np.allclose(R @ R.T, np.eye(d), atol=1e-12) and np.linalg.det(R) == pytest.approx(1.0)
    assert np.allclose(R @ u, math.cos(0.7) * u + math.sin(0.7) * v, atol=1e-12)
    assert np.allclose(R @ q[:, 2], q[:, 2], atol=1e-12)  # off the plane: fixed
    ou = OrnsteinUhlenbeck(A_bar, 1.3, 0.4, A0=A_bar + random_sym(rng, H, d), seed=5)
    rot = Rotated(ou, u, v, 0.35, t0=2.0)
    plain, turned = ou.sampler(), rot.sampler()
    for t in (0.0, 0.1, 0.25, 1.0):
        A, At = plain(t).K.numpy(), turned(t).K.numpy()
        Rt = plane_rotation(u, v, 0.35 * (2.0 + t))
        assert np.allclose(At, np.einsum("ij,hjk,lk->hil", Rt, A, Rt), atol=1e-12)
    assert rot.gradient_flow and rot.sampler().get_state()["t"] == 0.0
    # Control: a plane that is not orthonormal is refused.
    with pytest.raises(InputError, match="orthonormal"):
        Rotated(ou, u, 2 * v, 0.35)


def test_gf_field_is_equivariant_so_a_turned_law_turns_its_clouds(rng):
    """The premise of ``ou`` row #2's control: ``v(R x; R A R^T) = R v(x; A)`` for the ``gf`` field; the ``mha``
    field with a value matrix that is not turned is the control that breaks it."""
    from attnflow.dynamics.fields import velocity
    from attnflow.weights.processes import plane_rotation

    d, H, N = 3, 4, 7
    A = random_sym(rng, H, d)
    x = rng.standard_normal((N, d))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    R = plane_rotation(np.eye(d)[0], np.eye(d)[1], 1.1)
    turned = np.einsum("ij,hjk,lk->hil", R, A, R)
    v0 = np.asarray(velocity(x, A, model="gf"))
    v1 = np.asarray(velocity(x @ R.T, turned, model="gf"))
    assert np.allclose(v1, v0 @ R.T, atol=1e-12)
    V = random_sym(rng, H, d)  # not turned with the keys: the field is not the turned field
    bad = np.asarray(velocity(x @ R.T, turned, V, model="mha"))
    assert not np.allclose(bad, np.asarray(velocity(x, A, V, model="mha")) @ R.T, atol=1e-3)
