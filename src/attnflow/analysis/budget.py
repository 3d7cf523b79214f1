"""The energy-dissipation budget of a recorded ``gf`` run (:class:`EDIBudget`, :func:`edi_budget`).

Read from the per-step series a run saved (:data:`attnflow.core.descriptions.STEP_SERIES`) with
NumPy only, so that drawing a finished run (``attnflow report``) needs no torch (issue 43). How the
series are recorded, and the quadrature and its order, are in :mod:`attnflow.analysis.edi`, which
re-exports both names.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from attnflow.core.errors import InputError
from attnflow.schemes.names import METHOD_ORDER


@dataclass(frozen=True)
class EDIBudget:
    """The discrete energy-dissipation budget of a trajectory, per step and cumulated.

    Per-step arrays have length ``n`` (steps); cumulative ones length ``n + 1`` at times ``t``
    (starting at 0). ``residual = energy_change + dissipation - weights``.
    """

    t: np.ndarray
    energy: np.ndarray  # F(mu_k, t_k), (n+1,)
    energy_change: np.ndarray
    weights: np.ndarray
    speed_action: np.ndarray  # 1/2 int |mu'|^2
    slope_action: np.ndarray  # 1/2 int |dF|^2
    dissipation: np.ndarray
    residual: np.ndarray
    method: str
    order: int
    dt: float
    weights_rule: str
    quadrature: str
    #: Where the quadrature's ``dA/dt`` came from: "closed form", "given", "finite difference", "none" (the
    #: increment rule), "?" (runs recorded before attnflow recorded it).
    weights_derivative: str = "?"

    def __repr__(self) -> str:
        """One line: the scheme, the size of the run and the totals (the arrays stay in the fields)."""
        return (
            f"EDIBudget(method={self.method!r}, order={self.order}, residual_order={self.residual_order}, "
            f"dt={self.dt:g}, steps={len(self.residual)}, t={self.t[0]:g}..{self.t[-1]:g}, "
            f"weights_rule={self.weights_rule!r}, weights_derivative={self.weights_derivative!r}, total_dissipation={self.total_dissipation:.6g}, "
            f"relative_residual={self.relative_residual:.3e})"
        )

    def _repr_html_(self) -> str:
        from attnflow.core.html import html_table

        return html_table(
            "EDIBudget",
            [
                ("method", f"{self.method} (order {self.order}), dt = {self.dt:g}, {len(self.residual)} steps"),
                ("residual order", f"{self.residual_order}: {self.residual_order_reason}"),
                ("weights rule, quadrature", f"{self.weights_rule}, {self.quadrature}"),
                ("weights' derivative", self.weights_derivative),
                ("t", self.t),
                ("total dissipation", self.total_dissipation),
                ("total residual", self.total_residual),
                ("relative residual", self.relative_residual),
                ("max relative residual over time", self.max_relative_residual),
            ],
        )

    @property
    def residual_order(self) -> int:
        """The order in ``dt`` the residual shrinks at: the scheme's order, except with weights that
        have no time derivative (OU, layers, samples, ``FromCallable(fn, derivative="increment")``), whose
        exact increments split each step into "weights move, then tokens move" (first order; an OU path is
        only Hoelder-1/2 in t)."""
        return 1 if self.weights_rule == "increment" else self.order

    @property
    def residual_order_reason(self) -> str:
        """Why :attr:`residual_order` is what it is, in one sentence."""
        if self.weights_rule == "increment":
            return (
                "first order whatever the scheme: these weights (e.g. Ornstein-Uhlenbeck) have no time derivative, "
                "so each step adds their exact increment (weights move, then tokens move), and an OU path is rough "
                "(Hoelder-1/2 in t)"
            )
        return (
            f"the scheme's order ({self.method}): the budget's integrands use its own stages and weights"
            f"{_derivative_note(self.weights_derivative)}"
        )

    @staticmethod
    def _cum(a: np.ndarray) -> np.ndarray:
        return np.concatenate([[0.0], np.cumsum(a)])

    @property
    def cumulative(self) -> dict[str, np.ndarray]:
        """Each term summed from ``t_0`` to ``t_k``, shape ``(n + 1,)``."""
        names = ("energy_change", "weights", "speed_action", "slope_action", "dissipation", "residual")
        return {k: self._cum(getattr(self, k)) for k in names}

    @property
    def total_dissipation(self) -> float:
        return float(self.dissipation.sum())

    @property
    def total_residual(self) -> float:
        """``F(mu_T, T) - F(mu_0, 0) + dissipation - weights`` over the whole run."""
        return float(self.residual.sum())

    @property
    def relative_residual(self) -> float:
        """``|total residual| / total dissipation``: the number the acceptance bar is stated in."""
        return abs(self.total_residual) / self.total_dissipation

    @property
    def expected_order(self) -> int:
        """The order at which the residual shrinks with the step, for weights that move inside steps.

        The scheme's order (:attr:`order`) with the quadrature rule (weights with a derivative: constant,
        oscillating, ``FromCallable(fn)`` (finite difference) and ``FromCallable(fn, derivative=dfn)``); 1 with
        the exact-increment rule (OU paths, layers, sampled arrays, ``FromCallable(fn, derivative="increment")``:
        a first-order splitting of "weights move" and "tokens move"; rms over paths for OU) and for minimising
        movements.
        Piecewise-constant weights whose jumps fall on step ends keep the scheme's order under either rule.
        """
        if self.weights_rule == "quadrature" and self.quadrature != "minimising movement":
            return self.order
        return 1

    @property
    def order_reason(self) -> str:
        """One sentence saying why :attr:`expected_order` is what it is."""
        if self.quadrature == "minimising movement":
            return "a minimising movement's De Giorgi budget is first order"
        if self.weights_rule == "quadrature":
            return (
                f"the weights' work is integrated with the scheme's own stages ({self.method}, order {self.order})"
                f"{_derivative_note(self.weights_derivative)}"
            )
        return (
            "the weights have no derivative, so each step books their exact increment: a first-order splitting "
            "(a smooth callable gets the scheme's order from FromCallable(fn) or FromCallable(fn, derivative=dfn))"
        )

    @property
    def max_relative_residual(self) -> float:
        """``max_k |cumulated residual up to t_k| / total dissipation``."""
        return float(np.abs(self.cumulative["residual"]).max()) / self.total_dissipation


def edi_budget(trajectory) -> EDIBudget:
    """The discrete EDI of a ``gf`` :class:`~attnflow.io.trajectory.Trajectory` (simulated or loaded).

    Needs the per-step series that :func:`attnflow.simulate` records for model ``gf`` (see
    :data:`~attnflow.core.descriptions.STEP_SERIES`); the quadrature and its order are described in :mod:`attnflow.analysis.edi`.
    """
    steps = getattr(trajectory, "steps", None) or {}
    if trajectory.model != "gf":
        raise InputError(
            f"the energy-dissipation identity holds for model 'gf' only; this trajectory is model {trajectory.model!r}"
        )
    if "step_energy_change" not in steps:
        raise InputError(
            "this trajectory has no per-step budget series (simulate(..., record_steps=True) records them; runs made "
            "before attnflow 0.1 with model 'gf' lack them): re-run it to get its energy-dissipation budget"
        )
    info = getattr(trajectory, "steps_info", None) or {}
    s = {k: np.asarray(v, dtype=np.float64) for k, v in steps.items()}
    dE, W = s["step_energy_change"], s["step_weight_work"]
    sp, sl = s["step_speed_action"], s["step_slope_action"]
    D = sp + sl
    t = np.concatenate([[float(trajectory.t[0])], s["step_time"]])
    E0 = float(trajectory.diagnostics["energy"][0]) if "energy" in trajectory.diagnostics else 0.0
    order = METHOD_ORDER.get(trajectory.method, -1)
    return EDIBudget(
        t=t,
        energy=E0 + np.concatenate([[0.0], np.cumsum(dE)]),
        energy_change=dE,
        weights=W,
        speed_action=sp,
        slope_action=sl,
        dissipation=D,
        residual=dE + D - W,
        method=trajectory.method,
        order=order,
        dt=float(trajectory.dt),
        weights_rule=str(info.get("weights_rule", "?")),
        quadrature=str(info.get("quadrature", "?")),
        weights_derivative=str(info.get("weights_derivative", "?")),
    )


def _derivative_note(source: str) -> str:
    """What the budget's ``dA/dt`` was, as a clause for :attr:`EDIBudget.order_reason` (empty when unknown)."""
    return {
        "closed form": "; dA/dt in closed form",
        "given": "; dA/dt as given (FromCallable(fn, derivative=dfn))",
        "finite difference": (
            "; dA/dt by a fourth-order finite difference of the callable (right for a smooth path only: "
            "a kink or jump needs FromCallable(fn, derivative='increment'))"
        ),
    }.get(source, "")
