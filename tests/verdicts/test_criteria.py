"""The verdict toolkit on synthetic numbers: every criterion can fail, on both sides where the claim is."""

from __future__ import annotations

import math

import numpy as np
import pytest

from attnflow.verdicts import (
    Above,
    Below,
    Choice,
    Estimate,
    Exponent,
    LogUniform,
    Prediction,
    Space,
    Uniform,
    Within,
    fit_exponent,
)

Z = 1.959963984540054


def _law(p: float, n: int = 5, noise: float = 0.02, seed: int = 0) -> Estimate:
    """The fitted exponent of ``y = 3 H^p`` over ``n`` values of ``H`` with log-normal noise."""
    rng = np.random.default_rng(seed)
    H = 16.0 * 2.0 ** np.arange(n)
    return fit_exponent(H, 3.0 * H**p * np.exp(noise * rng.standard_normal(n)))


def test_fit_exponent_recovers_a_planted_law_with_a_t_interval():
    est = _law(-1.0, n=6, noise=0.0)
    assert est.value == pytest.approx(-1.0, abs=1e-12) and est.n == 6
    noisy = _law(-1.0, n=6, noise=0.05)
    lo, hi = noisy.interval
    assert lo < -1.0 < hi and hi - lo > 2 * Z * noisy.stderr  # Student t with 4 dof is wider than the normal


def test_exponent_fails_a_steeper_law_as_surely_as_the_competitor():
    crit = Exponent(-1, competitor=-0.5)
    assert crit(_law(-1.0)).outcome == "PASS"
    steep, shallow = crit(_law(-1.3)), crit(_law(-0.5))
    assert steep.outcome == "FAIL" and shallow.outcome == "FAIL"
    assert steep.margin < 0 and shallow.margin < 0
    # The issue's case: -1.31 [-1.50, -1.15] passed the one-sided test with the largest margin.
    issue = Estimate(-1.31, 0.09, n=3, ci=(-1.50, -1.15))
    v = crit(issue)
    assert v.outcome == "FAIL" and "far side" in v.why
    # The old one-sided rule (upper end below the midpoint -0.75) would have passed it: the negative control.
    assert issue.interval[1] < -0.75


def test_exponent_on_two_points_is_undecided_even_when_exact():
    crit = Exponent(-1, competitor=-0.5)
    two = fit_exponent(np.array([32.0, 64.0]), np.array([1 / 32, 1 / 64]))
    assert two.n == 2 and two.value == pytest.approx(-1.0)
    assert crit(two).outcome == "UNDECIDED"
    assert crit(Estimate(-1.0, 0.01)).outcome == "UNDECIDED"  # no n: nothing says how many points
    assert crit(Estimate(-1.0, 0.01, n=3)).outcome == "PASS"  # the same numbers on three points decide


def test_exponent_too_wide_is_undecided_and_margin_is_in_stderr():
    crit = Exponent(0.0, competitor=0.5)
    wide = Estimate(0.05, 0.2, n=4)  # holds 0, reaches past 0.25 on both sides
    assert crit(wide).outcome == "UNDECIDED"
    tight = Estimate(0.02, 0.05, n=4)  # [-0.078, 0.118]
    v = crit(tight)
    assert v.outcome == "PASS" and v.unit == "stderr"
    assert v.margin == pytest.approx((0.25 - (0.02 + Z * 0.05)) / 0.05)
    # Inside the window but missing the target by a hair (a correct law's interval does so one draw in twenty):
    # a PASS at the competitor's resolution, not a FAIL; the same width shifted out of the window fails.
    assert crit(Estimate(0.07, 0.02, n=5)).outcome == "PASS"
    assert crit(Estimate(-0.27, 0.02, n=5)).outcome == "FAIL" and crit(Estimate(-0.27, 0.02, n=5)).margin < 0


def test_below_above_within_decide_and_print_margins():
    e = Estimate(0.5, 0.1)  # [0.304, 0.696]
    assert Below(1.0)(e).outcome == "PASS" and Below(1.0)(e).margin == pytest.approx(5.0)
    assert Below(0.2)(e).outcome == "FAIL" and Below(0.2)(e).margin == pytest.approx(-3.0)
    assert Below(0.6)(e).outcome == "UNDECIDED"
    assert Above(0.2)(e).outcome == "PASS" and Above(1.0)(e).outcome == "FAIL" and Above(0.6)(e).outcome == "UNDECIDED"
    assert Within(0.4, 0.4)(e).outcome == "PASS" and Within(0.4, 0.4)(e).margin == pytest.approx(3.0)
    assert Within(2.0, 0.5)(e).outcome == "FAIL"
    assert Within(0.5, 0.1)(e).outcome == "UNDECIDED"
    exact = Estimate(0.5)  # no error: the margin is in the criterion's scale
    v = Below(1.0)(exact)
    assert v.outcome == "PASS" and v.unit == "scale" and v.margin == pytest.approx(0.5)
    assert "margin" in str(v) and "stderr" in str(Below(1.0)(e))
    assert Below(1.0)(Estimate(math.nan, 0.1)).outcome == "UNDECIDED"
    with pytest.raises(ValueError):
        Within(0.0, 0.0)


def test_prediction_needs_its_control_to_fail():
    crit = Below(1.0)
    assert Prediction("p", Estimate(0.5, 0.1), Estimate(2.0, 0.1), crit).outcome == "PASS"
    assert Prediction("p", Estimate(0.5, 0.1), Estimate(0.6, 0.1), crit).outcome == "FAIL"  # control passes
    assert Prediction("p", Estimate(0.5, 0.1), Estimate(1.0, 0.1), crit).outcome == "UNDECIDED"
    assert Prediction("p", Estimate(2.0, 0.1), Estimate(3.0, 0.1), crit).outcome == "FAIL"
    assert str(Prediction("p", Estimate(0.5, 0.1), Estimate(2.0, 0.1), crit)).startswith("PASS")


def test_space_draws_are_reproducible_and_within_range():
    space = Space(beta=Uniform(1, 3), rate=LogUniform(0.5, 2), cloud=Choice(["cap", "uniform"]), d=3)
    sets = [space.draw_set(7, k) for k in range(50)]
    assert sets[3] == space.draw(np.random.default_rng([7, 3])) == space.draw_set(7, 3)
    assert sets[0] != sets[1] and space.draw_set(8, 0) != sets[0]
    assert all(space.contains(s) for s in sets)
    assert {s["cloud"] for s in sets} == {"cap", "uniform"} and all(s["d"] == 3 for s in sets)
    rates = np.array([s["rate"] for s in sets])
    assert (np.log(rates) < 0).sum() > 10 and (np.log(rates) > 0).sum() > 10  # log-uniform: symmetric in log
    assert space.default() == {"beta": 2.0, "rate": 1.0, "cloud": "cap", "d": 3}
    assert space.describe() == {
        "beta": "U[1, 3]",
        "rate": "logU[0.5, 2]",
        "cloud": "one of 'cap', 'uniform'",
        "d": "fixed 3",
    }
    assert "| beta | U[1, 3] |" in space.table()
    assert not space.contains({**sets[0], "beta": 5.0})
    with pytest.raises(ValueError):
        LogUniform(0, 1)
