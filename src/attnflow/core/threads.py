"""The thread policy: how many CPU threads a piece of work uses, as an object a caller passes.

Small problems spend their time in thread start-up and spinning when other work shares the machine,
so they run on one thread; large ones use the cores. ``ThreadPolicy(threads=None)`` chooses from the
problem size; ``ThreadPolicy(threads=k)`` fixes ``k``. :meth:`ThreadPolicy.applied` sets torch's
(and the BLAS pools') thread count for a block and restores the previous setting afterwards, so no
call changes process-wide settings for good.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass

from attnflow.core.errors import InputError

__all__ = ["ThreadPolicy", "SMALL_WORK_PAIRS", "available_cores"]

#: Below this many token pairs x heads per field evaluation, one thread is faster than several on a
#: 2-core machine with other load (measured; see docs/performance.md). Work above it uses the cores.
SMALL_WORK_PAIRS = 4_000_000


def available_cores() -> int:
    """Cores this process may run on (the affinity mask, not the machine's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


@dataclass(frozen=True)
class ThreadPolicy:
    """``threads``: a fixed count, or ``None`` to choose from the work size (:meth:`for_work`)."""

    threads: int | None = None

    def __post_init__(self) -> None:
        t = self.threads
        if t is not None and (isinstance(t, bool) or not isinstance(t, int) or t < 1 or t > 1024):
            raise InputError(f"threads must be a whole number from 1 to 1024 or None (automatic); got {t!r}.")

    def for_work(self, pairs: float) -> int:
        """The thread count for work of ``pairs`` kernel evaluations (token pairs x heads) per call."""
        if self.threads is not None:
            return self.threads
        return 1 if pairs < SMALL_WORK_PAIRS else available_cores()

    @contextlib.contextmanager
    def applied(self, pairs: float) -> Iterator[int]:
        """Run the block with :meth:`for_work` threads in torch; restore the previous count after."""
        import torch

        n = self.for_work(pairs)
        before = torch.get_num_threads()
        if n != before:
            torch.set_num_threads(n)
        try:
            yield n
        finally:
            if torch.get_num_threads() != before:
                torch.set_num_threads(before)
