"""Issue 28, ``edi`` at random sets: the smooth-weights grid is refined while its residual is pre-asymptotic."""

import numpy as np

from attnflow.experiments.edi import ROUNDOFF, _pre_asymptotic, asymptotic_order


def test_a_single_pair_range_above_rounding_is_pre_asymptotic():
    dts = [0.1, 0.05, 0.025]
    # Measured at seed 1 set 5 (d 7, beta 2.84): local orders 5.89, 4.26 disagree by more than 0.5.
    assert _pre_asymptotic(dts, np.array([0.664, 0.0112, 0.000585]), 0.5)
    # Control: a clean fourth-order residual has two agreeing pairs.
    clean = 3.0 * np.array(dts) ** 4
    assert not _pre_asymptotic(dts, clean, 0.5)
    assert abs(asymptotic_order(dts, clean, 0.5)[0] - 4.0) < 1e-9
    # At rounding, refining cannot help: not flagged.
    assert not _pre_asymptotic(dts, np.array([1e-6, 1e-9, 0.5 * ROUNDOFF]), 0.5)
    # First order plus an opposite-sign fourth-order term (the callable at a stiff set): local orders below 1
    # that approach it only at finer steps (0.52, 0.95, then 0.99, 1.00); flagged until two agree within 0.3.
    f = lambda h: abs(0.05 * h - 1000.0 * h**4)
    coarse = [0.025, 0.0125, 0.00625]
    assert _pre_asymptotic(coarse, np.array([f(h) for h in coarse]), 0.3)
    fine = [0.0125, 0.00625, 0.003125, 0.0015625]
    assert not _pre_asymptotic(fine, np.array([f(h) for h in fine]), 0.3)


def test_an_order_outside_its_tolerance_spends_the_refinement_budget_before_a_fail():
    """Local orders that agree (4.71, 4.61) but still drift towards 4 are refined; a clean order-4 residual is
    not; a wrong order that stays wrong (3) is refined and stays a FAIL (the control of the rule)."""
    from attnflow.experiments.edi import EXPECTED_ORDER, ORDER_TOLERANCE, _needs_refinement

    dts = [0.1, 0.05, 0.025]
    seed4_set2 = np.array([0.988, 0.0378, 0.00155])  # measured, oscillating weights, seed 4 set 2
    assert not _pre_asymptotic(dts, seed4_set2, ORDER_TOLERANCE["oscillating"])  # the old rule stopped here
    assert _needs_refinement(dts, seed4_set2, "oscillating")
    # Measured one level finer (the same set): 8.27e-5 then 4.8e-6: order within 0.5 of 4, no more refinement.
    finer = [0.1, 0.05, 0.025, 0.0125, 0.00625]
    rel = np.array([0.988, 0.0378, 0.00155, 8.27e-05, 4.8e-06])
    order = asymptotic_order(finer, rel, ORDER_TOLERANCE["oscillating"])[0]
    assert abs(order - EXPECTED_ORDER["oscillating"]) <= ORDER_TOLERANCE["oscillating"]
    assert not _needs_refinement(finer, rel, "oscillating")
    assert not _needs_refinement(dts, np.array([1.6e-4, 1e-5, 6.25e-7]), "constant")  # clean order 4
    third = np.array([h**3 for h in finer])  # a wrong order: refined, and its order stays 3
    assert _needs_refinement(finer, third, "constant")
    assert abs(asymptotic_order(finer, third, 0.5)[0] - 3.0) < 1e-9


def test_an_order_inside_its_tolerance_by_less_than_the_minimum_margin_is_refined_too():
    """Undecided is not a FAIL while the budget allows a finer grid: measured at ``--seed 6`` set 8 (d 2, beta 2.97),
    oscillating weights refined once to dt = 0.0125, the fit 4.49 lies inside 4 +- 0.5 by 0.02 of the half-width
    (below ``MIN_MARGIN``), so the grid is refined again. Controls: an order inside by more than the margin (4.3)
    and a clean order 4 are not; an order 3 stays refined and wrong."""
    from attnflow.experiments.common import MIN_MARGIN, margin_inside
    from attnflow.experiments.edi import EXPECTED_ORDER, ORDER_TOLERANCE, _needs_refinement

    dts = [0.1, 0.05, 0.025, 0.0125]
    seed6_set8 = np.array([0.977, 0.0385, 0.00164, 8.78e-05])
    order = asymptotic_order(dts, seed6_set8, ORDER_TOLERANCE["oscillating"])[0]
    e, tol = EXPECTED_ORDER["oscillating"], ORDER_TOLERANCE["oscillating"]
    assert 0 < margin_inside(order, e - tol, e + tol) < MIN_MARGIN
    assert _needs_refinement(dts, seed6_set8, "oscillating")
    decided = np.array([h**4.3 for h in dts])
    assert margin_inside(asymptotic_order(dts, decided, tol)[0], e - tol, e + tol) > MIN_MARGIN
    assert not _needs_refinement(dts, decided, "oscillating")
    assert not _needs_refinement(dts, np.array([h**4 for h in dts]), "oscillating")
    assert _needs_refinement(dts, np.array([h**3 for h in dts]), "oscillating")
