"""A parameter space declared once: drawn by seed for random sets, and printed as the documented ranges.

``Space(beta=Uniform(1, 3), rate=LogUniform(0.5, 2), cloud=Choice(["cap", "uniform"]))``: set ``k`` of a
run at seed ``S`` is ``space.draw(numpy.random.default_rng([S, k]))`` (the same ``S`` and ``k`` give the
same set, so one set can be rerun alone), :meth:`Space.default` the set a plain run uses, and
:meth:`Space.describe` the table of ranges for the docs and ``random_sets.json``. Borrowed from
hypothesis' strategies (a space declared once, drawn reproducibly), without its shrinking.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

#: Drawn floats are rounded to this many significant digits, so a set prints and reruns exactly.
DIGITS = 4


def _round(v: float) -> float:
    return float(f"{v:.{DIGITS}g}")


class Axis:
    """One axis of a :class:`Space`: it draws a value from ``rng``, has a default and describes its range."""

    def draw(self, rng: np.random.Generator) -> Any:
        raise NotImplementedError

    def default(self) -> Any:
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError

    def contains(self, value: Any) -> bool:
        raise NotImplementedError


@dataclass(frozen=True)
class Uniform(Axis):
    """A float uniform on ``[lo, hi]`` (default: the midpoint)."""

    lo: float
    hi: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.lo) and math.isfinite(self.hi) and self.lo <= self.hi):
            raise ValueError(f"Uniform needs finite lo <= hi; got [{self.lo}, {self.hi}]")

    def draw(self, rng: np.random.Generator) -> float:
        return min(max(_round(float(rng.uniform(self.lo, self.hi))), self.lo), self.hi)

    def default(self) -> float:
        return _round(0.5 * (self.lo + self.hi))

    def describe(self) -> str:
        return f"U[{self.lo:g}, {self.hi:g}]"

    def contains(self, value: Any) -> bool:
        return isinstance(value, (int, float)) and self.lo <= value <= self.hi


@dataclass(frozen=True)
class LogUniform(Axis):
    """A float whose logarithm is uniform on ``[log lo, log hi]`` (``0 < lo <= hi``; default: the geometric mean)."""

    lo: float
    hi: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.lo) and math.isfinite(self.hi) and 0 < self.lo <= self.hi):
            raise ValueError(f"LogUniform needs 0 < lo <= hi; got [{self.lo}, {self.hi}]")

    def draw(self, rng: np.random.Generator) -> float:
        v = _round(math.exp(float(rng.uniform(math.log(self.lo), math.log(self.hi)))))
        return min(max(v, self.lo), self.hi)

    def default(self) -> float:
        return _round(math.sqrt(self.lo * self.hi))

    def describe(self) -> str:
        return f"logU[{self.lo:g}, {self.hi:g}]"

    def contains(self, value: Any) -> bool:
        return isinstance(value, (int, float)) and self.lo <= value <= self.hi


class Choice(Axis):
    """One of ``options``, each equally likely (default: the first)."""

    def __init__(self, options: Sequence[Any]) -> None:
        self.options = list(options)
        if not self.options:
            raise ValueError("Choice needs at least one option")

    def draw(self, rng: np.random.Generator) -> Any:
        v = self.options[int(rng.integers(0, len(self.options)))]
        return v.item() if isinstance(v, np.generic) else v

    def default(self) -> Any:
        return self.options[0]

    def describe(self) -> str:
        return "one of " + ", ".join(repr(o) for o in self.options)

    def contains(self, value: Any) -> bool:
        return value in self.options

    def __repr__(self) -> str:
        return f"Choice({self.options!r})"


class Space:
    """Named axes (:class:`Uniform`, :class:`LogUniform`, :class:`Choice`, or a fixed value)."""

    def __init__(self, **axes: Any) -> None:
        self.axes: dict[str, Any] = dict(axes)

    def draw(self, rng: np.random.Generator) -> dict[str, Any]:
        """One set: each axis drawn in the order declared (a fixed value is kept as given)."""
        return {k: a.draw(rng) if isinstance(a, Axis) else a for k, a in self.axes.items()}

    def draw_set(self, seed: int, k: int) -> dict[str, Any]:
        """Set ``k`` of a run at ``seed``: :meth:`draw` with ``numpy.random.default_rng([seed, k])``."""
        return self.draw(np.random.default_rng([seed, k]))

    def default(self) -> dict[str, Any]:
        """The set a run without ``--random-sets`` uses (midpoints, geometric means, first choices)."""
        return {k: a.default() if isinstance(a, Axis) else a for k, a in self.axes.items()}

    def contains(self, params: dict[str, Any]) -> bool:
        """Whether ``params`` names exactly these axes, each within its range."""
        if set(params) != set(self.axes):
            return False
        return all(a.contains(params[k]) if isinstance(a, Axis) else params[k] == a for k, a in self.axes.items())

    def describe(self) -> dict[str, str]:
        """The documented ranges, axis by axis (``U[a, b]``, ``logU[a, b]``, ``one of ...``)."""
        return {k: a.describe() if isinstance(a, Axis) else f"fixed {a!r}" for k, a in self.axes.items()}

    def table(self) -> str:
        """:meth:`describe` as a markdown table."""
        rows = [f"| {k} | {v} |" for k, v in self.describe().items()]
        return "\n".join(["| parameter | range |", "|---|---|", *rows])
