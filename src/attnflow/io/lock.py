"""One writer per output: an exclusive lock beside the folder (or file) a command writes.

``attnflow run``, ``run --resume``, ``sweep``, ``report`` and ``movie`` hold :func:`output_lock` on
their output for as long as they write it. The lock is ``fcntl.flock`` on a hidden file beside the
output (``.NAME.lock``), which records the holder's PID, command line, host and start time. A second
writer is refused at once with :class:`OutputBusy` naming the holder. The kernel drops a flock when
its process dies (``kill -9`` included), so a lock file left by a killed process is stale: the next
writer takes it over without a word. Locks are re-entrant within one process (a command that locks
its output and then calls a library function that locks it again).

On platforms without ``fcntl`` (Windows) the lock is a no-op.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import platform
import stat
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from attnflow.core.errors import InputError, UnsafeInputError
from attnflow.io.safety import open_nofollow, read_regular

try:  # POSIX only
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = ["OutputBusy", "busy", "lock_path", "output_lock", "holder"]


class OutputBusy(InputError):
    """Another process is writing the same output (exit code 2 in the CLI). ``holder``: its record."""

    def __init__(self, message: str, holder: dict | None = None):
        super().__init__(message)
        self.holder = holder or {}


_held: dict[str, list] = {}  # resolved lock path -> [fd, count]
_guard = threading.Lock()


def lock_path(path: str | os.PathLike) -> Path:
    """The lock file of an output ``path``: ``.NAME.lock`` in the same folder."""
    p = Path(os.path.abspath(path))
    return p.parent / f".{p.name}.lock"


def holder(path: str | os.PathLike) -> dict:
    """The record (``pid``, ``command``, ``host``, ``started``) in the lock file of ``path``, or ``{}``."""
    try:
        data = json.loads(read_regular(lock_path(path), max_bytes=65536).decode("utf-8") or "{}")
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def busy(path: str | os.PathLike) -> dict | None:
    """The holder record when another process holds the lock of ``path`` now, else ``None``."""
    lp = lock_path(path)
    if fcntl is None or str(lp) in _held:
        return None
    try:
        fd = open_nofollow(lp, os.O_RDONLY)
    except (OSError, ValueError):
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return holder(path) or {"pid": "?"}
    except OSError:
        return None
    finally:
        os.close(fd)
    return None


def refuse_if_busy(path: str | os.PathLike, what: str = "output") -> None:
    """Raise :class:`OutputBusy` when another process is writing ``path`` now."""
    info = busy(path)
    if info is not None:
        raise OutputBusy(_busy_message(path, info, what), info)


def _busy_message(path: str | os.PathLike, info: dict, what: str) -> str:
    return (
        f"{str(path)!r} is being written by {_describe(info)}; one {what} has one writer at a time. Wait for "
        "that command to finish (or stop it), or choose another output."
    )


def _describe(info: dict) -> str:
    if not info:
        return "another process (it has not yet written its PID)"
    cmd = str(info.get("command", "?"))
    if len(cmd) > 200:
        cmd = cmd[:200] + "..."
    return f"PID {info.get('pid', '?')} on {info.get('host', '?')} ('{cmd}', started {info.get('started', '?')})"


def _acquire(lp: Path) -> int:
    """Open and flock ``lp`` without waiting; the returned descriptor holds the lock. A link planted
    at ``lp`` is refused (``O_NOFOLLOW``): opening it would truncate the file it points to."""
    while True:
        fd = open_nofollow(lp, os.O_RDWR | os.O_CREAT | getattr(os, "O_NONBLOCK", 0), 0o644)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1:  # a pipe, or a hard link to another file
            os.close(fd)
            raise UnsafeInputError(
                f"{str(lp)!r} is not attnflow's lock file (a pipe, device or a second name of another file); "
                "remove it and try again."
            )
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise
        # The holder before us may have unlinked the file between our open and our flock: then we
        # hold a lock on a dead inode. Start again on the file that is there now.
        try:
            same = os.fstat(fd).st_ino == os.stat(lp).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)


@contextlib.contextmanager
def output_lock(path: str | os.PathLike, *, what: str = "output") -> Iterator[Path]:
    """Hold the exclusive lock of the output ``path`` (a folder or a file) for the block.

    Raises :class:`OutputBusy` at once when another process holds it. The folder that will hold
    ``path`` is created if needed (and removed again, if empty, when nothing was written there).
    """
    lp = lock_path(path)
    if fcntl is None:  # pragma: no cover
        yield lp
        return
    key = str(lp)
    with _guard:
        if key in _held:
            _held[key][1] += 1
            reentered = True
        else:
            reentered = False
    if reentered:
        try:
            yield lp
        finally:
            with _guard:
                _held[key][1] -= 1
        return
    created = _make_parents(lp.parent)
    try:
        fd = _acquire(lp)
    except BlockingIOError:
        info = {}
        for _ in range(20):  # the holder writes its record right after taking the lock
            info = holder(path)
            if info:
                break
            time.sleep(0.025)
        _remove_empty(created)
        raise OutputBusy(_busy_message(path, info, what), info) from None
    except (OSError, ValueError):
        _remove_empty(created)
        raise
    try:
        record = {
            "pid": os.getpid(),
            "command": _command(),
            "host": platform.node(),
            "started": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(record).encode(), 0)
    except OSError:
        pass
    with _guard:
        _held[key] = [fd, 1]
    try:
        yield lp
    finally:
        with _guard:
            del _held[key]
        with contextlib.suppress(OSError):
            os.unlink(lp)  # unlinked while still locked: a waiter notices the new inode (see _acquire)
        os.close(fd)
        if not Path(path).exists():
            _remove_empty(created)


def _command() -> str:
    """This process's command line, short: ``attnflow run ...`` for the CLI, else the interpreter's argv."""
    argv = list(sys.argv)
    if argv and argv[0] and argv[0] != "-c":
        name = Path(argv[0]).name
        return " ".join(["attnflow" if name in ("__main__.py", "attnflow") else name, *argv[1:]])
    return " ".join(" ".join(a.split()) for a in getattr(sys, "orig_argv", argv)) or "python"


def _make_parents(folder: Path) -> list[Path]:
    """``mkdir -p folder``; returns the folders it created (deepest last)."""
    missing = []
    p = folder
    while not p.exists():
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    folder.mkdir(parents=True, exist_ok=True)
    return list(reversed(missing))


def _remove_empty(created: list[Path]) -> None:
    for p in reversed(created):
        try:
            p.rmdir()
        except OSError:
            break
