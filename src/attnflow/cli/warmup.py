"""``attnflow warmup``: compile the numba kernels ahead of time (``make setup`` runs it)."""

from __future__ import annotations

from attnflow.cli.app import app, guarded, say


@app.command()
@guarded
def warmup() -> None:
    """Compile the numba kernels now (about 30 s of CPU, once), so that no later run pauses to compile.

    Each compiled path (fast summation's CPU loops, the small-cloud steps and ensembles) runs one tiny
    computation; numba caches the result on disk (where: printed first; see docs/performance.md).
    Running it again costs about a second.

    Example:

      attnflow warmup
    """
    from attnflow.bench.warmup import numba_cache_location
    from attnflow.bench.warmup import warmup as compile_all

    say(f"numba caches the compiled kernels in {numba_cache_location()}")
    seconds = compile_all(report=say)
    say(f"warm: {len(seconds)} compiled paths ready ({sum(seconds.values()):.1f} s)")
