"""Compile the numba kernels ahead of time (``attnflow warmup``, run by ``make setup``).

The compiled loops (:mod:`attnflow.kernels.fastsum.cpu` for fast summation, :mod:`attnflow.kernels.small`
for small clouds) are compiled by numba on their first call, about 30 s of CPU in all, and cached on disk
(``cache=True``): see :func:`numba_cache_location` and ``docs/performance.md``. Warming up runs one
tiny computation through each path, so that a user's first run starts at once. A run that finds its
path cold starts ``attnflow warmup --only small`` itself, in a separate process
(:func:`attnflow.kernels.announce.prepare`), so that it too runs the cached machine code.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from attnflow.kernels.announce import compile_here, numba_cache_location

__all__ = ["GROUPS", "numba_cache_location", "warmup"]

#: The compiled paths by name (``attnflow warmup --only NAME``): fast summation, small clouds.
GROUPS = ("fast", "small")


def _tasks() -> list[tuple[str, str, Callable[[], object]]]:
    import numpy as np

    from attnflow.core import tokens
    from attnflow.core.heads import identity_heads
    from attnflow.schemes.names import ADAPTIVE_NAMES
    from attnflow.solve.ensemble import simulate_ensemble
    from attnflow.solve.simulation import simulate

    small = tokens.uniform(8, 3, 0)
    heads = identity_heads(2, 3, 1.0)

    def adaptive() -> object:
        # .diagnostics runs the deferred pass (bulk_stats, gram_batch): it compiles here too
        return [
            simulate(small, heads, t_end=0.5, dt=0.1, method=m, record_steps=False).diagnostics for m in ADAPTIVE_NAMES
        ]

    return [
        (
            "fast",
            "fast summation: compiled CPU loops (d <= 4, many tokens)",
            lambda: simulate(tokens.uniform(256, 3, 0), heads, t_end=0.02, dt=0.01, backend="fast"),
        ),
        ("small", "small clouds: compiled adaptive steps (" + ", ".join(ADAPTIVE_NAMES) + ")", adaptive),
        (
            "small",
            "small clouds: fixed steps (rk4)",
            lambda: simulate(small, heads, t_end=0.2, dt=0.05, method="rk4").diagnostics,
        ),
        (
            "small",
            "small clouds: compiled ensembles (dopri5)",
            lambda: simulate_ensemble(np.stack([small, small]), heads, t_end=0.5, dt=0.1, method="dopri5"),
        ),
    ]


def warmup(report: Callable[[str], None] = print, only: str | None = None) -> dict[str, float]:
    """Run each compiled path once (only the group ``only`` of :data:`GROUPS` when given), here, saying
    what compiles before it starts; returns seconds per path."""
    if only is not None and only not in GROUPS:
        raise ValueError(f"only must be one of {', '.join(GROUPS)}, not {only!r}")
    seconds: dict[str, float] = {}
    for group, label, task in _tasks():
        if only is not None and group != only:
            continue
        report(
            f"compiling {label} (the first time: seconds of CPU, a minute or more of wall time on a busy machine) ..."
        )
        t0 = time.perf_counter()
        with compile_here():
            task()
        seconds[label] = time.perf_counter() - t0
        report(f"  done in {seconds[label]:.1f} s")
    return seconds
