"""``stability-input``: what the Gronwall bound would need to be informative, and the quantity it controls."""

from __future__ import annotations

import math

import numpy as np
import pytest

from attnflow.experiments import run_experiment
from attnflow.experiments.stability import (
    DIAMETER,
    LINEAR_RESPONSE_TOL,
    ORDER_TOL,
    _in_linear_range,
    informative_horizon,
    local_orders,
)


def test_informative_horizon_closed_form():
    """A constant Lipschitz rate ``L``: the bound ``w0 exp(L t)`` reaches the diameter at ``log(pi / w0) / L``."""
    t = np.linspace(0.0, 3.0, 16)
    for L, w0 in ((2.0, 1e-3), (400.0, 1e-4)):
        expected = math.log(DIAMETER / w0) / L
        got = informative_horizon(t, L * t, w0)
        assert got == pytest.approx(expected, rel=1e-12) if expected <= 3.0 else got == math.inf
    assert informative_horizon(t, 0.1 * t, 1e-3) == math.inf  # a bound that stays informative over the run
    assert informative_horizon(t, 0.0 * t, 4.0) == 0.0  # already above the diameter at t = 0


def test_continuous_dependence_row_passes_and_its_control_fails():
    """The third row tests ``sup_t W2_t ~ W2_0`` (order 1); the pair driven by another weight path has order 0."""
    res = run_experiment(
        "stability-input", quick=True, seed=0, sets=["tokens.d=2", "tokens.n=8", "integration.t_end=1.0"]
    )
    row = res.predictions[2]
    cd = res.headline["continuous_dependence"]
    assert abs(cd["order"] - 1.0) <= ORDER_TOL and row.passed and row.margin is not None and row.margin > 0.1
    assert abs(cd["control_order"]) < 0.2 and row.control_rejected  # the control fails the criterion
    info = res.headline["informative"]
    # The rigorous bound's exponent is far above the measured growth, and it stops being informative early.
    assert info["rigorous_exponent_T"] > 10 * max(info["measured_growth"], 1.0)
    assert info["horizon_T_star"] < info["T"] and info["needed_mean_L"] < info["rigorous_mean_L"]
    assert "T*" in res.predictions[0].measured


def _saturating(levels, gain=50.0, cap=0.3):
    """Synthetic W2(t) curves: the distance grows by ``gain`` in time but saturates at ``cap`` (a flow that
    leaves its linear range at large noise), so the response is linear only where ``gain * eps << cap``."""
    t = np.linspace(0.0, 1.0, 11)
    return {e: e * np.exp(np.log(gain) * t) / (1.0 + e * np.exp(np.log(gain) * t) / cap) for e in levels}


def test_linear_range_rule_refines_only_outside_the_linear_range():
    """Closed forms: local orders of sup W2 against W2_0; a saturating response is out of its linear range
    at the documented levels and in it one level finer; an order-0 pair (the control) never is."""
    coarse = [1e-1, 1e-2, 1e-3, 1e-4]
    w2 = _saturating(coarse + [1e-5])
    lo = local_orders(w2, coarse)
    sup = {e: 50 * e / (1 + 50 * e / 0.3) for e in coarse}  # the closed forms of sup_t (at t = 1) and W2_0
    w0 = {e: e / (1 + e / 0.3) for e in coarse}
    pairs = list(zip(coarse, coarse[1:]))
    assert lo == pytest.approx([math.log(sup[a] / sup[b]) / math.log(w0[a] / w0[b]) for a, b in pairs], rel=1e-12)
    assert lo[-1] - lo[-2] > ORDER_TOL  # 0.94 against 0.64: the finest pair is not yet linear
    # gain 50: at 1e-3 the distance reaches 0.05 = cap / 6, so W2_T / W2_0 still moves by > 5% to 1e-4 ...
    r = [w2[e][-1] / w2[e][0] for e in coarse[-2:]]
    assert abs(r[1] - r[0]) / r[1] > LINEAR_RESPONSE_TOL
    assert not _in_linear_range(w2, coarse)
    # ... and by < 5% from 1e-4 to 1e-5: one refinement reaches the linear range.
    assert _in_linear_range(w2, coarse + [1e-5])
    # Control: a distance that does not shrink with the noise (another weight path) is never in range.
    flat = {e: np.full(11, 0.3) * np.r_[e / 0.3, np.ones(10)] for e in coarse + [1e-5, 1e-6]}
    assert local_orders(flat, coarse + [1e-5])[-1] == pytest.approx(0.0, abs=1e-12)
    assert not _in_linear_range(flat, coarse + [1e-5, 1e-6])  # W2_T / W2_0 = 0.3 / eps never converges
