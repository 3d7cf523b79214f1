"""A prediction with its control as one value, and an experiment as one decorated function.

::

    from attnflow.verdicts import Below, Estimate, Prediction, Space, Uniform, experiment

    @experiment("decay", space=Space(rate=Uniform(0.5, 2)), seeds=2)
    def claim(params, seed):
        measured = Estimate(...)   # a case the claim covers
        control = Estimate(...)    # the same measurement where the claim must not hold
        return [Prediction("the late value is below 0.1", measured, control, Below(0.1))]

A :class:`Prediction` is PASS only when ``measured`` passes its criterion and ``control`` fails the
same criterion: a criterion that passes its control cannot tell anything. ``attnflow reproduce FILE.py``
runs every experiment a file registers, at its space's default set or ``--random-sets K`` drawn sets.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from attnflow.verdicts.criteria import Criterion, Estimate, Outcome, Verdict
from attnflow.verdicts.space import Space


@dataclass(frozen=True)
class Prediction:
    """``name``: the claim in words; ``measured``: the estimate where it must hold; ``control``: the same
    measurement where it must not; ``criterion``: what decides both."""

    name: str
    measured: Estimate
    control: Estimate
    criterion: Criterion

    @property
    def measured_verdict(self) -> Verdict:
        return self.criterion(self.measured)

    @property
    def control_verdict(self) -> Verdict:
        return self.criterion(self.control)

    @property
    def outcome(self) -> Outcome:
        """PASS when measured passes and control fails; FAIL when measured fails or the control passes
        (the criterion cannot tell); UNDECIDED otherwise (either one undecided)."""
        m, c = self.measured_verdict.outcome, self.control_verdict.outcome
        if m == "PASS" and c == "FAIL":
            return "PASS"
        if m == "FAIL" or c == "PASS":
            return "FAIL"
        return "UNDECIDED"

    def __str__(self) -> str:
        m, c = self.measured_verdict, self.control_verdict
        return f"{self.outcome}: {self.name}; measured {m}; control {c}"


Claim = Callable[[dict[str, Any], int], list[Prediction]]


@dataclass
class Experiment:
    """A registered claim: ``claim(params, seed) -> list[Prediction]`` over ``space``, run at ``seeds`` seeds
    per parameter set (seed ``base + j``, ``j < seeds``)."""

    name: str
    claim: Claim
    space: Space = field(default_factory=Space)
    seeds: int = 1
    doc: str = ""

    def run(self, params: dict[str, Any], seed: int) -> list[Prediction]:
        out = self.claim(params, seed)
        if not isinstance(out, (list, tuple)) or not all(isinstance(p, Prediction) for p in out):
            raise TypeError(f"experiment {self.name!r} must return a list of Prediction; got {type(out).__name__}")
        return list(out)


#: Experiments registered by ``@experiment`` while a file is loaded (:func:`collecting`), else globally.
_REGISTRY: list[Experiment] = []


def experiment(name: str, *, space: Space | None = None, seeds: int = 1) -> Callable[[Claim], Claim]:
    """Register ``def claim(params, seed) -> list[Prediction]`` as experiment ``name`` (the function is
    returned unchanged, so it can be called and tested directly)."""
    if not name or not isinstance(name, str):
        raise ValueError("an experiment needs a name")
    if seeds < 1:
        raise ValueError(f"experiment {name!r}: seeds must be at least 1; got {seeds}")

    def register(fn: Claim) -> Claim:
        _REGISTRY.append(Experiment(name, fn, space or Space(), int(seeds), (fn.__doc__ or "").strip()))
        return fn

    return register


@contextmanager
def collecting() -> Iterator[list[Experiment]]:
    """Collect the experiments registered inside the block (e.g. while one file is executed) apart from
    any registered before it; the global registry is left as it was."""
    saved = list(_REGISTRY)
    _REGISTRY.clear()
    found: list[Experiment] = []
    try:
        yield found
    finally:
        found.extend(_REGISTRY)
        _REGISTRY[:] = saved


def registered() -> list[Experiment]:
    """The experiments registered outside :func:`collecting` (in import order)."""
    return list(_REGISTRY)
