"""Infinite heads: Gaussian closed forms vs Monte Carlo, finite differences and finite-H convergence."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnflow import GaussianHeads, GaussianOU, GaussianStatic, energy, mobility, slope, tokens, velocity

torch.set_num_threads(1)

X = tokens.uniform(10, 3, 0)
LAW = GaussianHeads.create(np.diag([1.0, 0.5, -0.3]), 0.7)


def test_moment_generating_function_and_stein_identity_by_monte_carlo():
    x, y = X[0], X[1]
    As = LAW.sample(200_000, 1)
    k = np.exp(np.einsum("i,hij,j->h", x, As, y))
    Ek = np.exp(x @ LAW.mean[0] @ y + LAW.c**2 * (1 + (x @ y) ** 2) / 4)  # MODEL.md worked case
    assert abs(k.mean() - Ek) < 4 * k.std() / np.sqrt(len(k))
    Aky = np.einsum("hij,j,h->hi", As, y, k)  # samples of A exp(x^T A y) y
    xy = np.outer(x, y)
    closed = (LAW.mean[0] + LAW.c**2 * (xy + xy.T) / 2) @ y * Ek
    assert np.all(np.abs(Aky.mean(0) - closed) < 4 * Aky.std(0) / np.sqrt(len(k)))
    Z = LAW.partition(X)
    assert Z[0] == pytest.approx(
        np.mean([np.exp(x @ LAW.mean[0] @ X[j] + LAW.c**2 * (1 + (x @ X[j]) ** 2) / 4) for j in range(10)])
    )


def test_velocity_is_minus_mobility_times_gradient_by_finite_differences():
    a, h = 1 / len(X), 1e-6
    b, v = LAW.mobility(X), LAW.velocity(X)
    rng = np.random.default_rng(2)
    for i in range(4):
        u = rng.standard_normal(3)
        u -= (u @ X[i]) * X[i]
        Xp, Xm = X.copy(), X.copy()
        Xp[i] = np.cos(h) * X[i] + np.sin(h) * u / np.linalg.norm(u)
        Xm[i] = np.cos(h) * X[i] - np.sin(h) * u / np.linalg.norm(u)
        dF = (LAW.energy(Xp) - LAW.energy(Xm)) / (2 * h)  # = a_i g(x_i) . u_hat
        assert -b[i] * dF / a == pytest.approx(v[i] @ u / np.linalg.norm(u), rel=1e-6, abs=1e-9)
    assert LAW.slope(X) == pytest.approx(np.sqrt((v**2).sum(1) / b @ np.full(10, a)), rel=1e-12)


def test_finite_heads_converge_at_monte_carlo_rate():
    Hs = np.array([16, 64, 256, 1024])
    reps = 12
    errs = {k: [] for k in ("energy", "mobility", "velocity", "slope")}
    ref = {"energy": LAW.energy(X), "mobility": LAW.mobility(X), "velocity": LAW.velocity(X), "slope": LAW.slope(X)}
    for H in Hs:
        e = {k: [] for k in errs}
        for r in range(reps):
            A = LAW.sample(int(H), 1000 * int(H) + r)
            e["energy"].append(abs(energy(X, A) - ref["energy"]))
            e["mobility"].append(np.abs(mobility(X, A) - ref["mobility"]).max())
            e["velocity"].append(np.abs(velocity(X, A, model="gf") - ref["velocity"]).max())
            e["slope"].append(abs(slope(X, A) - ref["slope"]))
        for k in errs:
            errs[k].append(np.sqrt(np.mean(np.square(e[k]))))
    for k, v in errs.items():
        rate = np.polyfit(np.log(Hs), np.log(v), 1)[0]
        assert -0.7 < rate < -0.3, (k, v, rate)


def test_ou_law_matches_finite_ou_heads():
    P = GaussianOU(np.eye(3) * 2.0, 1.5, 0.8, A0=np.diag([3.0, 1.0, 0.0]))
    t = 0.6
    law = P.law(t)
    heads = P.finite(4000, seed=3).sampler()(t).A.numpy()
    c = P.c(t)
    assert c == pytest.approx(0.8 * np.sqrt((1 - np.exp(-3.0 * t)) / 3.0))
    np.testing.assert_allclose(heads.mean(0), law.mean[0], atol=4 * c / np.sqrt(4000))
    assert heads[:, 0, 0].std() == pytest.approx(c, rel=0.06)  # diagonal of S: variance 1
    assert heads[:, 0, 1].std() == pytest.approx(c / np.sqrt(2), rel=0.06)  # off-diagonal: variance 1/2
    assert P.stationary().c == pytest.approx(0.8 / np.sqrt(3.0))
    assert GaussianStatic(np.eye(3), 0.5).law(7.0).c == 0.5


def test_user_errors():
    with pytest.raises(ValueError, match="symmetric"):
        GaussianHeads.create(np.triu(np.ones((3, 3))), 0.5)
    with pytest.raises(ValueError, match="non-negative"):
        GaussianHeads.create(np.eye(3), -1.0)
