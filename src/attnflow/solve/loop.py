"""The one stepping loop: ``x_{k+1} = step(t_k, x_k, h_k)`` under a step controller, and the observers it calls.

:func:`integrate` is the only time loop of attnflow (in the spirit of diffrax's ``diffeqsolve``):
fixed steps (a :class:`~attnflow.solve.controllers.ConstantStep`, which always accepts), adaptive
steps (a :class:`~attnflow.solve.controllers.PIController`), one token cloud or a batched ensemble,
a fresh run or a resumed one all go through it. The loop

* asks the controller for the next step (stopping exactly at save times and where the weights jump),
* makes one trial step and checks the new state with the **state guard**
  (:func:`attnflow.solve.guards.state_problem`: finite and on the unit sphere) in every mode,
* accepts or rejects it (a rejected trial is undone and retried smaller; a fixed step cannot be),
* hands every accepted state to its observers (what is saved, checked, checkpointed or shown).

The last evaluation of the field at the current state (the first-same-as-last stage of an embedded
pair, the end-of-step pass of the EDI recorder, the diagnostics pass of a saved state) is explicit
loop state, an :class:`Evaluation` passed to the next step, never found again by object identity.

Two kinds of observers: ``recorders`` run as part of the step (an ``OverflowError`` they raise,
say the diagnostics of an unnormalised field that overflows, fails the step like NaN tokens do);
``observers`` run after the step is accepted (checks, checkpoints, progress). Each one's wall time
is measured and reported, so its cost is visible beside the steps' own.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from attnflow.solve.guards import state_problem


@dataclass(frozen=True)
class Evaluation:
    """The field ``v = v_t(x)`` at the current state, from a pass already made.

    ``stats``: the ``A``-only statistics of the same pass when it gave them (what the diagnostics
    need); ``extra``: what the pass's maker keeps besides (the EDI recorder's integrands; the compiled
    small-cloud step's float64 array of ``v``, the same memory); ``fresh``:
    made at the state itself with the weights' value there (a diagnostics pass), not carried over
    from inside a step; ``counted``: the pass was counted as a field evaluation of a step.
    """

    t: float
    v: torch.Tensor
    stats: Any = None
    extra: Any = None
    fresh: bool = False


@dataclass(frozen=True)
class Trial:
    """One trial step: the new state ``y``, its error norm ``err`` (``<= 1`` accepts; 0 for fixed steps),
    and the evaluations it made at its start and end (``None`` when it made none).

    ``dense``: the step's dense output, ``s -> x(s)`` for ``s`` inside the step (on the sphere), when
    the stepper has one and the run saves through it (:func:`integrate`'s ``dense_saves``).
    ``dense_many``: the same at several times at once, ``[s_1, ..., s_m] -> (m, N, d)`` float64 array
    (a fresh one: the recorders may keep its rows), when the stepper makes them in one call.
    ``on_sphere``: the stepper already checked ``y`` as the default state guard would and it passed
    (:func:`attnflow.solve.guards.unit_rows`), so :func:`integrate` does not check it again.
    """

    y: torch.Tensor
    err: float
    start: Evaluation | None = None
    end: Evaluation | None = None
    dense: Callable[[float], torch.Tensor] | None = None
    dense_many: Callable[[list[float]], Any] | None = None
    on_sphere: bool = False


#: ``attempt(t, x, h, first) -> Trial``: one trial step from ``x`` at ``t``; ``first`` is the known
#: evaluation at ``(t, x)`` (``None``: the step evaluates it).
Attempt = Callable[[float, torch.Tensor, float, Evaluation | None], Trial]


@dataclass
class StepState:
    """An accepted state: ``x`` at time ``t`` after ``k`` of ``n_steps`` steps; ``save``: a save step;
    ``dt``: the step that led to it.

    ``evaluation``: what the step left known at the new state; ``saved``: the evaluation a recorder
    made or used there (the saver's diagnostics pass), for the observers after it.
    """

    k: int
    n_steps: int
    t: float
    x: torch.Tensor
    save: bool
    dt: float = 0.0
    evaluation: Evaluation | None = None
    saved: Evaluation | None = None


class Observer(Protocol):
    """Called with every accepted state; ``name`` labels its cost in the run's provenance."""

    name: str

    def on_step(self, state: StepState) -> None: ...


class BulkRecorder(Protocol):
    """A recorder that also takes several saved states at once: those at the save times ``ts`` inside
    one accepted step (step ``k`` of ``n_steps``, of size ``dt``), ``X`` ``(m, N, d)`` from the step's
    dense output. It must record them as ``m`` calls of ``on_step`` with save states would."""

    name: str

    def on_step(self, state: StepState) -> None: ...

    def on_saves(self, k: int, n_steps: int, ts: list[float], X: Any, dt: float) -> None: ...


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


@dataclass
class AdaptiveStats:
    """What the loop did: accepted and rejected steps, the smallest and largest accepted step."""

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


class StepControl(Protocol):
    """The running state of a step controller (:mod:`attnflow.solve.controllers` makes them)."""

    def done(self, t: float, k: int) -> bool:
        """Whether the state after ``k`` steps at ``t`` is the last."""

    def propose(self, t: float, k: int, stop: float) -> tuple[float, float, bool]:
        """The next trial step from ``t`` (after ``k`` steps): ``(h, t_new, hit)``; ``hit``: it ends at ``stop``."""

    def accept(self, err: float, h: float) -> None: ...

    def reject(self, err: float, h: float, t: float) -> bool:
        """After a rejected trial ``h``: ``True`` to retry (smaller), ``False`` when the step cannot change."""

    def n_steps(self, k: int, last: bool) -> int:
        """What :attr:`StepState.n_steps` says after ``k`` steps."""


class Saves(Protocol):
    """Which accepted states are saved (:mod:`attnflow.solve.saveat` makes them)."""

    def next_stop(self, t: float) -> float:
        """The next save time after ``t`` that steps must hit exactly (``inf``: none)."""

    def due(self, k: int, t: float) -> bool:
        """Whether the state after ``k`` steps at ``t`` is saved (consumes a save time that it hits).

        A ``take_before(t) -> list`` method, where there is one, consumes every save time before ``t``
        at once (what dense saves ask; otherwise they are taken one by one through ``next_stop``)."""


#: ``guard(x) -> sentence | None``: what is wrong with a new state (the state guard by default).
Guard = Callable[[torch.Tensor], str | None]


def integrate(
    attempt: Attempt,
    x: torch.Tensor,
    *,
    t: float,
    control: StepControl,
    saves: Saves,
    k0: int = 0,
    first: Evaluation | None = None,
    next_break: Callable[[float], float] = lambda t: math.inf,
    recorders: Sequence[Observer] = (),
    observers: Sequence[Observer] = (),
    rollback: Callable[[float], Callable[[], None]] | None = None,
    on_accept: Callable[[float, float, bool], bool] | None = None,
    guard: Guard | None = None,
    costs: Costs | None = None,
    stats: AdaptiveStats | None = None,
    dense_saves: bool = False,
) -> torch.Tensor:
    """Step from ``x`` (the state after ``k0`` steps, at time ``t``) until ``control.done``; returns the final state.

    Every step ends at or before the next stop: the next save time of ``saves`` (hit exactly), the next
    time ``next_break(t)`` where the weights jump or stop being smooth. Each trial's new state is
    checked by ``guard`` (default :func:`~attnflow.solve.guards.state_problem`). A trial with
    ``err > 1``, a guard's sentence or an ``OverflowError`` is rejected: ``rollback(t)()`` undoes what
    it changed outside the state (a weight sampler's draws) and the controller retries it smaller, or,
    when it cannot (fixed steps, or a step at its floor), :class:`StepFailed` is raised. A recorder
    may also reject an accepted state by raising :class:`StateRejected` (or overflowing): the run
    stops with :class:`StepFailed`.

    ``first``: the evaluation known at the initial state. ``on_accept(t_new, h, hit_break)`` runs
    after each accepted step, before the observers; it returns ``True`` when the weights jumped at
    ``t_new`` (the evaluations carried over from the step no longer hold there).

    ``dense_saves``: steps do not stop at save times; a save time inside an accepted step is given to
    the recorders as the step's dense output there (:attr:`Trial.dense`, which every trial must then
    carry), before the step's own new state. The observers see only the steps' states.
    """
    costs = Costs({}) if costs is None else costs
    stats = AdaptiveStats() if stats is None else stats
    guard = state_problem if guard is None else guard
    # Decided once, not per step: what the saves and the recorders offer, whether the guard is the default.
    take = getattr(saves, "take_before", None) if dense_saves else None
    bulk = all(hasattr(r, "on_saves") for r in recorders)
    default_guard = guard is state_problem
    current = first
    k = k0
    # The steps' wall time, summed here and added to ``costs`` once, at the key's usual place (first).
    step_s = 0.0
    if not control.done(t, k):
        costs.seconds.setdefault("step", 0.0)
    try:
        while not control.done(t, k):
            brk = next_break(t)
            h, t_new, hit = control.propose(t, k, brk if dense_saves else min(saves.next_stop(t), brk))
            undo = rollback(t) if rollback is not None else None
            why: str | None = None
            trial: Trial | None = None
            try:
                start = time.perf_counter()
                trial = attempt(t, x, h, current if current is not None and current.t == t else None)
                step_s += time.perf_counter() - start
                # A state the stepper checked already (the compiled step) passes the default guard.
                why = None if trial.on_sphere and default_guard else guard(trial.y)
            except OverflowError as e:
                why = _reason(e)
            if trial is not None and trial.start is not None:
                current = trial.start  # the start state is unchanged: a retry reuses its evaluation
            if trial is None or why is not None or not trial.err <= 1.0:
                if undo is not None:
                    undo()
                stats.rejected += 1
                err = math.inf if trial is None or why is not None else trial.err
                if not control.reject(err, h, t):
                    raise StepFailed(
                        k + 1, t, x,
                        why or f"error control failed: the step {h:.3g} at the floor dt_min still has error norm {err:.3g} > 1",
                    )  # fmt: skip
                continue
            k += 1
            last = control.done(t_new, k)
            n_steps = control.n_steps(k, last)
            if dense_saves:
                assert trial.dense is not None, "dense_saves needs trials with dense output"
                try:
                    if take is not None:
                        ts: list[float] = take(t_new)
                    else:
                        ts = []
                        while (s := saves.next_stop(t)) < t_new:
                            saves.due(k, s)  # consumes s
                            ts.append(s)
                    if ts and trial.dense_many is not None and bulk:
                        # Every save time of the step in one call (no Python per saved state).
                        _notify_saves(recorders, k, n_steps, ts, trial.dense_many(ts), h, costs)
                    else:
                        for s in ts:
                            inner = StepState(k=k, n_steps=n_steps, t=s, x=trial.dense(s), save=True, dt=h)
                            _notify(recorders, inner, costs)
                except (OverflowError, StateRejected) as e:
                    if undo is not None:
                        undo()
                    raise StepFailed(k, t, x, _reason(e)) from None
            state = StepState(
                k=k, n_steps=n_steps, t=t_new, x=trial.y, save=saves.due(k, t_new) or last, dt=h,
                evaluation=trial.end,
            )  # fmt: skip
            try:
                _notify(recorders, state, costs)
            except (OverflowError, StateRejected) as e:
                if undo is not None:
                    undo()
                raise StepFailed(k, t, x, _reason(e)) from None
            stats.accepted += 1
            stats.dt_smallest, stats.dt_largest = min(stats.dt_smallest, h), max(stats.dt_largest, h)
            control.accept(trial.err, h)
            x, t = trial.y, t_new
            current = state.evaluation or state.saved
            if on_accept is not None and on_accept(t, h, hit and t == brk):
                # The weights jumped at t: only a pass made at t with the new weights still holds.
                current = state.saved if state.saved is not None and state.saved.fresh else None
            _notify(observers, state, costs)
    finally:
        if step_s:
            costs.add("step", step_s)
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


def _notify_saves(
    recorders: Sequence[Any], k: int, n_steps: int, ts: list[float], X: Any, dt: float, costs: Costs
) -> None:
    for rec in recorders:
        start = time.perf_counter()
        rec.on_saves(k, n_steps, ts, X, dt)
        costs.add(rec.name, time.perf_counter() - start)
