"""``attnflow warmup``: compile the numba kernels ahead of time (``make setup`` runs it)."""

from __future__ import annotations

from typing import Optional

import typer

from attnflow.cli.app import UserError, app, guarded, say


@app.command()
@guarded
def warmup(
    only: Optional[str] = typer.Option(
        None, "--only", help="Compile one path only: 'fast' (fast summation) or 'small' (small clouds)."
    ),
) -> None:
    """Compile the numba kernels now (about 30 s of CPU, once), so that no later run pauses to compile.

    Each compiled path (fast summation's CPU loops, the small-cloud steps and ensembles) runs one tiny
    computation; numba caches the result on disk (where: printed first; see docs/performance.md).
    Running it again costs about a second. A run that finds the small-cloud path cold runs
    'attnflow warmup --only small' itself, in a separate process, so that its numbers are those of
    every later run (docs/performance.md, "Reproducibility").

    Example:

      attnflow warmup
    """
    from attnflow.bench.warmup import GROUPS, numba_cache_location
    from attnflow.bench.warmup import warmup as compile_all

    if only is not None and only not in GROUPS:
        raise UserError(f"--only must be one of {', '.join(GROUPS)}, not {only!r}.")
    say(f"numba caches the compiled kernels in {numba_cache_location()}")
    seconds = compile_all(report=say, only=only)
    say(f"warm: {len(seconds)} compiled paths ready ({sum(seconds.values()):.1f} s)")
