"""``stability-input``: what the Gronwall bound would need to be informative, and the quantity it controls."""

from __future__ import annotations

import math

import numpy as np
import pytest

from attnflow.experiments import run_experiment
from attnflow.experiments.stability import DIAMETER, ORDER_TOL, informative_horizon


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
