"""What a solve saves: :class:`SaveAt` ``(every=k)`` (every ``k``-th step, fixed steps) or
``(times=[...])`` (those times, hit exactly by adaptive steps); the last state is always saved."""

from __future__ import annotations

import bisect
import math
import operator
from dataclasses import dataclass

from attnflow.core.errors import Hint, InputError

__all__ = ["SaveAt", "whole", "save_grid", "DENSE_SAVES", "DEFAULT_ADAPTIVE_SAVES", "default_save_every"]

#: Whether compiled adaptive runs and ensembles save through the pair's dense output where it has one
#: (``dop853``): steps then pass save times and the states there are interpolated (and retracted).
#: Off, every save time ends a step (the tests and the benchmark compare both).
DENSE_SAVES = True

#: At most this many save times (plus the start) for an adaptive run that names no ``save_every``:
#: every ``dt`` while that gives no more, else every ``k dt`` with the smallest whole ``k`` that does.
#: A long run (``t = 1000`` at ``dt = 0.01``) then keeps 1,001 states, not 100,001; a short one
#: keeps every ``dt`` as before.
DEFAULT_ADAPTIVE_SAVES = 1000


def default_save_every(adaptive: bool, span: float, dt: float) -> int:
    """``save_every`` when none is given: 1 for fixed steps (every step); for adaptive steps the
    smallest whole ``k`` with at most :data:`DEFAULT_ADAPTIVE_SAVES` save times ``k dt`` apart in ``span``."""
    if not adaptive:
        return 1
    return max(1, math.ceil(span / (dt * DEFAULT_ADAPTIVE_SAVES) * (1 - 1e-12)))


def whole(name: str, value: object, *, least: int = 1) -> int:
    """``value`` as an ``int >= least``; a float must be whole (``2.5`` is refused, never rounded)."""
    if isinstance(value, bool):
        raise InputError(f"{name} must be a whole number >= {least}; got {value!r}", hint=Hint(name))
    try:
        n = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        if isinstance(value, float) and math.isfinite(value) and value == int(value):
            n = int(value)
        else:
            raise InputError(f"{name} must be a whole number >= {least}; got {value!r}", hint=Hint(name)) from None
    if n < least:
        raise InputError(f"{name} must be a whole number >= {least}; got {value!r}", hint=Hint(name))
    return n


@dataclass(frozen=True)
class SaveAt:
    """Save every ``every``-th accepted step, or at ``times`` (strictly after the start; the end is added)."""

    every: int | None = None
    times: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if (self.every is None) == (self.times is None):
            raise InputError("SaveAt takes one of every= (steps) or times= (a list of times)", hint=Hint("save_every"))
        if self.every is not None:
            object.__setattr__(self, "every", whole("save_every", self.every))
        else:
            ts = tuple(float(s) for s in self.times or ())
            if any(not math.isfinite(s) for s in ts) or any(b <= a for a, b in zip(ts, ts[1:])):
                raise InputError("SaveAt times must be finite and increasing", hint=Hint("save_times"))
            object.__setattr__(self, "times", ts)

    def start(self, t: float) -> SaveRun:
        """The running state from time ``t`` (times at or before ``t`` are past)."""
        return SaveRun(self.every, [s for s in (self.times or ()) if s > t])


@dataclass
class SaveRun:
    every: int | None
    pending: list[float]

    def next_stop(self, t: float) -> float:
        return self.pending[0] if self.pending else math.inf

    def take_before(self, t: float) -> list[float]:
        """Consume and return the pending save times strictly before ``t`` (the dense saves of one step)."""
        n = bisect.bisect_left(self.pending, t)
        taken, self.pending[:n] = self.pending[:n], []
        return taken

    def due(self, k: int, t: float) -> bool:
        if self.every is not None:
            return k % self.every == 0
        if self.pending and t == self.pending[0]:
            self.pending.pop(0)
            return True
        return False


def save_grid(t0: float, t_end: float, spacing: float) -> list[float]:
    """The save times of an adaptive run: ``t0 + k spacing`` below ``t_end``, then ``t_end``."""
    n = math.floor((t_end - t0) / spacing * (1 + 1e-12))
    times = [t0 + k * spacing for k in range(1, n + 1)]
    times = [s for s in times if s < t_end - 1e-9 * max(1.0, abs(t_end - t0))]
    return [*times, float(t_end)]
