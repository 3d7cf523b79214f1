"""Start-up time of the command line: ``attnflow --help`` and ``attnflow --version`` in fresh
interpreters (what a user waits for before anything happens; the CLI imports its heavy
dependencies inside the commands that need them)."""

from __future__ import annotations

import subprocess
import sys
import time

#: The measured invocations: label -> arguments after ``attnflow``.
STARTUP_COMMANDS: dict[str, list[str]] = {"attnflow --help": ["--help"], "attnflow --version": ["--version"]}


def cli_startup_seconds(repeats: int = 3) -> dict[str, float]:
    """Best-of-``repeats`` wall time in seconds of each of :data:`STARTUP_COMMANDS`, each run as
    ``python -m attnflow ...`` in a new process (same imports as the ``attnflow`` script)."""
    best: dict[str, float] = {}
    for label, args in STARTUP_COMMANDS.items():
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            subprocess.run(
                [sys.executable, "-m", "attnflow", *args],
                check=True,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            times.append(time.perf_counter() - t0)
        best[label] = min(times)
    return best
