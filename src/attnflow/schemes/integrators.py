"""Explicit Runge-Kutta steppers on the sphere, each followed by the retraction ``x / |x|``.

The field ``v(x) = P_x u(x)`` extends smoothly off the sphere and leaves it invariant
(``d|x|^2/dt = 2 (1 - |x|^2) x.u``), so a Runge-Kutta step in ``R^d`` followed by the metric
projection keeps the method's classical order (Hairer, Lubich & Wanner, GNI IV.4). The stage
times are passed to the field so that the weights are evaluated, or for SDE weights sampled, on
the same grid: ``t``, ``t + dt/2``, ``t + dt``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from attnflow.core.errors import Hint, InputError
from attnflow.core.geometry import retract
from attnflow.schemes.field import Field
from attnflow.schemes.jko import jko_field_step


@dataclass(frozen=True)
class Integrator:
    """A stepper: ``name``, its classical ``order`` and ``step(f, t, x, dt, k1=None) -> x_next``.

    ``k1``: ``v_t(x)`` when the caller already has it (the solver's last evaluation at this state:
    a saved state's diagnostics pass, an FSAL stage), so the step does not evaluate it again.

    ``weights`` are the Runge-Kutta weights ``b_s`` of the field evaluations in the order the step
    makes them (``None`` for schemes that do not evaluate the field, such as ``jko``): the same
    weights integrate any scalar along the step at the scheme's order (see :mod:`attnflow.analysis.edi`).
    """

    name: str
    order: int
    step: Callable[..., torch.Tensor]
    weights: tuple[float, ...] | None = None
    #: Field evaluations per step when there are no stage weights (the inner iterations of a movement).
    cost: float | None = None
    #: Half the length of the explicit method's stability interval on the negative real axis, as
    #: calibrated for the step warning (see :data:`attnflow.solve.guards.STABLE_DT_L`); ``None``: implicit.
    stable_dt_l: float | None = None

    @property
    def evaluations(self) -> float:
        """Field evaluations per step (what a cost estimate multiplies)."""
        return float(len(self.weights)) if self.weights else float(self.cost or 1.0)


@dataclass(frozen=True)
class Tableau:
    """An explicit Runge-Kutta (Butcher) tableau: nodes ``c_i``, stage matrix ``a_ij`` (row ``i`` holds
    ``j < i``) and weights ``b_i``; stage ``k_i = f(t + c_i h, y + h sum_j a_ij k_j)``, step
    ``y + h sum_i b_i k_i`` (:func:`explicit_rk_step`)."""

    c: tuple[float, ...]
    a: tuple[tuple[float, ...], ...]
    b: tuple[float, ...]


#: The classical fourth-order tableau: the stages of :func:`_rk4` and the weights of ``INTEGRATORS["rk4"]``.
RK4_TABLEAU = Tableau(
    c=(0.0, 0.5, 0.5, 1.0),
    a=((), (0.5,), (0.0, 0.5), (0.0, 0.0, 1.0)),
    b=(1.0 / 6.0, 1.0 / 3.0, 1.0 / 3.0, 1.0 / 6.0),
)


def explicit_rk_step(
    rate: Callable[[float, torch.Tensor], torch.Tensor], t: float, y: torch.Tensor, h: float, tableau: Tableau
) -> torch.Tensor:
    """One step ``y_{n+1} = y_n + h sum_i b_i k_i`` of ``dy/dt = rate(t, y)`` by ``tableau``, in a linear
    space (no retraction: the PDE's Galerkin coefficients; the particles' steppers retract onto the sphere)."""
    ks: list[torch.Tensor] = []
    for ci, row in zip(tableau.c, tableau.a):
        yi = y
        for aij, kj in zip(row, ks):
            if aij != 0.0:
                yi = yi + (h * aij) * kj
        ks.append(rate(t + ci * h, yi))
    increment = sum(bi * ki for bi, ki in zip(tableau.b, ks) if bi != 0.0)
    return y + h * increment


def _euler(f: Field, t: float, x: torch.Tensor, dt: float, k1: torch.Tensor | None = None) -> torch.Tensor:
    return retract(x + dt * (f(t, x) if k1 is None else k1))


def _heun(f: Field, t: float, x: torch.Tensor, dt: float, k1: torch.Tensor | None = None) -> torch.Tensor:
    k1 = f(t, x) if k1 is None else k1
    k2 = f(t + dt, x + dt * k1)
    return retract(x + 0.5 * dt * (k1 + k2))


def _rk4(f: Field, t: float, x: torch.Tensor, dt: float, k1: torch.Tensor | None = None) -> torch.Tensor:
    k1 = f(t, x) if k1 is None else k1
    k2 = f(t + 0.5 * dt, x + 0.5 * dt * k1)
    k3 = f(t + 0.5 * dt, x + 0.5 * dt * k2)
    k4 = f(t + dt, x + dt * k3)
    return retract(x + (dt / 6.0) * (k1 + 2.0 * k2 + 2.0 * k3 + k4))


def _jko(f: Field, t: float, x: torch.Tensor, dt: float, k1: torch.Tensor | None = None) -> torch.Tensor:
    # k1 is not used: a minimising movement solves for the end point and never evaluates the field at the start
    return jko_field_step(f, t, x, dt)


INTEGRATORS: dict[str, Integrator] = {
    "euler": Integrator("euler", 1, _euler, (1.0,), stable_dt_l=1.0),
    "heun": Integrator("heun", 2, _heun, (0.5, 0.5), stable_dt_l=1.0),
    "rk4": Integrator("rk4", 4, _rk4, RK4_TABLEAU.b, stable_dt_l=1.39),
}

#: Implicit steppers (model ``gf`` only), kept apart from the explicit schemes above.
MOVEMENTS: dict[str, Integrator] = {"jko": Integrator("jko", 1, _jko, cost=20.0)}


# --- Embedded pairs (adaptive steps) ----------------------------------------------------------------


@dataclass(frozen=True)
class EmbeddedPair:
    """An explicit embedded Runge-Kutta pair ``p(q)`` with the retraction: Butcher tableau as data.

    ``c``, ``a`` (lower triangle, row ``s`` has ``s`` entries), ``b`` (order ``order``, the solution
    that is kept) and ``b_hat`` (order ``embedded_order``): the error estimate of a step is
    ``e = dt sum_s (b_s - b_hat_s) k_s``. ``fsal``: the last stage is ``v_{t+dt}`` at the new point
    (first same as last), evaluated here at the retracted point ``y = retract(x + dt sum_s b_s k_s)``,
    so it is exactly the first stage of the next step.
    """

    name: str
    order: int
    embedded_order: int
    c: tuple[float, ...]
    a: tuple[tuple[float, ...], ...]
    b: tuple[float, ...]
    b_hat: tuple[float, ...]
    fsal: bool = True

    @property
    def stages(self) -> int:
        return len(self.c)

    @property
    def evaluations(self) -> float:
        """New field evaluations per accepted step (the first stage is the last one's, FSAL)."""
        return float(self.stages - 1 if self.fsal else self.stages)

    def attempt(
        self, f: Callable[[float, torch.Tensor], torch.Tensor], t: float, x: torch.Tensor, dt: float,
        k1: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
        """One trial step: ``(y, e, k_last)``, ``y`` on the sphere, ``e`` the embedded error estimate
        (in ``R^d`` per token), ``k_last`` the last stage (``v_{t+dt}(y)`` for FSAL pairs).

        ``k1``: ``v_t(x)`` if already known (the previous step's last stage), else it is evaluated.
        """
        y, ks = self.stages_of(f, t, x, dt, k1)
        return y, self.error(dt, ks), ks[-1]

    def stages_of(
        self, f: Callable[[float, torch.Tensor], torch.Tensor], t: float, x: torch.Tensor, dt: float,
        k1: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:  # fmt: skip
        """The step's new point ``y`` (on the sphere) and every stage ``k_s`` (the FSAL stage last)."""
        ks: list[torch.Tensor] = [f(t, x) if k1 is None else k1]
        y = x
        for s in range(1, self.stages):
            if self.fsal and s == self.stages - 1:
                y = retract(x + dt * _combine(self.b, ks))
                ks.append(f(t + dt, y))
                break
            ks.append(f(t + self.c[s] * dt, x + dt * _combine(self.a[s], ks)))
        else:
            y = retract(x + dt * _combine(self.b, ks))
        return y, ks

    def error(self, dt: float, ks: list[torch.Tensor]) -> torch.Tensor:
        """The embedded error estimate ``e = dt sum_s (b_s - b_hat_s) k_s``."""
        return dt * _combine(tuple(bs - bh for bs, bh in zip(self.b, self.b_hat)), ks)

    def error_weights(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """``(e, e3)``: the stage weights of the error estimate (``e3`` empty: no second estimate)."""
        return tuple(bs - bh for bs, bh in zip(self.b, self.b_hat)), ()

    def dense_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """The dense output's ``(c_extra, A_extra, D)`` as float64 arrays (``None``: the pair has none)."""
        return None

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, bool]:
        """The tableau as float64 arrays ``(c, A, b, e, e3, fsal)`` for compiled steps
        (:func:`attnflow.kernels.small.embedded_attempt`); ``A`` is ``(S, S)``, lower triangular."""
        S = self.stages
        A = np.zeros((S, S))
        for s, row in enumerate(self.a):
            A[s, : len(row)] = row
        e, e3 = self.error_weights()
        return np.array(self.c), A, np.array(self.b), np.array(e), np.array(e3, dtype=np.float64), self.fsal

    def fixed_step(
        self, f: Field, t: float, x: torch.Tensor, dt: float, k1: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The order-``order`` solution alone (no error estimate; the FSAL stage is not evaluated)."""
        n = self.stages - 1 if self.fsal else self.stages
        ks: list[torch.Tensor] = [f(t, x) if k1 is None else k1]
        for s in range(1, n):
            ks.append(f(t + self.c[s] * dt, x + dt * _combine(self.a[s], ks)))
        return retract(x + dt * _combine(self.b[:n], ks))

    def integrator(self) -> Integrator:
        """The pair as a fixed-step :class:`Integrator` (its ``b`` weights, FSAL stage dropped)."""
        n = self.stages - 1 if self.fsal else self.stages
        return Integrator(self.name, self.order, self.fixed_step, self.b[:n])


def _combine(coef: tuple[float, ...], ks: list[torch.Tensor]) -> torch.Tensor:
    """``sum_s coef_s k_s`` over the stages present (zero coefficients skipped)."""
    out: torch.Tensor | None = None
    for c, k in zip(coef, ks):
        if c != 0.0:
            out = c * k if out is None else out + c * k
    return torch.zeros_like(ks[0]) if out is None else out


#: Bogacki & Shampine (1989), order 3 with an order-2 estimate, FSAL (4 stages, 3 new per step).
BOSH3 = EmbeddedPair(
    "bosh3", 3, 2,
    c=(0.0, 0.5, 0.75, 1.0),
    a=((), (0.5,), (0.0, 0.75), (2.0 / 9.0, 1.0 / 3.0, 4.0 / 9.0)),
    b=(2.0 / 9.0, 1.0 / 3.0, 4.0 / 9.0, 0.0),
    b_hat=(7.0 / 24.0, 0.25, 1.0 / 3.0, 0.125),
)  # fmt: skip

#: Dormand & Prince (1980), order 5 with an order-4 estimate, FSAL (7 stages, 6 new per step).
DOPRI5 = EmbeddedPair(
    "dopri5", 5, 4,
    c=(0.0, 0.2, 0.3, 0.8, 8.0 / 9.0, 1.0, 1.0),
    a=(
        (),
        (0.2,),
        (3.0 / 40.0, 9.0 / 40.0),
        (44.0 / 45.0, -56.0 / 15.0, 32.0 / 9.0),
        (19372.0 / 6561.0, -25360.0 / 2187.0, 64448.0 / 6561.0, -212.0 / 729.0),
        (9017.0 / 3168.0, -355.0 / 33.0, 46732.0 / 5247.0, 49.0 / 176.0, -5103.0 / 18656.0),
        (35.0 / 384.0, 0.0, 500.0 / 1113.0, 125.0 / 192.0, -2187.0 / 6784.0, 11.0 / 84.0),
    ),
    b=(35.0 / 384.0, 0.0, 500.0 / 1113.0, 125.0 / 192.0, -2187.0 / 6784.0, 11.0 / 84.0, 0.0),
    b_hat=(5179.0 / 57600.0, 0.0, 7571.0 / 16695.0, 393.0 / 640.0, -92097.0 / 339200.0, 187.0 / 2100.0, 0.025),
)  # fmt: skip


@dataclass(frozen=True)
class DOP853Pair(EmbeddedPair):
    """Dormand & Prince's 8th-order pair DOP853 (Hairer, Norsett & Wanner I, II.10), FSAL.

    Twelve stages give the order-8 solution; the 13th is ``v_{t+dt}`` at the new point. The error
    estimate combines the 5th-order (``b - b_hat``) and 3rd-order (``e3``) estimates by Hairer's formula
    ``e = e5 |e5| / sqrt(|e5|^2 + 0.01 |e3|^2)``, which behaves like the local error of an order-7 method
    (``embedded_order = 7``). One difference from Hairer's code (and SciPy's): the damping factor is taken
    from the norms of the unscaled estimates, and the step controller then scales ``e`` by
    ``atol + rtol |y|``; theirs takes both norms after that scaling. With one scale for every component the
    two agree; with mixed scales the factor differs (SciPy's form moved the trial steps by 0.5%,
    docs/adaptive.md). The coefficients are SciPy's (``solve_ivp(method="DOP853")``, kept in
    :mod:`attnflow.schemes._dop853_tableau` and tested equal to SciPy's to the bit).
    """

    e5: tuple[float, ...] = ()
    e3: tuple[float, ...] = ()
    #: Dense output: the three extra stages' times and rows (16 entries each), and the rows ``D``.
    c_extra: tuple[float, ...] = ()
    a_extra: tuple[tuple[float, ...], ...] = ()
    d: tuple[tuple[float, ...], ...] = ()

    def dense_coefficients(
        self, f: Callable[[float, torch.Tensor], torch.Tensor], t: float, x: torch.Tensor, y: torch.Tensor,
        ks: list[torch.Tensor], dt: float,
    ) -> list[torch.Tensor]:  # fmt: skip
        """The seven coefficients ``F_0 .. F_6`` of the 7th-order interpolant of the step ``x -> y`` on
        ``[t, t + dt]`` (Hairer, Norsett & Wanner I, II.6; SciPy's ``Dop853DenseOutput``) from its 13
        stages ``ks`` (the last one the field at ``y``); evaluates the field three more times."""
        K = list(ks)
        for c, row in zip(self.c_extra, self.a_extra):
            K.append(f(t + c * dt, x + dt * _combine(row, K)))
        dy = y - x
        F = [dy, dt * K[0] - dy, 2.0 * dy - dt * (K[12] + K[0])]
        return F + [dt * _combine(row, K) for row in self.d]

    @staticmethod
    def dense_value(x: torch.Tensor, F: list[torch.Tensor], theta: float) -> torch.Tensor:
        """The interpolant at ``t + theta dt``: ``x + theta (F_0 + (1 - theta) (F_1 + theta (F_2 + ...)))``,
        in ``R^d`` (not retracted: the caller retracts a state that lives on the sphere)."""
        out = torch.zeros_like(x)
        for i, coef in enumerate(reversed(F)):
            out = (out + coef) * (theta if i % 2 == 0 else 1.0 - theta)
        return x + out

    def error_weights(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        return self.e5, self.e3

    def dense_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        if not self.d:
            return None
        return np.array(self.c_extra), np.array(self.a_extra), np.array(self.d)

    def error(self, dt: float, ks: list[torch.Tensor]) -> torch.Tensor:
        """``e5 |e5| / sqrt(|e5|^2 + 0.01 |e3|^2)``: the 5th-order estimate damped by the 3rd-order one."""
        e5 = dt * _combine(self.e5, ks)
        e3 = dt * _combine(self.e3, ks)
        n5, n3 = torch.linalg.vector_norm(e5), torch.linalg.vector_norm(e3)
        denom = torch.sqrt(n5 * n5 + 0.01 * n3 * n3)
        return e5 * torch.where(denom > 0, n5 / torch.where(denom > 0, denom, 1.0), 0.0)


def _dop853() -> DOP853Pair:
    from attnflow.schemes import _dop853_tableau as tab

    b = (*tab.B, 0.0)
    return DOP853Pair(
        "dop853", 8, 7,
        c=(*tab.C, 1.0),
        a=(*tab.A, tab.B),
        b=b,
        b_hat=tuple(bs - es for bs, es in zip(b, tab.E5)),
        e5=tab.E5,
        e3=tab.E3,
        c_extra=tab.C_EXTRA,
        a_extra=tab.A_EXTRA,
        d=tab.D,
    )  # fmt: skip


#: Dormand & Prince's DOP853: order 8, for tight tolerances (13 stages, 12 new per step).
DOP853 = _dop853()

#: The adaptive methods: ``simulate(..., method=name)`` steps with error control (the
#: :class:`~attnflow.solve.controllers.PIController` of :func:`attnflow.solve.solver.solve`).
ADAPTIVE: dict[str, EmbeddedPair] = {"bosh3": BOSH3, "dopri5": DOPRI5, "dop853": DOP853}

#: Every method name, from the registries above (the one list the config schema, the CLI and
#: ``simulate`` read): explicit steppers, implicit movements, embedded pairs.
METHODS: tuple[str, ...] = (*INTEGRATORS, *MOVEMENTS, *ADAPTIVE)


def evaluations_per_step(method: str) -> float:
    """Field evaluations per step of ``method`` (4 for a name not in the registry)."""
    if method in ADAPTIVE:
        return ADAPTIVE[method].evaluations
    known = INTEGRATORS.get(method) or MOVEMENTS.get(method)
    return 4.0 if known is None else known.evaluations


def get_integrator(method: str) -> Integrator:
    """The stepper named ``method`` (an adaptive pair gives its fixed-step form, see :data:`ADAPTIVE`)."""
    if method in ADAPTIVE:
        return ADAPTIVE[method].integrator()
    try:
        return INTEGRATORS[method] if method in INTEGRATORS else MOVEMENTS[method]
    except (KeyError, TypeError):
        raise InputError(
            f"unknown method {method!r}; choose one of {', '.join(METHODS)}", hint=Hint("method")
        ) from None
