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

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

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
) -> torch.Tensor:
    """Step from ``x`` (the state after ``k0`` steps, at ``t0 + k0 dt``) to step ``n_steps``.

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
            if not bool(torch.isfinite(x_next).all()):
                why = "the tokens became NaN/inf"
            else:
                state = StepState(k=k, n_steps=n_steps, t=t_next, x=x_next, save=state.save)
                _notify(recorders, state, costs)
        except OverflowError as e:
            why = str(e).rstrip(".")
        if why is not None:
            if undo is not None:
                undo()
            raise StepFailed(k, t, x, why)
        x, t = x_next, t_next
        _notify(observers, state, costs)
    return x


def _notify(observers: Sequence[Observer], state: StepState, costs: Costs) -> None:
    for obs in observers:
        start = time.perf_counter()
        obs.on_step(state)
        costs.add(obs.name, time.perf_counter() - start)
