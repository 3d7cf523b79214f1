"""Where the time of a fast summation goes: :func:`profile` opens a split for the calls in its block.

An open profile is per thread (:data:`_LOCAL` holds the split of this thread's open block, nothing
else): evaluations in other threads are not counted into it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

#: This thread's open profile, ``split`` (absent outside a :func:`profile` block). No cache lives here.
_LOCAL = threading.local()


def open_split() -> dict[str, float] | None:
    """The split of this thread's open :func:`profile` block, or ``None``."""
    return getattr(_LOCAL, "split", None)


class Clock:
    """Adds the time since its last lap to ``split[name]`` (nothing when no profile is open)."""

    def __init__(self, split: dict[str, float] | None) -> None:
        self.split, self.t = split, time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        if self.split is not None:
            self.split[name] = self.split.get(name, 0.0) + now - self.t
        self.t = now


@contextmanager
def timed(name: str) -> Iterator[Clock]:
    """Time the block into ``name`` of the open profile (if any)."""
    clock = Clock(open_split())
    yield clock
    clock.lap(name)


@contextmanager
def profile() -> Iterator[dict[str, float]]:
    """Seconds spent per part of :func:`~attnflow.kernels.fastsum.fast_stats` inside the block, in this
    thread: ``moments`` (key side), ``coefficients`` (``C^h`` builds and the products ``C^h G``),
    ``features`` (query side), ``evaluation`` (the products ``W phi``), ``division`` (``out`` and ``Z``),
    ``logZ`` and ``total``. The compiled query loop does the middle three block by block; a profile
    splits its time by rerunning it without its later stages (the reruns are not in ``total``)."""
    split: dict[str, float] = {}
    previous = open_split()
    _LOCAL.split = split
    start = time.perf_counter()
    try:
        yield split
    finally:
        split["total"] = split.get("total", 0.0) + time.perf_counter() - start - split.pop("rerun", 0.0)
        if previous is None:
            del _LOCAL.split
        else:
            _LOCAL.split = previous
