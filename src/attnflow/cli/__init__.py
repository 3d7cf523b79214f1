"""The ``attnflow`` command line (typer + rich).

User mistakes (a bad config, a missing folder) exit with code 2 and one clear paragraph, never a
traceback; ``--debug`` shows the traceback for bug reports. :mod:`attnflow.cli.app` holds the
application object; each command module registers its commands on it when imported here.
"""

from __future__ import annotations

from attnflow.cli import bench, edi, hf, main, pde, phase, plateaus, reproduce, stationary, sweep, view, warmup
from attnflow.cli.app import app

__all__ = [
    "app", "entrypoint", "bench", "edi", "hf", "main", "pde", "phase", "plateaus", "reproduce", "stationary",
    "sweep", "view", "warmup",
]  # fmt: skip


def entrypoint() -> None:
    """The console script ``attnflow``."""
    app()
