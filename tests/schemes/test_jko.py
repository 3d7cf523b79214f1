"""JKO minimising movements: optimality, monotone energy, convergence to gf, stability at large beta."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnflow import energy, jko_step, mobility, simulate, tokens
from attnflow.core.geometry import geodesic_distance_sq
from attnflow.core.heads import goe_heads, identity_heads

torch.set_num_threads(1)

X0 = tokens.uniform(12, 3, 0)
A = goe_heads(2, 3, 3.0, 1)


def objective(y, x, A, tau):
    # Independent numpy transcription of the particle JKO objective of MODEL.md.
    a = np.full(len(x), 1 / len(x))
    d = np.arccos(np.clip((x * y).sum(1), -1, 1))
    return energy(y, A) + (a * d**2 / mobility(x, A)).sum() / (2 * tau)


def test_geodesic_distance_sq_matches_arccos_and_is_smooth():
    x, y = tokens.uniform(50, 4, 1), tokens.uniform(50, 4, 2)
    d2 = geodesic_distance_sq(torch.from_numpy(x), torch.from_numpy(y)).numpy()
    np.testing.assert_allclose(d2, np.arccos(np.clip((x * y).sum(1), -1, 1)) ** 2, rtol=1e-10, atol=1e-14)
    z = torch.from_numpy(x).requires_grad_(True)
    geodesic_distance_sq(torch.from_numpy(x), z).sum().backward()
    assert torch.isfinite(z.grad).all() and float(z.grad.abs().max()) < 1e-6  # zero gradient at y = x


@pytest.mark.parametrize("tau", [0.05, 0.5])
def test_jko_step_is_a_local_minimiser(tau):
    r = jko_step(X0, A, tau)
    assert r.converged and r.iterations <= r.max_iter
    f0 = objective(r.y, X0, A, tau)
    assert r.objective == pytest.approx(f0, rel=1e-10)
    rng = np.random.default_rng(0)
    for _ in range(20):
        u = rng.standard_normal(X0.shape)
        u -= (u * r.y).sum(1, keepdims=True) * r.y
        for eps in (1e-3, -1e-3):
            z = r.y + eps * u
            z /= np.linalg.norm(z, axis=1, keepdims=True)
            assert objective(z, X0, A, tau) >= f0 - 1e-12


def test_jko_energy_never_increases():
    traj = simulate(X0, A, t_end=2.0, dt=0.2, method="jko")
    assert np.all(np.diff(traj.diagnostics["energy"]) <= 1e-12)


def test_jko_converges_to_gf_at_rate_one():
    ref = simulate(X0, A, t_end=1.0, dt=0.01, method="rk4", save_every=1000).x[-1]
    taus = np.array([0.1, 0.05, 0.025])
    err = [np.abs(simulate(X0, A, t_end=1.0, dt=tau, method="jko", save_every=1000).x[-1] - ref).max() for tau in taus]
    rate = np.polyfit(np.log(taus), np.log(err), 1)[0]
    assert 0.85 < rate < 1.2, (err, rate)


def test_jko_stable_where_explicit_euler_is_not():
    x0 = tokens.uniform(16, 3, 4)
    A_big = identity_heads(1, 3, 12.0)
    dt = 0.5
    euler = simulate(x0, A_big, t_end=5.0, dt=dt, method="euler")
    E = euler.diagnostics["energy"]
    assert np.any(np.diff(E) > 1e-9 * np.abs(E[:-1]))  # explicit Euler overshoots: energy goes up
    jko = simulate(x0, A_big, t_end=5.0, dt=dt, method="jko")
    Ej = jko.diagnostics["energy"]
    assert np.isfinite(jko.x).all() and np.all(np.diff(Ej) <= 1e-12 * np.abs(Ej[:-1]))
    assert Ej[-1] < Ej[0]


def test_jko_rejects_non_gradient_flow_weights():
    with pytest.raises(ValueError, match="symmetric"):
        jko_step(X0, np.array([[[0, 1.0, 0], [0, 0, 0], [0, 0, 0]]]), 0.1)
    with pytest.raises(ValueError, match="tau"):
        jko_step(X0, A, 0.0)


def test_jko_budget_residual_shrinks_with_tau():
    from attnflow import edi_budget

    r = [edi_budget(simulate(X0, A, t_end=0.5, dt=tau, method="jko", save_every=1000)) for tau in (0.05, 0.025)]
    assert r[0].quadrature == "minimising movement"
    assert abs(r[1].total_residual) < 0.55 * abs(r[0].total_residual)  # at least first order
