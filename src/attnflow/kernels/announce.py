"""Saying so before a compiled path compiles (issue 43: a first run no longer pauses in silence).

numba compiles attnflow's kernels on their first call and keeps them in its disk cache
(:func:`numba_cache_location`). A command that wants to tell its user installs a reporter with
:func:`compile_notices` (``attnflow run`` does, on stderr); where a compiled path is about to be used
for the first time in the process, :func:`announce` checks whether its functions will compile (not
compiled in this process, and no cache index for this version of their source) and, if so, reports
one line: what compiles, about how long it takes, where it is cached and how to do it ahead of time
(``attnflow warmup``). Without a reporter it does nothing and costs one list check.

A run compiles in a separate process (:func:`prepare`): a numba function compiled in this process runs
the machine code of this compilation, while one loaded from the cache runs the linked copy numba
stored, and the two may round differently (``_head_rows`` is a ``reassoc`` callee: up to 5e-12 apart,
``docs/performance.md``, "Reproducibility"). Compiling in a child (``attnflow warmup --only ...``) and
then loading from the cache gives every run the same bits, whether or not its cache was cold.

Light on purpose: no numba or torch import here (the functions passed in are numba's dispatchers).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = [
    "announce",
    "compile_here",
    "compile_notices",
    "needs_compile",
    "numba_cache_location",
    "prepare",
    "COMPILE_CPU_S",
    "HERE_ENV",
]

#: Set (to ``1``) in the child that :func:`prepare` starts, and by :func:`compile_here`: compile in
#: this process rather than starting another.
HERE_ENV = "ATTNFLOW_COMPILE_HERE"

#: About how many seconds of CPU each compiled path takes to compile, measured with an empty
#: ``NUMBA_CACHE_DIR`` on 2026-12-03 (9.5 s and 11.3 s; 24 s and 47 s of wall time at load 10;
#: ``docs/performance.md``, "Compiled kernels"); the wall time on a busy machine is longer.
COMPILE_CPU_S = {"fast summation's CPU loops": 10.0, "the small-cloud steps": 11.0}

_reporters: list[Callable[[str], None]] = []
_said: set[str] = set()
_here: list[bool] = []
#: The paths :func:`prepare` has found (or made) warm in this process: later runs skip numba's index
#: files (72 us a call, 3% of a 2.4 ms small run, for the kernels this process never loads).
_warm: set[str] = set()


def numba_cache_location() -> str:
    """Where numba keeps attnflow's compiled kernels: ``NUMBA_CACHE_DIR`` when set, else a
    ``__pycache__`` folder beside each kernel module (``attnflow/kernels/.../__pycache__``), or, when the
    package folder is not writable, numba's user-wide cache (``~/.cache/numba`` on Linux)."""
    where = os.environ.get("NUMBA_CACHE_DIR")
    if where:
        return where
    pkg = Path(__file__).parent
    if os.access(pkg, os.W_OK):
        return f"{pkg}/__pycache__ and {pkg}/fastsum/__pycache__"
    return str(Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "numba")


@contextmanager
def compile_notices(report: Callable[[str], None]) -> Iterator[None]:
    """Within the block, :func:`announce` reports through ``report`` (one line per compiled path)."""
    _reporters.append(report)
    try:
        yield
    finally:
        _reporters.remove(report)


def needs_compile(functions: Iterable[Any]) -> bool:
    """Whether calling the numba ``functions`` compiles one of them: it has no compiled signature in
    this process and numba's cache holds no index for this version of its source (an index counts
    whatever CPU wrote it: then numba may still compile, silently). Not a numba dispatcher: ``False``."""
    for fn in functions:
        if getattr(fn, "signatures", None):
            continue  # compiled (or loaded) in this process already
        cache = getattr(fn, "_cache", None)
        load = getattr(getattr(cache, "_cache_file", None), "_load_index", None)
        if load is None:
            continue  # not a cached numba function (numba missing, or a test's stand-in)
        try:
            if not load():  # {} when absent or stale (the source changed since)
                return True
        except Exception:  # numba's private cache layout changed: say nothing rather than fail a run
            return False
    return False


def announce(what: str, functions: Iterable[Any]) -> bool:
    """Report that ``what`` (a key of :data:`COMPILE_CPU_S`) is compiling, once per process, when a
    reporter is installed and :func:`needs_compile`; returns whether it reported."""
    if not _reporters or what in _said or not needs_compile(functions):
        return False
    _said.add(what)
    cpu = COMPILE_CPU_S.get(what)
    took = f"about {cpu:.0f} s of CPU, more wall time on a busy machine" if cpu else "seconds of CPU"
    _reporters[-1](
        f"compiling {what} with numba (first use only: {took}); cached in {numba_cache_location()} for later "
        "runs ('attnflow warmup' compiles every path ahead of time) ..."
    )
    return True


def _spawn(cmd: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[bytes]:
    """Run the compiling child, its stderr kept (the last line explains a failure)."""
    return subprocess.run(
        cmd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        timeout=timeout,
        check=False,
    )


@contextmanager
def compile_here() -> Iterator[None]:
    """Within the block, :func:`prepare` compiles in this process (``attnflow warmup`` is the child)."""
    _here.append(True)
    try:
        yield
    finally:
        _here.pop()


def prepare(what: str, functions: Iterable[Any], only: str, timeout: float = 3600.0) -> bool:
    """Before a run uses the compiled path ``what``: when :func:`needs_compile`, compile ``functions``
    in a child process (``python -m attnflow warmup --only ONLY``) so that this process loads them from
    numba's cache, as every later run will (the same machine code, so the same bits). Says so first
    (:func:`announce`). Inside the child, or in :func:`compile_here`, it only announces. Should the child
    fail, the path compiles here as before, and the reporter says why. Once the path is warm, a call
    costs a set lookup. Returns whether a child ran."""
    if what in _warm:
        return False
    if _here or os.environ.get(HERE_ENV):
        announce(what, functions)  # the warm-up compiles here, saying so if asked
        return False
    if not needs_compile(functions):
        _warm.add(what)
        return False
    announce(what, functions)
    env = {**os.environ, HERE_ENV: "1"}
    why = ""
    try:
        done = _spawn([sys.executable, "-m", "attnflow", "warmup", "--only", only], env, timeout)
        if done.returncode != 0:
            tail = done.stderr.decode(errors="replace").strip().splitlines()
            why = f"exit status {done.returncode}" + (f": {tail[-1]}" if tail else "")
    except (OSError, subprocess.SubprocessError) as exc:
        why = f"{type(exc).__name__}: {exc}"
    if not why and needs_compile(functions):
        why = "the cache is still cold afterwards"
    if not why:
        _warm.add(what)
    elif _reporters:
        _reporters[-1](f"compiling {what} in a separate process failed ({why}); compiling here instead")
    return True
