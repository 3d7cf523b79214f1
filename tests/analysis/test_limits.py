"""Weight path length (integrable vs non-integrable regimes) and stationarity of limit points."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.integrate import quad

from attnflow import GaussianOU, simulate, slope, stationarity, tokens, weight_path_length
from attnflow.core.heads import identity_heads
from attnflow.weights.processes import OrnsteinUhlenbeck, Oscillating

torch.set_num_threads(1)

X0 = tokens.uniform(12, 3, 0)


def test_oscillating_length_grows_linearly_and_matches_closed_form():
    P = Oscillating(identity_heads(1, 3, 2.0), 1.5 * np.eye(3), 2.0, 0.4)
    traj = simulate(X0, P, t_end=4.0, dt=0.01, save_every=1)
    L = weight_path_length(traj, P)
    exact = quad(lambda t: 1.5 * np.sqrt(3) * 2.0 * abs(np.cos(2.0 * t + 0.4)), 0, 4.0, limit=200)[0]
    assert L.law[-1] == pytest.approx(exact, rel=1e-8)
    assert L.total == pytest.approx(exact, rel=1e-3)  # sampled heads: chord lengths
    assert L.law_total == np.inf


def test_ou_law_length_is_finite_with_closed_form():
    # A0 = A_bar: only the noise scale moves, |Theta'| = c_t' sqrt(d(d+1)/2), total c_inf sqrt(6).
    P = OrnsteinUhlenbeck(identity_heads(1, 3, 1.0), 2.0, 0.7, seed=0)
    traj = simulate(X0, P, t_end=1.0, dt=0.05, save_every=1)
    L = weight_path_length(traj, P)
    assert L.law_total == pytest.approx(0.7 / np.sqrt(4.0) * np.sqrt(6.0), rel=1e-6)
    c = lambda t: 0.7 * np.sqrt((1 - np.exp(-4.0 * t)) / 4.0)
    assert L.law[-1] == pytest.approx(c(1.0) * np.sqrt(6.0), rel=1e-6)
    # the sampled path is rough: its discrete length grows as the save step shrinks
    fine = weight_path_length(simulate(X0, P, t_end=1.0, dt=0.0125, save_every=1), P)
    assert fine.total > 1.5 * L.total


def test_path_length_from_config_and_constant():
    from attnflow.config import preset_config
    from attnflow.runs import run_config

    cfg = preset_config("autonomous").model_copy(deep=True)
    cfg = cfg.model_validate(
        {
            **cfg.model_dump(),
            "tokens": {"n": 8, "d": 3},
            "integration": {"t_end": 0.2, "dt": 0.05, "method": "rk4", "save_every": 1},
        }
    )
    L = weight_path_length(run_config(cfg))
    assert L.process == "Constant" and L.total == 0.0 and L.law_total == 0.0


def test_stationarity_of_states():
    A = identity_heads(2, 3, 3.0)
    one_point = np.tile([[0.0, 0.0, 1.0]], (6, 1))
    assert stationarity(one_point, A).slope == pytest.approx(0.0, abs=1e-12)
    s = stationarity(X0, A)
    assert s.slope == pytest.approx(slope(X0, A), rel=1e-12) and 0 < s.relative <= 1
    law = GaussianOU(3.0 * np.eye(3), 1.0, 0.5).stationary()
    assert stationarity(X0, law).slope == pytest.approx(law.slope(X0), rel=1e-12)
    assert stationarity(one_point, law).slope == pytest.approx(0.0, abs=1e-12)


def test_limit_of_a_constant_weight_flow_is_stationary():
    A = identity_heads(1, 3, 2.0)
    traj = simulate(tokens.cap(10, 3, 1.0, seed=1), A, t_end=20.0, dt=0.1, save_every=200)
    s0, s1 = stationarity(traj.x[0], A), stationarity(traj.x[-1], A)
    assert s1.slope < 1e-6 * s0.slope


def test_stationarity_slope_by_finite_differences():
    from attnflow import energy, mobility

    A = identity_heads(2, 3, 2.0) + np.diag([0.5, 0.0, -0.5])
    x, a, h = X0[:6], 1 / 6, 1e-6
    b = mobility(x, A)
    total = 0.0
    for i in range(6):
        # an orthonormal tangent basis at x_i, and central differences of F along its great circles
        basis = np.linalg.svd(np.eye(3) - np.outer(x[i], x[i]))[0][:, :2]
        g2 = 0.0
        for e in basis.T:
            xp, xm = x.copy(), x.copy()
            xp[i], xm[i] = np.cos(h) * x[i] + np.sin(h) * e, np.cos(h) * x[i] - np.sin(h) * e
            g2 += ((energy(xp, A) - energy(xm, A)) / (2 * h) / a) ** 2
        total += a * b[i] * g2
    assert stationarity(x, A).slope == pytest.approx(np.sqrt(total), rel=1e-6)
