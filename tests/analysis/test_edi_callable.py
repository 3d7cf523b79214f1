"""EDI of a callable weight path at the scheme's order (issue 28 item 6): without ``derivative=`` the
recorder integrates ``dF/dt`` with the scheme's stages, ``dA/dt`` by finite difference."""

import numpy as np
import torch

from attnflow import edi_budget, simulate, tokens
from attnflow.core.heads import identity_heads
from attnflow.experiments.edi import asymptotic_order
from attnflow.weights.processes import FromCallable, Oscillating

torch.set_num_threads(1)

X0 = tokens.uniform(12, 3, 0)
OSC = Oscillating(identity_heads(2, 3, 3.0), 2.0 * identity_heads(2, 3, 3.0), [1.0, 1.7], [0.3, 1.1])
DTS = [0.1, 0.05, 0.025]


def _budgets(process, dts=DTS, t_end=1.0):
    return [edi_budget(simulate(X0, process, t_end=t_end, dt=dt, method="rk4", save_every=10_000)) for dt in dts]


def test_callable_without_derivative_closes_the_edi_at_rk4s_order():
    calls: list[float] = []

    def fn(t: float) -> np.ndarray:
        calls.append(t)
        return OSC.A_at(t)

    fd = _budgets(FromCallable(fn))
    closed = _budgets(OSC)
    assert all(b.weights_rule == "quadrature" and b.weights_derivative == "finite difference" for b in fd)
    assert fd[0].expected_order == 4 and "finite difference" in fd[0].order_reason
    assert "finite difference" in fd[0].residual_order_reason and "weights_derivative='finite difference'" in repr(
        fd[0]
    )
    assert closed[0].weights_derivative == "closed form"
    assert min(calls) >= 0.0  # the one-sided stencil at the start: fn never asked before t = 0
    rel = np.array([b.relative_residual for b in fd])
    # The finite difference's error (about 4e-13 of dA/dt) is far below these residuals: the budgets differ from
    # the closed form's by about 7e-13 of the dissipation at every dt (6e-11, 1e-9, 1.4e-8 of the residuals).
    rel_closed = np.array([b.relative_residual for b in closed])
    assert np.abs(rel - rel_closed).max() < 1e-11
    np.testing.assert_allclose(rel, rel_closed, rtol=1e-7)
    order = asymptotic_order(DTS, rel, 0.5)[0]
    assert abs(order - 4.0) <= 0.5, (rel, order)  # measured 4.16 (local 4.27, 4.06); residuals 1.4e-2 .. 4.5e-5

    # Control: the same callable with the exact-increment rule, a first-order splitting; the order-4 check rejects it.
    inc = _budgets(FromCallable(fn, derivative="increment"))
    assert all(b.weights_rule == "increment" and b.weights_derivative == "none" for b in inc)
    assert inc[0].expected_order == 1 and "first-order" in inc[0].order_reason
    rel_inc = np.array([b.relative_residual for b in inc])
    order_inc = asymptotic_order(DTS, rel_inc, 0.5)[0]
    assert abs(order_inc - 1.0) <= 0.3 and abs(order_inc - 4.0) > 0.5, (rel_inc, order_inc)  # measured 1.10
    assert rel_inc[-1] > 100 * rel[-1]  # 1.6e-2 against 4.5e-5 at dt = 0.025


def test_given_derivative_is_used_as_given():
    dA = lambda t: OSC.derivative(t).numpy()
    given = _budgets(FromCallable(OSC.A_at, derivative=dA), dts=[0.05])[0]
    closed = _budgets(OSC, dts=[0.05])[0]
    assert given.weights_derivative == "given"
    np.testing.assert_array_equal(given.weights, closed.weights)  # bit for bit: the same matrices
    # Control: a wrong derivative (doubled) is used as given, and the budget does not close.
    wrong = _budgets(FromCallable(OSC.A_at, derivative=lambda t: 2.0 * dA(t)), dts=[0.05])[0]
    assert wrong.relative_residual > 100 * given.relative_residual


def test_a_jump_needs_the_increment_rule():
    # The documented limit: a callable with a jump at t = 0.52 (between the stages of every step). The finite
    # difference sees zero derivative at every stage and misses the jump's work; the increment rule books it.
    A = identity_heads(2, 3, 3.0)
    fn = lambda t: A if t < 0.52 else 1.5 * A
    fd = _budgets(FromCallable(fn), dts=[0.05])[0]
    inc = _budgets(FromCallable(fn, derivative="increment"), dts=[0.05])[0]
    assert fd.weights_derivative == "finite difference" and inc.weights_rule == "increment"
    assert fd.relative_residual > 10 * inc.relative_residual, (fd.relative_residual, inc.relative_residual)
