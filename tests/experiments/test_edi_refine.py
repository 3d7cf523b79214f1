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
