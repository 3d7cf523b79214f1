"""The finite-difference ``dA/dt`` of a callable weight path (issue 28 item 6): the closed form of
``Oscillating``, the stencils' orders in ``h``, and ``FromCallable``'s ``derivative=`` contract."""

import numpy as np
import pytest
import torch

from attnflow.core.errors import InputError
from attnflow.core.heads import goe_heads, identity_heads
from attnflow.weights.processes import FD_STEP, FromCallable, Oscillating, finite_difference_derivative

# |A| ~ 5 (A_bar GOE of scale 3 plus an amplitude 2), omega up to 1.7: time scale ~ 1, the default's.
P = Oscillating(goe_heads(2, 3, 3.0, 1), 2.0 * identity_heads(2, 3, 3.0), [1.0, 1.7], [0.3, 1.1])


def _rel_err(dA: np.ndarray, t: float) -> float:
    exact = P.derivative(t).numpy()
    return float(np.abs(dA - exact).max() / np.abs(exact).max())


@pytest.mark.parametrize("t", [0.7, 3.3, 8.0])
def test_central_stencil_matches_the_closed_form(t):
    # Rounding/truncation balance at h = FD_STEP: about 2 eps / FD_STEP = 4e-13 of |A| / tau; measured 7e-13.
    assert FD_STEP == pytest.approx(1.2e-3, rel=0.01)
    assert _rel_err(finite_difference_derivative(P.A_at, t, FD_STEP), t) < 3e-12


@pytest.mark.parametrize("t", [0.0, 0.5 * FD_STEP, 1.9 * FD_STEP])
def test_forward_stencil_near_the_start_matches_the_closed_form_and_never_looks_before_it(t):
    calls: list[float] = []

    def fn(s: float) -> np.ndarray:
        calls.append(s)
        return P.A_at(s)

    dA = finite_difference_derivative(fn, t, FD_STEP)
    # The one-sided stencil's rounding is ~7x the central one's (coefficients 128/12 against 18/12): measured 3e-12.
    assert _rel_err(dA, t) < 1.5e-11
    assert min(calls) >= 0.0 and len(calls) == 5
    # Control: away from the start the central stencil reaches back 2h.
    calls.clear()
    finite_difference_derivative(fn, 3 * FD_STEP, FD_STEP)
    assert min(calls) == pytest.approx(FD_STEP) and len(calls) == 4


@pytest.mark.parametrize("t", [0.7, 0.0])  # central, then forward (one-sided)
def test_stencil_orders_in_h(t):
    hs = np.array([0.1, 0.05, 0.025, 0.0125])
    exact = P.derivative(t).numpy()
    orders = {}
    for order in (4, 2):
        err = [np.abs(finite_difference_derivative(P.A_at, t, h, order=order) - exact).max() for h in hs]
        orders[order] = np.polyfit(np.log(hs), np.log(err), 1)[0]
    # Measured: central 4.00 and 2.00; forward 3.62 (its h^5 term still felt at h = 0.1) and 1.87.
    assert abs(orders[4] - 4.0) < 0.5 and abs(orders[2] - 2.0) < 0.2, orders
    assert abs(orders[2] - 4.0) > 0.5  # control: the 2nd-order stencil fails the order-4 check
    with pytest.raises(InputError, match="order must be 2 or 4"):
        finite_difference_derivative(P.A_at, t, 0.1, order=3)
    with pytest.raises(InputError, match="step h must be positive"):
        finite_difference_derivative(P.A_at, t, 0.0)


def test_from_callable_derivative_contract():
    fd = FromCallable(P.A_at)
    assert fd.derivative_source == "finite difference" and fd.fd_step == FD_STEP
    assert _rel_err(fd.derivative(0.7).numpy(), 0.7) < 3e-12
    # time_scale scales the step
    assert FromCallable(P.A_at, time_scale=0.1).fd_step == pytest.approx(0.1 * FD_STEP)
    # A given derivative is used exactly as given (here a deliberately wrong one: the caller's).
    given = FromCallable(P.A_at, derivative=lambda t: 3.0 * P.derivative(t).numpy())
    assert given.derivative_source == "given"
    assert torch.equal(given.derivative(0.7), 3.0 * P.derivative(0.7))
    inc = FromCallable(P.A_at, derivative="increment")
    assert inc.derivative_source == "none" and inc.derivative(0.7) is None
    assert P.derivative_source == "closed form"
    with pytest.raises(InputError, match="'increment'"):
        FromCallable(P.A_at, derivative="incremental")
    with pytest.raises(InputError, match="got a float"):
        FromCallable(P.A_at, derivative=1.0)  # type: ignore[arg-type]
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(InputError, match="time_scale"):
            FromCallable(P.A_at, time_scale=bad)
