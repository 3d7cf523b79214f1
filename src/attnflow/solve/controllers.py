"""Step controllers: how :func:`attnflow.solve.loop.integrate` chooses each step and accepts it.

* :class:`ConstantStep` ``(dt)``: every step is ``dt`` and is always accepted (times ``t0 + k dt``
  exactly, so no rounding accumulates); a step whose new state fails the guard stops the run.
* :class:`PIController` ``(rtol, atol, dt0, dt_min, dt_max)``: error control for an embedded pair
  (:data:`attnflow.schemes.integrators.ADAPTIVE`); a trial whose error norm exceeds 1 (or whose
  state fails the guard) is rejected and retried smaller.

Both are options objects that check themselves when made (one sentence naming the parameter,
:class:`~attnflow.core.errors.InputError`); :meth:`start` gives the running state the loop uses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from attnflow.config import defaults
from attnflow.core.errors import Hint, InputError

__all__ = ["ConstantStep", "PIController", "PIState", "FixedState", "positive"]


def positive(name: str, value: Any, *, zero: bool = False) -> float:
    """``value`` as a finite float ``> 0`` (``>= 0`` with ``zero``), else an :class:`InputError` naming ``name``."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise InputError(f"{name} must be a number; got {value!r}", hint=Hint(name)) from None
    if not math.isfinite(v) or v < 0 or (v == 0 and not zero):
        what = "a finite number >= 0" if zero else "a positive finite number"
        raise InputError(f"{name} must be {what}; got {value!r}", hint=Hint(name))
    return v


@dataclass(frozen=True)
class ConstantStep:
    """Fixed steps ``dt`` (the controller that always accepts)."""

    dt: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "dt", positive("dt", self.dt))

    def start(self, t0: float, t_end: float) -> FixedState:
        """The running state for a run on ``[t0, t_end]`` (a whole number of steps ``dt``)."""
        return FixedState(t0, self.dt, step_count(t0, t_end, self.dt))


@dataclass(frozen=True)
class PIController:
    """Error control: ``rtol``, ``atol`` set the error norm, ``dt0`` is the first step tried,
    ``dt_min`` / ``dt_max`` bound the step (``dt_max``: the save spacing when ``None``, see
    :func:`attnflow.solve.solver.solve`)."""

    rtol: float = defaults.RTOL
    atol: float = defaults.ATOL
    dt0: float = 0.01
    dt_min: float | None = None
    dt_max: float | None = None

    def __post_init__(self) -> None:
        rtol, atol = positive("rtol", self.rtol, zero=True), positive("atol", self.atol, zero=True)
        if rtol + atol == 0:
            raise InputError("rtol and atol must not both be zero", hint=Hint("rtol"))
        object.__setattr__(self, "rtol", rtol)
        object.__setattr__(self, "atol", atol)
        object.__setattr__(self, "dt0", positive("dt", self.dt0))
        lo = None if self.dt_min is None else positive("dt_min", self.dt_min, zero=True)
        hi = None if self.dt_max is None else positive("dt_max", self.dt_max)
        if lo is not None and hi is not None and lo > hi:
            raise InputError(f"dt_min = {lo} must not exceed dt_max = {hi}", hint=Hint("dt_min"))
        object.__setattr__(self, "dt_min", lo)
        object.__setattr__(self, "dt_max", hi)

    def bounds(self, spacing: float) -> tuple[float, float]:
        """``(dt_min, dt_max)`` with their defaults (0 and the save ``spacing``)."""
        lo = 0.0 if self.dt_min is None else float(self.dt_min)
        hi = spacing if self.dt_max is None else float(self.dt_max)
        if not lo <= hi:
            raise InputError(f"dt_min = {lo} must not exceed dt_max = {hi} (the save spacing)", hint=Hint("dt_min"))
        return lo, hi

    def start(self, t_end: float, order: int, spacing: float) -> PIState:
        """The running state for a pair whose ``min(p, q) = order``, saves every ``spacing``."""
        lo, hi = self.bounds(spacing)
        return PIState(
            k=order + 1, dt=min(float(self.dt0), hi), rtol=self.rtol, atol=self.atol, dt_min=lo, dt_max=hi, t_end=t_end
        )


def step_count(t0: float, t_end: float, dt: float) -> int:
    """The number of steps ``dt`` from ``t0`` to ``t_end`` (which must be a whole number of them)."""
    positive("dt", dt)
    if not (math.isfinite(t_end) and t_end > t0):
        raise InputError(f"t_end must be a finite number larger than t0={t0}; got {t_end}", hint=Hint("t_end"))
    n_steps = int(round((t_end - t0) / dt))
    if n_steps < 1 or abs(n_steps * dt - (t_end - t0)) > 1e-9 * max(1.0, abs(t_end - t0)):
        raise InputError(f"t_end - t0 = {t_end - t0} must be a whole number of steps dt = {dt}", hint=Hint("t_end"))
    return n_steps


@dataclass
class FixedState:
    """The running state of :class:`ConstantStep`: ``n_steps`` steps ``dt`` from ``t0``."""

    t0: float
    dt: float
    total: int

    def done(self, t: float, k: int) -> bool:
        return k >= self.total

    def propose(self, t: float, k: int, stop: float) -> tuple[float, float, bool]:
        return self.dt, self.t0 + (k + 1) * self.dt, False

    def accept(self, err: float, h: float) -> None:
        pass

    def reject(self, err: float, h: float, t: float) -> bool:
        return False  # a fixed step cannot be retried smaller: the run stops at the last good state

    def n_steps(self, k: int, last: bool) -> int:
        return self.total


@dataclass
class PIState:
    """PI step-size control (Gustafsson 1991; Hairer, Norsett & Wanner I, IV.2 and II, IV.2).

    After a step of size ``dt`` with error norm ``err`` (``<= 1`` accepted) the next step is
    ``dt * clip(safety * err^(-alpha) * err_prev^beta, fac_min, fac_max)`` with ``alpha = 0.7/k``,
    ``beta = 0.4/k``, ``k = min(p, q) + 1`` for a ``p(q)`` pair; after a rejection the factor is
    ``safety * err^(-1/k)`` (at most 1) and the step after it may not grow. ``dt`` is always clipped
    to ``[dt_min, dt_max]``. The whole state (``dt``, ``err_prev``, ``rejected_last``) is in
    :meth:`state`, so a resumed run steps exactly as the uninterrupted one.
    """

    k: int
    dt: float
    rtol: float
    atol: float
    dt_min: float = 0.0
    dt_max: float = math.inf
    t_end: float = math.inf
    err_prev: float = 1e-4
    rejected_last: bool = False
    safety: float = 0.9
    fac_min: float = 0.2
    fac_max: float = 5.0

    def done(self, t: float, k: int) -> bool:
        return t >= self.t_end

    def propose(self, t: float, k: int, stop: float) -> tuple[float, float, bool]:
        stop = min(stop, self.t_end)
        h = min(self.dt, self.dt_max)
        hit = h >= stop - t
        if hit or stop - t - h < 1e-3 * h:  # do not leave a sliver before the stop
            h, hit = stop - t, True
        return h, (stop if hit else t + h), hit

    def n_steps(self, k: int, last: bool) -> int:
        return k if last else k + 1

    def norm(self, x: torch.Tensor, y: torch.Tensor, e: torch.Tensor) -> float:
        """``err = sqrt(mean_ij (e_ij / (atol + rtol max(|x_ij|, |y_ij|)))^2)`` over every coordinate of the state."""
        scale = self.atol + self.rtol * torch.maximum(x.abs(), y.abs())
        return float(torch.sqrt(torch.mean((e / scale) ** 2)))

    def accept(self, err: float, h: float) -> None:
        """After an accepted step ``h`` (a step cut short to hit a stop keeps the larger proposal)."""
        err = max(err, 1e-10)
        fac = self.safety * err ** (-0.7 / self.k) * self.err_prev ** (0.4 / self.k)
        fac = min(self.fac_max, max(self.fac_min, fac))
        if self.rejected_last:
            fac = min(fac, 1.0)
        proposal = h * fac if h >= self.dt else max(self.dt, h * fac)
        self.dt = min(self.dt_max, max(self.dt_min, proposal))
        self.err_prev, self.rejected_last = max(err, 1e-4), False

    def reject(self, err: float, h: float, t: float) -> bool:
        """After a rejected step ``h`` from ``t``: ``False`` when ``h`` was at the floor already."""
        floor = max(self.dt_min, 1e-13 * max(1.0, abs(t)))
        if h <= floor:
            return False
        fac = 0.1 if not math.isfinite(err) else min(1.0, max(self.fac_min, self.safety * err ** (-1.0 / self.k)))
        self.dt = max(self.dt_min, h * fac)
        self.rejected_last = True
        if self.dt < floor:
            self.dt = floor
        return True

    def state(self) -> dict[str, float | bool]:
        return {"dt": self.dt, "err_prev": self.err_prev, "rejected_last": self.rejected_last}

    def set_state(self, state: dict[str, Any]) -> None:
        self.dt, self.err_prev = float(state["dt"]), float(state["err_prev"])
        self.rejected_last = bool(state["rejected_last"])
