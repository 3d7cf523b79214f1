"""DOP853's dense output: the coefficients are SciPy's to the bit, the interpolant equals SciPy's
``solve_ivp(..., dense_output=True).sol(t)`` on the same steps, and it is of high order between the
step's ends (a corrupted coefficient is not)."""

from __future__ import annotations

import numpy as np
import torch

from attnflow.core.geometry import retract
from attnflow.schemes.integrators import DOP853, DOP853Pair
from helpers import smooth_field as _field
from helpers import smooth_x0 as _x0
from helpers import with_entry_changed

torch.set_num_threads(1)


def test_dense_coefficients_are_scipys_to_the_bit():
    from scipy.integrate._ivp import dop853_coefficients as dc

    n = dc.N_STAGES
    assert DOP853.c_extra == tuple(dc.C[n + 1 :])
    assert DOP853.a_extra == tuple(tuple(r) for r in dc.A[n + 1 :])
    assert DOP853.d == tuple(tuple(r) for r in dc.D)
    # Consistency: each extra stage's row sums to its time.
    assert all(abs(sum(r) - c) < 1e-14 for r, c in zip(DOP853.a_extra, DOP853.c_extra))


def _stages(f, t: float, x: torch.Tensor, h: float) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The 12 stages, the order-8 point (in R^d, as SciPy's step) and the field there (13th stage)."""
    ks = [f(t, x)]
    for s in range(1, 12):
        ks.append(f(t + DOP853.c[s] * h, x + h * sum(a * k for a, k in zip(DOP853.a[s], ks))))
    y = x + h * sum(b * k for b, k in zip(DOP853.b, ks))
    ks.append(f(t + h, y))
    return y, ks


def test_interpolant_equals_scipys_dense_output():
    from scipy.integrate import solve_ivp

    f, x0 = _field(), _x0()

    def g(t: float, y: np.ndarray) -> np.ndarray:
        return f(t, torch.from_numpy(y.reshape(6, 3))).numpy().ravel()

    sol = solve_ivp(g, (0.0, 3.0), x0.numpy().ravel(), method="DOP853", rtol=1e-6, atol=1e-9, dense_output=True)
    worst = 0.0
    for k in range(len(sol.t) - 1):
        t, h = float(sol.t[k]), float(sol.t[k + 1] - sol.t[k])
        x = torch.from_numpy(sol.y[:, k].reshape(6, 3).copy())
        y, ks = _stages(f, t, x, h)
        assert float((y - torch.from_numpy(sol.y[:, k + 1].reshape(6, 3))).abs().max()) < 1e-13
        F = DOP853.dense_coefficients(f, t, x, y, ks, h)
        for theta in (0.1, 0.37, 0.5, 0.81):
            ours = DOP853.dense_value(x, F, theta).numpy().ravel()
            worst = max(worst, float(np.abs(ours - sol.sol(t + theta * h)).max()))
    print(f"{len(sol.t) - 1} steps: max |ours - scipy| = {worst:.1e}")
    assert len(sol.t) > 5 and worst < 1e-13


def _dense_error(pair: DOP853Pair, h: float, theta: float = 0.5) -> float:
    """|interpolant - solution| at t0 + theta h after one step h (the solution from 40 fine steps)."""
    f, x = _field(), _x0()
    y, ks = pair.stages_of(f, 0.0, x, h)
    mid = retract(pair.dense_value(x, pair.dense_coefficients(f, 0.0, x, y, ks, h), theta))
    ref, n = x, 40
    for j in range(n):
        ref = DOP853.fixed_step(f, j * theta * h / n, ref, theta * h / n)
    return float((mid - ref).abs().max())


def _order(pair: DOP853Pair) -> float:
    hs = [0.6, 0.45, 0.3, 0.2]
    errs = [_dense_error(pair, h) for h in hs]
    return float(np.polyfit(np.log(hs), np.log(errs), 1)[0])


def test_interpolant_order():
    """The local error of the 7th-order interpolant inside a step is O(h^8)."""
    p = _order(DOP853)
    print(f"dense output: measured local order {p:.2f} (expected 8)")
    assert abs(p - 8) < 1.0, p


def test_interpolant_order_negative_control():
    """One coefficient of D off by 1e-3 leaves an O(h) error: the measured order collapses."""
    p = _order(with_entry_changed(DOP853, "d", 1, 5, 1e-3))
    print(f"corrupted dense output: measured local order {p:.2f}")
    assert abs(p - 8) > 3.0, p
