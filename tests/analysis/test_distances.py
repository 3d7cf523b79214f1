"""W2 on the sphere (against scipy's assignment and LP solvers) and the weighted distance W_b."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.optimize import linear_sum_assignment, linprog

from attnflow import tokens, wasserstein_sphere, weighted_wasserstein, weighted_wasserstein_bounds
from attnflow.core.heads import goe_heads

torch.set_num_threads(1)


def cost(x, y):
    return np.arccos(np.clip(x @ y.T, -1, 1)) ** 2


def test_exact_w2_matches_assignment_problem():
    x, y = tokens.uniform(30, 3, 0), tokens.uniform(30, 3, 1)
    r = wasserstein_sphere(x, y)
    i, j = linear_sum_assignment(cost(x, y))
    assert r.method == "exact"
    assert r.value == pytest.approx(np.sqrt(cost(x, y)[i, j].mean()), rel=1e-12)


def test_exact_w2_with_masses_matches_linear_program():
    x, y = tokens.uniform(5, 4, 2), tokens.uniform(7, 4, 3)
    rng = np.random.default_rng(0)
    a, b = rng.uniform(0.5, 1, 5), rng.uniform(0.5, 1, 7)
    a, b = a / a.sum(), b / b.sum()
    M = cost(x, y)
    A_eq = np.vstack([np.kron(np.eye(5), np.ones(7)), np.kron(np.ones(5), np.eye(7))])
    lp = linprog(M.ravel(), A_eq=A_eq, b_eq=np.concatenate([a, b]), bounds=(0, None), method="highs")
    assert wasserstein_sphere(x, y, a=a, b=b).value == pytest.approx(np.sqrt(lp.fun), rel=1e-9)


def test_two_diracs_are_a_geodesic_apart():
    x, y = np.array([[1.0, 0, 0]]), np.array([[0.0, np.cos(0.3), np.sin(0.3)]])
    assert wasserstein_sphere(x, y).value == pytest.approx(np.pi / 2, rel=1e-12)


def test_entropic_and_sliced_variants():
    x, y = tokens.uniform(40, 3, 4), tokens.uniform(40, 3, 5)
    exact = wasserstein_sphere(x, y).value
    ent = wasserstein_sphere(x, y, method="sinkhorn")
    assert ent.method == "sinkhorn" and exact <= ent.value + 1e-9 and ent.value < 1.05 * exact
    sl = wasserstein_sphere(x, y, method="sliced")
    assert sl.method == "sliced" and 0 < sl.value
    assert wasserstein_sphere(x, x, method="sliced").value < 1e-12


def test_bounds_formula():
    x, y = tokens.uniform(10, 3, 6), tokens.uniform(10, 3, 7)
    A = goe_heads(3, 3, 2.0, 8)
    alpha = max(np.linalg.norm(Ah, 2) for Ah in A)
    w2 = wasserstein_sphere(x, y).value
    lo, hi = weighted_wasserstein_bounds(x, y, A)
    assert lo == pytest.approx(np.exp(-alpha / 2) * w2) and hi == pytest.approx(np.exp(alpha / 2) * w2)


def test_weighted_wasserstein_inside_bounds_and_equal_w2_for_constant_mobility():
    x, y = tokens.uniform(10, 3, 6), tokens.uniform(10, 3, 7)
    A = goe_heads(2, 3, 2.0, 8)
    lo, hi = weighted_wasserstein_bounds(x, y, A)
    r = weighted_wasserstein(x, y, A, n_segments=6, max_iter=60)
    assert r.method == "particle-action" and lo <= r.value <= hi
    # A = 0: b = 1 everywhere, the geodesics are optimal and W_b = W_2.
    r0 = weighted_wasserstein(x, y, np.zeros((1, 3, 3)), n_segments=6, max_iter=60)
    assert r0.value == pytest.approx(wasserstein_sphere(x, y).value, rel=1e-10)


def test_user_errors():
    x = tokens.uniform(5, 3, 0)
    with pytest.raises(ValueError, match="unit sphere"):
        wasserstein_sphere(2 * x, x)
    with pytest.raises(ValueError, match="unknown method"):
        wasserstein_sphere(x, x, method="fast")
    with pytest.raises(ValueError, match="sum to 1"):
        wasserstein_sphere(x, x, a=np.ones(5))
