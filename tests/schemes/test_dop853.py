"""DOP853: the tableau is SciPy's to the bit, the method is of order 8 (a corrupted coefficient is
not), and adaptive runs with it agree with scipy's own DOP853 on the same field."""

from __future__ import annotations

import numpy as np
import torch

from attnflow.schemes.integrators import ADAPTIVE, DOP853, EmbeddedPair
from helpers import smooth_field as _field
from helpers import smooth_x0 as _x0
from helpers import with_entry_changed

torch.set_num_threads(1)


def test_tableau_is_scipys_to_the_bit():
    from scipy.integrate._ivp import dop853_coefficients as dc

    n = dc.N_STAGES
    assert DOP853.c[:n] == tuple(dc.C[:n]) and DOP853.c[n] == 1.0
    for s in range(1, n):
        assert DOP853.a[s] == tuple(dc.A[s, :s]), s
    assert DOP853.b[:n] == tuple(dc.B)
    assert DOP853.e5 == tuple(dc.E5)
    assert DOP853.e3 == tuple(dc.E3)
    # Consistency conditions a tableau typo breaks: rows of A sum to c, b sums to 1.
    assert all(abs(sum(DOP853.a[s]) - DOP853.c[s]) < 1e-14 for s in range(1, n))
    assert abs(sum(DOP853.b) - 1.0) < 1e-14
    assert "dop853" in ADAPTIVE


def _solve(pair: EmbeddedPair, n: int, T: float = 2.0) -> torch.Tensor:
    f, x, h = _field(), _x0(), T / n
    for k in range(n):
        x = pair.fixed_step(f, k * h, x, h)
    return x


def measured_order(pair: EmbeddedPair) -> float:
    ref = _solve(pair, 256)
    ns = [4, 6, 8, 12]
    errs = [float((_solve(pair, n) - ref).abs().max()) for n in ns]
    return float(np.polyfit(np.log(ns), np.log(errs), 1)[0] * -1)


def test_order_is_eight():
    p = measured_order(DOP853)
    print(f"dop853 measured order {p:.2f} (expected 8)")
    assert abs(p - 8) < 0.5, p


def test_order_negative_control():
    """One coefficient of the 8th stage off by 1e-6 (a typo in the 7th digit) drops the order."""
    p = measured_order(with_entry_changed(DOP853, "a", 7, 3, 1e-6))
    print(f"corrupted dop853 measured order {p:.2f}")
    assert abs(p - 8) > 1.0, p


def test_error_estimate_shrinks_with_the_step():
    """The combined estimate behaves like an order-7 local error, O(dt^8); a blind estimate is zero."""
    f, x = _field(), _x0()
    hs = [0.4, 0.2, 0.1]
    es = [float(DOP853.attempt(f, 0.0, x, h)[1].abs().max()) for h in hs]
    q = -np.polyfit(np.log(hs), np.log(es), 1)[0] * -1
    assert q > 7.0, (q, es)
