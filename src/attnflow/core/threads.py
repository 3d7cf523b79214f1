"""The thread policy: how many CPU threads a piece of work uses, as an object a caller passes.

Small problems spend their time in thread start-up and spinning when other work shares the machine,
so they run on one thread when the machine is busy; large ones use the cores. ``ThreadPolicy(threads=None)``
chooses from the problem size and the load average (:meth:`ThreadPolicy.choose`: all the idle cores
for mid-sized work on a quiet machine, one thread when the cores are busy), and says why
(:class:`ThreadChoice`); ``ThreadPolicy(threads=k)`` fixes ``k``. :meth:`ThreadPolicy.applied` sets torch's
(and the BLAS pools') thread count for a block and restores the previous setting afterwards, so no
call changes process-wide settings for good.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass

from attnflow.core.errors import InputError

__all__ = ["ThreadPolicy", "ThreadChoice", "SMALL_WORK_PAIRS", "THREADED_MIN_PAIRS", "available_cores", "load_average"]

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
#: Below this many pairs x heads one thread, however idle the machine: a call is then a few hundred
#: microseconds or less, about what waking a second thread costs. Between this and
#: :data:`SMALL_WORK_PAIRS` the load average decides (the table above: two threads win 0.51-0.65x
#: on an idle machine and lose up to 15x beside a busy core). The issue's case (N = 1024, d = 16,
#: H = 4, 4.2e6) is in that band: 1.11 field evaluations a step with both threads against 1.9-2.1
#: with one on a quiet 2-core machine.
THREADED_MIN_PAIRS = 2**18


def available_cores() -> int:
    """Cores this process may run on (the affinity mask, not the machine's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def load_average() -> float | None:
    """The one-minute load average (runnable processes averaged over the cores' queue), ``None``
    where the system has none."""
    try:
        return float(os.getloadavg()[0])
    except (AttributeError, OSError):  # pragma: no cover - not Unix
        return None


@dataclass(frozen=True)
class ThreadChoice:
    """What :meth:`ThreadPolicy.choose` chose: ``threads``, the sentence saying why, and the load
    average and cores it read (``None`` when it did not read them)."""

    threads: int
    reason: str
    load: float | None = None
    cores: int | None = None

    def as_dict(self) -> dict[str, object]:
        """The choice as a run's provenance keeps it."""
        return {"threads": self.threads, "reason": self.reason, "load_average": self.load, "cores": self.cores}


@dataclass(frozen=True)
class ThreadPolicy:
    """``threads``: a fixed count, or ``None`` to choose from the work size (:meth:`for_work`)."""

    threads: int | None = None

    def __post_init__(self) -> None:
        t = self.threads
        if t is not None and (isinstance(t, bool) or not isinstance(t, int) or t < 1 or t > 1024):
            raise InputError(f"threads must be a whole number from 1 to 1024 or None (automatic); got {t!r}.")

    def choose(self, pairs: float) -> ThreadChoice:
        """The thread count for work of ``pairs`` kernel evaluations (token pairs x heads) per call, and why.

        A fixed count is kept. Otherwise: work of :data:`SMALL_WORK_PAIRS` or more takes every core;
        work below :data:`THREADED_MIN_PAIRS` one thread; in between, the idle cores, ``cores - load``
        (one-minute load average) rounded, at least one: every core on a quiet machine, one when
        the cores are busy. The load average counts this process too once it has run a while, so a
        long session of back-to-back runs drifts towards one thread (the safe side).
        """
        if self.threads is not None:
            return ThreadChoice(self.threads, f"fixed: threads={self.threads}")
        cores = available_cores()
        if pairs >= SMALL_WORK_PAIRS:
            return ThreadChoice(
                cores, f"large work ({pairs:.3g} pairs x heads >= 2^25): all {cores} cores", cores=cores
            )
        if pairs < THREADED_MIN_PAIRS or cores == 1:
            return ThreadChoice(1, f"small work ({pairs:.3g} pairs x heads < 2^18): one thread", cores=cores)
        load = load_average()
        if load is None:
            return ThreadChoice(1, "no load average to read: one thread", cores=cores)
        n = max(1, min(cores, math.floor(cores - load + 0.5)))
        state = "idle" if n == cores else "busy" if n == 1 else "partly busy"
        return ThreadChoice(
            n, f"load average {load:.2f} on {cores} cores ({state}): {n} thread{'s' if n > 1 else ''}", load, cores
        )

    def for_work(self, pairs: float) -> int:
        """The thread count for work of ``pairs`` kernel evaluations (token pairs x heads) per call (:meth:`choose`)."""
        return self.choose(pairs).threads

    @contextlib.contextmanager
    def applied(self, pairs: float) -> Iterator[int]:
        """Run the block with :meth:`for_work` threads in torch; restore the previous count after.

        When torch is not loaded yet the block may never need it (``report`` and ``plot`` of a finished
        run read NumPy arrays: importing torch here cost them ~3 s of CPU, issue 43): torch is not
        imported; ``OMP_NUM_THREADS`` is set to the count for the block instead, which a torch imported
        inside the block starts with.
        """
        n = self.for_work(pairs)
        torch = sys.modules.get("torch")
        if torch is None:
            previous = os.environ.get("OMP_NUM_THREADS")
            os.environ["OMP_NUM_THREADS"] = str(n)  # as set_num_threads below would, over the user's value
            try:
                yield n
            finally:
                if previous is None:
                    os.environ.pop("OMP_NUM_THREADS", None)
                else:
                    os.environ["OMP_NUM_THREADS"] = previous
            return
        before = torch.get_num_threads()
        if n != before:
            torch.set_num_threads(n)
        try:
            yield n
        finally:
            if torch.get_num_threads() != before:
                torch.set_num_threads(before)
