"""The stepping loop: ``x_{k+1} = step(t_k, x_k, dt)`` for ``k = k0 .. n - 1``, and the observers it calls.

The loop only steps, checks that each new state is finite, and hands every accepted state to its
observers (in the spirit of diffrax's ``SaveAt`` and progress meters). What is recorded, checked,
checkpointed or shown is an observer: :mod:`attnflow.solve.observers` has the ones
:func:`attnflow.simulate` uses. Each observer's wall time is measured and reported, so its cost is
visible beside the steps' own.

Two kinds of observers: ``recorders`` run as part of the step (an ``OverflowError`` they raise,
say the diagnostics of an unnormalised field that overflows, fails the step like NaN tokens do);
``observers`` run after the step is accepted (checks, checkpoints, progress).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

import numpy as np
import torch

#: ``step(t, x, dt) -> x_next``: one step of the integrator (with the retraction).
Step = Callable[[float, torch.Tensor, float], torch.Tensor]


@dataclass(frozen=True)
class StepState:
    """An accepted state: ``x`` at time ``t`` after ``k`` of ``n_steps`` steps; ``save``: a save step."""

    k: int
    n_steps: int
    t: float
    x: torch.Tensor
    save: bool


class Observer(Protocol):
    """Called with every accepted state; ``name`` labels its cost in the run's provenance."""

    name: str

    def on_step(self, state: StepState) -> None: ...


class StateRejected(Exception):
    """Raised by a recorder when the new state is degenerate (the message names the quantity): the
    step fails as if the tokens had become NaN."""


class StepFailed(Exception):
    """Step ``k`` (from time ``t``, the last good state ``x``) produced NaN/inf or overflowed: ``why``."""

    def __init__(self, k: int, t: float, x: torch.Tensor, why: str) -> None:
        super().__init__(why)
        self.k, self.t, self.x, self.why = k, t, x, why


@dataclass
class Costs:
    """Wall time of the run by part: ``step`` (the integrator) and each observer by name."""

    seconds: dict[str, float]

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    def rounded(self) -> dict[str, float]:
        return {k: round(v, 6) for k, v in self.seconds.items()}


def run_loop(
    step: Step,
    x: torch.Tensor,
    *,
    t0: float,
    dt: float,
    k0: int,
    n_steps: int,
    save_every: int,
    recorders: Sequence[Observer] = (),
    observers: Sequence[Observer] = (),
    rollback: Callable[[], Callable[[], None]] | None = None,
    costs: Costs | None = None,
    check: Callable[[torch.Tensor], str | None] | None = None,
) -> torch.Tensor:
    """Step from ``x`` (the state after ``k0`` steps, at ``t0 + k0 dt``) to step ``n_steps``.

    ``check(x_next)`` names what is wrong with a new state, or returns ``None`` (default: NaN/inf
    only); a recorder may also reject a state by raising :class:`StateRejected`.

    ``rollback()`` is called before each step and returns a function that undoes what the step
    changed outside the state (a weight sampler's draws) if the step fails. Raises
    :class:`StepFailed` on NaN/inf tokens or an ``OverflowError`` of the step or a recorder.
    Times are ``t0 + k dt`` exactly, so no rounding accumulates.
    """
    costs = Costs({}) if costs is None else costs
    t = t0 + k0 * dt
    for k in range(k0 + 1, n_steps + 1):
        undo = rollback() if rollback is not None else None
        t_next = t0 + k * dt
        state = StepState(k=k, n_steps=n_steps, t=t_next, x=x, save=k % save_every == 0 or k == n_steps)
        why = None
        try:
            start = time.perf_counter()
            x_next = step(t, x, dt)
            costs.add("step", time.perf_counter() - start)
            if check is not None:
                why = check(x_next)
            elif not bool(torch.isfinite(x_next).all()):
                why = "the tokens became NaN/inf"
            if why is None:
                state = StepState(k=k, n_steps=n_steps, t=t_next, x=x_next, save=state.save)
                _notify(recorders, state, costs)
        except (OverflowError, StateRejected) as e:
            why = _reason(e)
        if why is not None:
            if undo is not None:
                undo()
            raise StepFailed(k, t, x, why)
        x, t = x_next, t_next
        _notify(observers, state, costs)
    return x


def _reason(e: Exception) -> str:
    """The sentence a failed step reports (Python's bare "math range error" names no quantity)."""
    why = str(e).rstrip(".")
    if why == "math range error":
        return "a quantity of the run (the energy F, typically, at these weights) left the float range"
    return why


def _notify(observers: Sequence[Observer], state: StepState, costs: Costs) -> None:
    for obs in observers:
        start = time.perf_counter()
        obs.on_step(state)
        costs.add(obs.name, time.perf_counter() - start)


# --- Adaptive steps -----------------------------------------------------------------------------------

#: ``attempt(t, x, dt) -> (y, err)``: one trial step and its error norm (``err <= 1``: accept).
Attempt = Callable[[float, torch.Tensor, float], tuple[torch.Tensor, float]]


@dataclass
class Controller:
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
    err_prev: float = 1e-4
    rejected_last: bool = False
    safety: float = 0.9
    fac_min: float = 0.2
    fac_max: float = 5.0

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

    def reject(self, err: float, h: float) -> None:
        """After a rejected step ``h``."""
        fac = 0.1 if not math.isfinite(err) else min(1.0, max(self.fac_min, self.safety * err ** (-1.0 / self.k)))
        self.dt = max(self.dt_min, h * fac)
        self.rejected_last = True

    def state(self) -> dict[str, float | bool]:
        return {"dt": self.dt, "err_prev": self.err_prev, "rejected_last": self.rejected_last}

    def set_state(self, state: dict[str, Any]) -> None:
        self.dt, self.err_prev = float(state["dt"]), float(state["err_prev"])
        self.rejected_last = bool(state["rejected_last"])


@dataclass
class AdaptiveStats:
    """What the adaptive loop did: accepted and rejected steps, the smallest and largest accepted step."""

    accepted: int = 0
    rejected: int = 0
    dt_smallest: float = math.inf
    dt_largest: float = 0.0

    def as_dict(self) -> dict[str, float | int | None]:
        return {
            "accepted_steps": self.accepted,
            "rejected_steps": self.rejected,
            "dt_smallest": self.dt_smallest if self.accepted else None,
            "dt_largest": self.dt_largest if self.accepted else None,
        }


def run_adaptive(
    attempt: Attempt,
    x: torch.Tensor,
    *,
    t: float,
    t_end: float,
    save_times: Sequence[float],
    controller: Controller,
    next_break: Callable[[float], float] = lambda t: math.inf,
    k0: int = 0,
    recorders: Sequence[Observer] = (),
    observers: Sequence[Observer] = (),
    rollback: Callable[[float], Callable[[], None]] | None = None,
    on_accept: Callable[[float, float, bool], None] | None = None,
    costs: Costs | None = None,
    stats: AdaptiveStats | None = None,
) -> torch.Tensor:
    """Step from ``x`` at time ``t`` to ``t_end`` with error control; returns the final state.

    Every step ends at or before the next stop: the next of ``save_times`` (hit exactly; those
    states are handed to the observers with ``save=True``), the next time ``next_break(t)`` where
    the weights jump or stop being smooth, and ``t_end``. A step with ``err > 1``, NaN/inf tokens or
    an ``OverflowError`` is rejected: ``rollback(t)()`` undoes what it changed outside the state and
    it is retried smaller. A step that must shrink below ``controller.dt_min`` (or below
    ``1e-13 max(1, |t|)``) raises :class:`StepFailed`. Observers get :class:`StepState` with ``k``
    the count of accepted steps and ``n_steps = k + 1`` until the last one (``n_steps = k``).
    ``on_accept(t_new, dt, hit_break)`` runs after each accepted step, before the observers.
    """
    costs = Costs({}) if costs is None else costs
    stats = AdaptiveStats() if stats is None else stats
    saves = [s for s in save_times if s > t]
    k = k0
    while t < t_end:
        save_next = saves[0] if saves else math.inf
        brk = next_break(t)
        stop = min(save_next, brk, t_end)
        h = min(controller.dt, controller.dt_max)
        hit = h >= stop - t
        if hit or stop - t - h < 1e-3 * h:  # do not leave a sliver before the stop
            h, hit = stop - t, True
        undo = rollback(t) if rollback is not None else None
        why = None
        y = x
        try:
            start = time.perf_counter()
            y, err = attempt(t, x, h)
            costs.add("step", time.perf_counter() - start)
            if not bool(torch.isfinite(y).all()):
                why, err = "the tokens became NaN/inf", math.inf
        except OverflowError as e:
            why, err = _reason(e), math.inf
        if not err <= 1.0:
            if undo is not None:
                undo()
            stats.rejected += 1
            floor = max(controller.dt_min, 1e-13 * max(1.0, abs(t)))
            if h <= floor:
                raise StepFailed(
                    k + 1, t, x,
                    why or f"error control failed: the step {h:.3g} at the floor dt_min still has error norm {err:.3g} > 1",
                )  # fmt: skip
            controller.reject(err, h)
            if controller.dt < floor:
                controller.dt = floor
            continue
        t_new = stop if hit else t + h
        k += 1
        last = t_new >= t_end
        save = bool(saves) and t_new == saves[0]
        if save:
            saves.pop(0)
        state = StepState(k=k, n_steps=k if last else k + 1, t=t_new, x=y, save=save or last)
        try:
            _notify(recorders, state, costs)
        except (OverflowError, StateRejected) as e:
            if undo is not None:
                undo()
            raise StepFailed(k, t, x, _reason(e)) from None
        stats.accepted += 1
        stats.dt_smallest, stats.dt_largest = min(stats.dt_smallest, h), max(stats.dt_largest, h)
        controller.accept(err, h)
        x, t = y, t_new
        if on_accept is not None:
            on_accept(t, h, hit and t == brk)
        _notify(observers, state, costs)
    return x


class BatchedController:
    """``B`` systems, each with its own :class:`Controller` (a copy of ``template``): the step sizes
    ``dt`` ``(B,)`` and :meth:`accept` / :meth:`reject` over the members in a mask. Member ``b`` steps
    exactly as a single run with the same errors (the controllers are the single runs' own)."""

    def __init__(self, template: Controller, B: int) -> None:
        self.members = [replace(template) for _ in range(B)]
        self.dt = np.full(B, template.dt)

    @classmethod
    def like(cls, template: Controller, B: int) -> BatchedController:
        return cls(template, B)

    def accept(self, mask: np.ndarray, err: np.ndarray, h: np.ndarray) -> None:
        """:meth:`Controller.accept` for the members in ``mask``."""
        for b in np.flatnonzero(mask):
            c = self.members[b]
            c.accept(float(err[b]), float(h[b]))
            self.dt[b] = c.dt

    def reject(self, mask: np.ndarray, err: np.ndarray, h: np.ndarray) -> None:
        """:meth:`Controller.reject` for the members in ``mask``."""
        for b in np.flatnonzero(mask):
            c = self.members[b]
            c.reject(float(err[b]), float(h[b]))
            self.dt[b] = c.dt
