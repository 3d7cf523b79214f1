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


#: The modules the front door must not load (the heavy start a computation pays).
HEAVY_MODULES = ("torch", "numba", "matplotlib")

#: Marks the probe's report line on stderr (the command's own output comes before it).
_PROBE_MARK = "ATTNFLOW-FRONT-DOOR "

#: Runs the console script's app in this process on ``sys.argv[1:]``, then reports the exit code and
#: which of :data:`HEAVY_MODULES` got imported.
_PROBE = f"""
import json, sys
from attnflow.cli import app
try:
    app(sys.argv[1:], prog_name="attnflow")
    code = 0
except SystemExit as e:
    code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
heavy = [m for m in {HEAVY_MODULES!r} if m in sys.modules]
print({_PROBE_MARK!r} + json.dumps({{"exit": code, "heavy": heavy}}), file=sys.stderr)
"""


def front_door_probe(args: list[str], cwd: str | None = None) -> dict:
    """Run ``attnflow ARGS`` in a fresh interpreter and report ``{"exit", "heavy", "cpu_s", "output"}``:
    its exit code, which of :data:`HEAVY_MODULES` it imported, its CPU time (user + system, from
    ``resource.getrusage(RUSAGE_CHILDREN)``) and its output."""
    import json
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run([sys.executable, "-c", _PROBE, *args], capture_output=True, text=True, cwd=cwd)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    lines = proc.stderr.splitlines()
    report = next((ln for ln in reversed(lines) if ln.startswith(_PROBE_MARK)), None)
    if report is None:  # the probe itself failed: show why
        raise RuntimeError(f"the front-door probe of {args} reported nothing: {proc.stderr[-2000:]}")
    out = json.loads(report.removeprefix(_PROBE_MARK))
    text = proc.stdout + "\n".join(ln for ln in lines if not ln.startswith(_PROBE_MARK))
    return {**out, "cpu_s": cpu, "output": text}


def front_door_cases(folder: str) -> dict[str, list[str]]:
    """The front-door invocations, label -> arguments, with their inputs written under ``folder``:
    a config with a misspelt key, ``show`` of a folder that is no finished run, ``--help``, ``run --help``."""
    from pathlib import Path

    bad = Path(folder) / "misspelt.yaml"
    bad.write_text("name: misspelt\nintegration:\n  t_end: 1\n  dtt: 0.1\n")
    unfinished = Path(folder) / "unfinished"
    unfinished.mkdir(exist_ok=True)
    (unfinished / "config.yaml").write_text("name: x\n")
    return {
        "attnflow --help": ["--help"],
        "attnflow run --help": ["run", "--help"],
        "attnflow run CONFIG (misspelt key)": ["run", str(bad), "--out", str(Path(folder) / "never")],
        "attnflow show DIR (not a run)": ["show", str(unfinished)],
    }


def front_door_cpu_seconds(repeats: int = 3) -> dict[str, dict]:
    """Best-of-``repeats`` CPU seconds of each of :func:`front_door_cases` in a fresh interpreter, with
    the heavy modules it imported (the target: under 1 s and none, issue 43)."""
    import tempfile

    rows: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="attnflow-front-door-") as tmp:
        for label, args in front_door_cases(tmp).items():
            runs = [front_door_probe(args) for _ in range(repeats)]
            rows[label] = {"cpu_s": min(r["cpu_s"] for r in runs), "heavy": runs[0]["heavy"], "exit": runs[0]["exit"]}
    return rows


#: ``attnflow report`` of the preset run must cost under this many CPU seconds (issue 43).
REPORT_TARGET_CPU_S = 3.0
#: Which of :data:`HEAVY_MODULES` drawing a finished run may load: the report writes HTML (none), the
#: static figures are drawn by matplotlib.
DRAW_MAY_LOAD: dict[str, tuple[str, ...]] = {"report": (), "plot": ("matplotlib",)}


def draw_cases(run: str) -> dict[str, list[str]]:
    """``report`` and ``plot`` of the finished run folder ``run`` (each replaces its own earlier output)."""
    return {"attnflow report RUN": ["report", run], "attnflow plot RUN": ["plot", run]}


def draw_cpu_seconds(repeats: int = 3, run: str | None = None) -> dict[str, dict]:
    """Best-of-``repeats`` CPU seconds of :func:`draw_cases` in fresh interpreters, with the heavy modules
    each loaded, the modules it may load (:data:`DRAW_MAY_LOAD`), the report's size in bytes and the
    one-minute load average before the first measurement. ``run`` defaults to the preset run
    (``attnflow run --preset ou``), made once in a temporary folder (about 15 s of CPU)."""
    import os
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory(prefix="attnflow-draw-") as tmp:
        if run is None:
            run = str(Path(tmp) / "ou")
            made = front_door_probe(["run", "--preset", "ou", "--out", run, "--no-figures"])
            if made["exit"] != 0:
                raise RuntimeError(f"the preset run failed: {made['output'][-2000:]}")
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
        rows: dict[str, dict] = {}
        for label, args in draw_cases(run).items():
            runs = [front_door_probe(args) for _ in range(repeats)]
            if runs[0]["exit"] != 0:
                raise RuntimeError(f"{label} failed: {runs[0]['output'][-2000:]}")
            rows[label] = {
                "cpu_s": min(r["cpu_s"] for r in runs),
                "heavy": runs[0]["heavy"],
                "may_load": list(DRAW_MAY_LOAD[args[0]]),
                "exit": runs[0]["exit"],
                "load_average": load,
            }
        rows["attnflow report RUN"]["bytes"] = (Path(run) / "report.html").stat().st_size
    return rows
