"""The schemes' explicit Runge-Kutta tableau, the one home of RK4's coefficients (issue 42: the PDE steps
with it instead of its own RK4): the step's amplification on ``y' = lambda y`` is RK4's stability
polynomial, its global order is 4, and a perturbed tableau fails both (negative control)."""

from __future__ import annotations

import math

import numpy as np
import torch

from attnflow.schemes.integrators import INTEGRATORS, RK4_TABLEAU, Tableau, explicit_rk_step


def test_rk4_tableau_amplifies_by_the_stability_polynomial():
    for z in (-2.5, -1.0, -0.3, 0.2, 0.7):
        y = explicit_rk_step(lambda t, v, z=z: z * v, 0.0, torch.tensor([1.0], dtype=torch.float64), 1.0, RK4_TABLEAU)
        assert abs(float(y[0]) - (1 + z + z**2 / 2 + z**3 / 6 + z**4 / 24)) < 1e-15
    assert INTEGRATORS["rk4"].weights == RK4_TABLEAU.b


def _error(tableau: Tableau, n: int) -> float:
    # y' = cos(t) y, y(0) = 1: y(1) = exp(sin 1). Time-dependent, so the nodes c_i matter too.
    y, h = torch.tensor([1.0], dtype=torch.float64), 1.0 / n
    for k in range(n):
        y = explicit_rk_step(lambda t, v: math.cos(t) * v, k * h, y, h, tableau)
    return abs(float(y[0]) - math.exp(math.sin(1.0)))


def test_rk4_tableau_converges_at_order_four_and_a_wrong_one_does_not():
    order = lambda tab: np.log2(_error(tab, 16) / _error(tab, 32))
    assert abs(order(RK4_TABLEAU) - 4.0) < 0.15
    # Negative controls: the nodes of the third stage moved (c_3 = 1 instead of 1/2), and weights
    # that still sum to 1 but are not RK4's: both lose the order.
    wrong_nodes = Tableau((0.0, 0.5, 1.0, 1.0), RK4_TABLEAU.a, RK4_TABLEAU.b)
    wrong_weights = Tableau(RK4_TABLEAU.c, RK4_TABLEAU.a, (0.25, 0.25, 0.25, 0.25))
    assert order(wrong_nodes) < 3.0 and order(wrong_weights) < 3.0
