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

#: Below this many token pairs x heads per field evaluation work runs on one thread; above it, on
#: the cores. Measured on the project's 2-core machine (2026-12-01, one dense ``gf`` field evaluation
#: in float64, H = 8, d = 3, time with 2 threads / time with 1; docs/performance.md):
#:
#: ========== =============== ======================== ==============================
#: pairs x H  N (H = 8)       idle machine             a CPU-bound process beside it
#: ========== =============== ======================== ==============================
#: 5.2e5      256 (preset ou) 0.56-0.65                1.20-1.77
#: 4.2e6      724             0.57-0.60                1.17-1.94
#: 1.7e7      1448            (not idle: 1.34)         1.43
#: 3.4e7      2048            0.51                     0.85-1.24
#: 6.7e7      2896            (not idle: 0.90)         0.88
#: ========== =============== ======================== ==============================
#:
#: One thread on an idle machine costs at most the core count (2x here); two threads beside other
#: work cost up to 15x at N = 256 in the same series (the issue's 6.2 s vs 1.1 s for 50 rk4 steps).
#: From about 3.4e7 pairs two threads no longer lose beside a busy core, so that is the threshold.
SMALL_WORK_PAIRS = 2**25


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
