"""Running the compiled loops on several cores: one Python thread per share of the work (the loops
release the GIL), with torch and the BLAS libraries on one thread meanwhile.

How many threads a call uses is the caller's :class:`~attnflow.core.threads.ThreadPolicy` (carried by
the run's :class:`~attnflow.kernels.fastsum.evaluator.FastSumEvaluator`), passed here as ``workers``;
nothing reads or keeps a process-wide thread count to decide it.

Why the pools go to one thread: numba's ``np.dot`` in the loops calls SciPy's OpenBLAS, and torch's
OpenMP pool spins after its last parallel region; two thread pools taking turns with the per-core
loops spin while the other works (at N = 1e6 under load 2.4-7.3 s against 0.63-0.69 s). Those
settings are process-wide by nature, so overlapping calls (several Python threads evaluating at once)
share one lease (:func:`pools_on_one_thread`): the first to enter saves the settings, the last to
leave restores them, and no call leaves them changed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache
from types import ModuleType
from typing import Any

import torch


def loops() -> ModuleType:
    """The compiled CPU loops (:mod:`attnflow.kernels.fastsum.cpu`), imported at first use: numba's
    import costs about 0.3 s, which runs that never use fast summation should not pay. Looked up at
    each call, so a test can swap the module's functions or its ``AVAILABLE`` flag."""
    from attnflow.kernels.announce import announce
    from attnflow.kernels.fastsum import cpu

    if cpu.AVAILABLE:  # the first use may compile: say so (if a command asked, see kernels.announce)
        announce(
            "fast summation's CPU loops", (cpu.evaluate_blocks, cpu.weighted_moments, cpu.kernel_coefficients_heads)
        )
    return cpu


@cache
def _blas_pools() -> Any:
    """The BLAS libraries' thread pools (threadpoolctl), found once per process (they are the
    process's loaded libraries): numba's ``np.dot`` in the compiled loops calls SciPy's OpenBLAS."""
    from threadpoolctl import ThreadpoolController

    loops()  # loads the BLAS that the loops call, so that the controller sees it
    # Only the BLAS pools: restoring a limit resets every pool of its controller, and torch's OpenMP
    # pool is set and restored on its own.
    return ThreadpoolController().select(user_api="blas")


class _PoolLease:
    """The one lease on the process's thread pools: entered by every running evaluation, the settings
    saved by the first and restored by the last (overlapping calls would otherwise restore each
    other's lowered value)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.holders = 0
        self.saved_torch = 1
        self.blas_limit: Any = None

    def enter(self) -> None:
        with self.lock:
            if self.holders == 0:
                self.saved_torch = torch.get_num_threads()
                torch.set_num_threads(1)
                self.blas_limit = _blas_pools().limit(limits=1)
            self.holders += 1

    def leave(self) -> None:
        with self.lock:
            self.holders -= 1
            if self.holders == 0:
                torch.set_num_threads(self.saved_torch)
                self.blas_limit.restore_original_limits()
                self.blas_limit = None


_LEASE = _PoolLease()


@contextmanager
def pools_on_one_thread() -> Iterator[None]:
    """torch and the BLAS libraries on one thread inside the block; the settings as they were after
    the last overlapping block ends. torch work in other threads of the process also runs on one
    thread while a block is open (still correct, only not parallel)."""
    _LEASE.enter()
    try:
        yield
    finally:
        _LEASE.leave()


def on_cores(job: Callable[[int, int, int], None], tasks: int, workers: int) -> None:
    """Run ``job(k, lo, hi)`` over ``tasks`` split into ``min(workers, tasks)`` contiguous shares ``k``
    (one Python thread each; the compiled loops release the GIL), the pools on one thread meanwhile;
    re-raises a failure."""
    T = max(1, min(workers, tasks))
    with pools_on_one_thread():
        errors: list[BaseException] = []

        def share(k: int) -> None:
            try:
                job(k, k * tasks // T, (k + 1) * tasks // T)
            except BaseException as e:  # re-raised in the calling thread
                errors.append(e)

        threads = [threading.Thread(target=share, args=(k,), daemon=True) for k in range(1, T)]
        for t in threads:
            t.start()
        share(0)
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
