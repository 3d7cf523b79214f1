"""The energy-dissipation identity (EDI) of docs/model.md, step by step along a ``gf`` trajectory.

Over each step ``[t_k, t_{k+1}]`` the budget compares

* the energy change ``F(mu_{k+1}, t_{k+1}) - F(mu_k, t_k)``,
* the weights' contribution ``int dF/dr (mu_r, r) dr``,
* the dissipation ``1/2 int |mu'|^2 + 1/2 int |dF|^2``,

and the residual ``energy change + dissipation - weights' contribution`` (zero for the exact flow).

Quadrature. :class:`StepRecorder` sits between the integrator and the field and evaluates the
integrands ``|mu'|^2 = ||v||_mu^2``, ``|dF|^2`` and ``dF/dt = -1/2 sum_h w_h sum_ij a_i a_j
(x_i^T dA_h/dt x_j) k_h(x_i, x_j)`` at every stage ``(t_s, Y_s)`` the scheme visits, and sums them
with the scheme's own weights ``b_s``. That is the same Runge-Kutta method applied to the ODE
augmented by ``D' = |dF|^2``, ``W' = dF/dt``, so (the retraction being a projection onto the
invariant sphere) the residual is a global error of an order-``p`` method: ``O(dt^p)`` for
``euler`` (1), ``heun`` (2), ``rk4`` (4). Schemes without stages (``jko``) use the De Giorgi form
of a minimising movement: ``1/2 int |mu'|^2 ~ sum_i a_i d(x_i, y_i)^2 / (2 tau b_k(x_i))`` (the cost
the movement paid) and ``1/2 int |dF|^2 ~ tau/2 |dF|^2(mu_{k+1}, t_k)``; weights by the trapezoid
rule; first order.

Where the weights' ``dA/dt`` comes from (``derivative_source``, recorded with the budget): a closed form
(constant, oscillating), the user's ``FromCallable(fn, derivative=dfn)``, or, for a callable given without
``derivative=``, a fourth-order finite difference of ``fn``
(:func:`attnflow.weights.processes.finite_difference_derivative`, step ``1.2e-3`` of the path's time
scale, relative error about ``4e-13``): far below the residual of any step used here, so a smooth callable
closes the budget at the scheme's order too. A callable with a kink or a jump makes the finite difference
wrong; ``FromCallable(fn, derivative="increment")`` asks for the increment rule below instead.

Weights without a derivative (Ornstein-Uhlenbeck, layers, sampled arrays, ``FromCallable(fn,
derivative="increment")``) contribute their exact increment ``F(mu_{k+1}, t_{k+1}) - F(mu_{k+1}, t_k)`` (this
carries the Ito correction). That splits each step into "weights move" and "tokens move with the
weights frozen", a first-order splitting: the residual is then ``O(dt)`` whatever the scheme. An OU path
is only Hoelder-1/2 in ``t``, so within a step the field sees weights that move by
``O(dt^{1/2})``: the residual of each step is ``O(dt^{3/2})`` with a mean of ``O(dt^2)``, and the
summed residual is ``O(dt)`` (root mean square) for every scheme. Order 1 is what is achievable
there without sub-stepping the weights.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from attnflow.analysis.budget import EDIBudget, edi_budget
from attnflow.core.descriptions import STEP_SERIES
from attnflow.core.geometry import geodesic_distance_sq
from attnflow.core.heads import Heads
from attnflow.dynamics.fields import FieldStats, field_stats, mixed_stats, state_energy
from attnflow.kernels.dispatch import head_stats
from attnflow.schemes.integrators import Integrator


class StepRecorder:
    """A :class:`~attnflow.schemes.integrators.Field` wrapper that records the EDI integrands at each stage.

    ``derivative(t) -> dA/dt`` (``(H, d, d)`` or ``None``) selects the weights rule: quadrature of
    ``dF/dt`` when it returns a matrix, exact increments otherwise. ``derivative_source``: where that
    derivative comes from (``WeightProcess.derivative_source``: closed form, given, finite difference,
    none), recorded in :meth:`info` so the budget can say it.
    """

    def __init__(self, field, derivative, integrator: Integrator, derivative_source: str | None = None):
        self.field, self.derivative, self.integrator = field, derivative, integrator
        self.model, self.a, self.w = field.model, field.a, field.w
        self.options = field.options
        self.rule = "quadrature" if derivative(0.0) is not None else "increment"
        self.derivative_source = derivative_source or ("none" if self.rule == "increment" else "?")
        self.quadrature = f"{integrator.name} stages" if integrator.weights else "minimising movement"
        self._stages: list[tuple[float, float, float]] = []
        self.rows: list[tuple[float, float, float, float, float]] = []
        # The evaluation at the end of the last step, (t, y, result): the weights' jump there is booked
        # against its F. The caller passes ``result`` back as the next step's ``start`` (explicitly:
        # the solver knows the next step starts at that state), so each step costs one kernel pass fewer.
        self._end: tuple[float, torch.Tensor, tuple] | None = None
        #: The last fresh evaluation ``(t, x, v, stats)``.
        self.last: tuple[float, torch.Tensor, torch.Tensor, FieldStats] | None = None
        #: After :meth:`step`: ``(t_end, result, stats)`` of the pass at the step's end (``stats``: what the
        #: diagnostics need there for model ``gf``, ``None`` when the step's last pass was elsewhere).
        self.end: tuple[float, tuple, FieldStats | None] | None = None

    def heads_at(self, t: float) -> Heads:
        return self.field.heads_at(t)

    def _evaluate(self, t: float, x: torch.Tensor) -> tuple[torch.Tensor, float, float, float, float]:
        """``v_t(x)``, the integrands ``(||v||_mu^2, |dF|^2, dF/dt)`` and ``F(mu, t)`` from one kernel pass."""
        return self._evaluate_with(self.heads_at(t), t, x)

    def _evaluate_with(
        self, heads: Heads, t: float, x: torch.Tensor
    ) -> tuple[torch.Tensor, float, float, float, float]:
        d = x.shape[-1]
        dA = self.derivative(t) if self.rule == "quadrature" else None
        dA_out = None
        if dA is None and self.model == "gf":
            # Everything below reads log Z and the gf field only: the heads may be mixed in the kernel.
            st = mixed_stats(x, heads, self.a, self.w, "gf", options=self.options)
        else:
            out, logZ = head_stats(x, heads, self.a, options=self.options, extra_values=dA)
            assert out is not None  # values were asked for
            st = FieldStats(out=out[..., :d], logZ=logZ, log_w=torch.log(self.w))
            dA_out = out[..., d:]
        v = st.velocity(x, self.model)
        speed2 = float(st.speed_sq(v, self.a))
        # |dF|^2 = ||v_gf||_mu^2 (v = -b g): the metric speed of the gf field, v itself for model gf.
        slope2 = speed2 if self.model == "gf" else float(st.speed_sq(st.velocity(x, "gf"), self.a))
        dFdt = 0.0 if dA_out is None else float(st.energy_rate(x, self.a, dA_out))
        F = float(st.energy(self.a))
        self.last = (t, x, v, st)
        return v, speed2, slope2, dFdt, F

    def __call__(self, t: float, x: torch.Tensor) -> torch.Tensor:
        v, speed2, slope2, dFdt, _ = self._evaluate(t, x)
        self._stages.append((speed2, slope2, dFdt))
        return v

    def step(self, t: float, x: torch.Tensor, dt: float, start: tuple | None = None) -> torch.Tensor:
        """One step of the integrator from ``(t, x)``, recording the step's budget row.

        ``start``: this recorder's evaluation at ``(t, x)`` when the caller has it (the previous
        step's :attr:`end`), else it is evaluated; it is the step's first stage.
        """
        heads0 = self.heads_at(t)
        start = self._evaluate(t, x) if start is None else start
        F0 = start[4]
        self._stages = [start[1:4]]
        y = self.integrator.step(self, t, x, dt, k1=start[0])
        end = self._evaluate(t + dt, y)
        end_stats = None if self.last is None else self.last[3]
        stages, b = self._stages, self.integrator.weights
        if b and len(stages) == len(b):
            speed = dt * sum(bs * s[0] for bs, s in zip(b, stages))
            slope = dt * sum(bs * s[1] for bs, s in zip(b, stages))
        else:
            # A minimising movement: the De Giorgi form of the budget, d(mu_k, mu_{k+1})^2 / tau for
            # int |mu'|^2 (the cost the step paid, mobility frozen at mu_k) and tau |dF|^2(mu_{k+1}, t_k).
            b0 = field_stats(x, heads0.without_values(), self.a, self.w, values=False, options=self.options).mobility()
            speed = float((self.a * geodesic_distance_sq(x, y) / b0).sum()) / dt
            slope = dt * self._evaluate_with(heads0, t, y)[2]
            stages, b = [start[1:4], end[1:4]], (0.5, 0.5)
            end_stats = None  # the last pass was at the old weights: not the end state's diagnostics
        self._end = (t + dt, y, end)
        self.end = (t + dt, end, end_stats)
        F1 = end[4]
        if self.rule == "quadrature":
            work = dt * sum(bs * s[2] for bs, s in zip(b, stages))  # trapezoid for movements
        else:
            work = F1 - state_energy(y, heads0, self.a, self.w, options=self.options)
        self.rows.append((t + dt, F1 - F0, work, 0.5 * speed, 0.5 * slope))
        return y

    # Adaptive steps (attnflow.solve.loop.integrate with a PIController): a rejected trial step is undone, and a step
    # that ends where the weights jump books the jump as weights work, as a fixed step across it does.
    def mark(self) -> tuple[int, Any, Any]:
        """What :meth:`restore` needs to undo the steps recorded after this call."""
        return len(self.rows), self._end, self.end

    def restore(self, mark: tuple[int, Any, Any]) -> None:
        """Forget the rows and the end evaluation of the steps recorded since ``mark``."""
        del self.rows[mark[0] :]
        self._end, self.end = mark[1], mark[2]

    def weights_jump(self, heads: Heads) -> None:
        """The weights jumped to ``heads`` at the end of the last step: add ``F(mu, new) - F(mu, old)``
        to that step's energy change and weights work (the increment rule) and drop the cached end."""
        assert self._end is not None and self.rows
        _, y, end = self._end
        jump = state_energy(y, heads, self.a, self.w, options=self.options) - end[4]
        t1, dE, work, speed, slope = self.rows[-1]
        self.rows[-1] = (t1, dE + jump, work + jump, speed, slope)
        self._end = self.end = None

    def series(self) -> dict[str, np.ndarray]:
        cols = np.array(self.rows, dtype=np.float64).reshape(-1, len(STEP_SERIES))
        return {name: cols[:, i] for i, name in enumerate(STEP_SERIES)}

    def info(self) -> dict[str, str]:
        return {"weights_rule": self.rule, "quadrature": self.quadrature, "weights_derivative": self.derivative_source}


__all__ = ["EDIBudget", "StepRecorder", "edi_budget"]
