"""A folder from a stranger is data: confinement, bounds and validated strings for everything read
from (or written into) a run folder.

Every check raises :class:`~attnflow.core.errors.UnsafeInputError` (an ``InputError``: one
sentence, exit code 2 in the CLI):

- **Confinement** (:func:`inside`, :func:`scan_folder`): a path named by a folder (a manifest
  entry) is relative, has no ``..`` and stays inside the folder once resolved; no symlink anywhere
  under a folder is followed, for reading or for writing (:func:`refuse_link`,
  :func:`open_nofollow`, :func:`atomic_write`); every file is read by :func:`open_regular` ("open,
  then check": ``O_NOFOLLOW | O_NONBLOCK``, then ``fstat`` on the same descriptor), so neither a
  link nor a named pipe swapped in after a check is followed or waited on.
- **Bounds** (:func:`scan_folder`, :func:`check_npz`, :func:`memory_budget`): entry counts, file
  sizes, sparse files, declared array shapes and decompressed sizes are checked before any work.
- **Strings** (:func:`check_name`, :func:`check_text`): every string a folder holds is checked
  against its schema (type, length, allowed characters) before it is used or shown.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import uuid
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from attnflow.core.errors import UnsafeInputError
from attnflow.core.files import open_regular, read_regular

__all__ = [
    "MAX_ENTRIES",
    "MAX_FILE_BYTES",
    "MAX_NAME",
    "MAX_TEXT",
    "atomic_write",
    "check_name",
    "check_npz",
    "check_text",
    "inside",
    "memory_budget",
    "open_nofollow",
    "open_regular",
    "read_regular",
    "refuse_link",
    "scan_folder",
]

#: Most files and folders under one run folder (a run with a million saved times has far fewer).
MAX_ENTRIES = 200_000
#: Largest single file read from a folder (bytes); attnflow's own files of a big run stay below it.
MAX_FILE_BYTES = 64 * 2**30
#: Longest name (model, method, reader, ...) and longest free text (a message) a folder may hold.
MAX_NAME = 64
MAX_TEXT = 4000
#: A name: letters, digits and ``_ . + - : /`` (a model, a method, a Hugging Face id).
NAME_PATTERN = re.compile(r"[A-Za-z0-9_.+\-:/]+")
#: Control characters other than tab and newline (ESC sequences, bells, backspaces, ...).
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _show(value: object, limit: int = 48) -> str:
    """``value`` for a message: a ``repr`` (control characters escaped), shortened."""
    text = repr(value) if isinstance(value, str) else f"a {type(value).__name__}"
    return text if len(text) <= limit else text[: limit - 4] + "...'"


# --- Strings -------------------------------------------------------------------------------------------


def check_name(value: object, field: str, where: str, *, max_len: int = MAX_NAME) -> str:
    """``value`` when it is a name (:data:`NAME_PATTERN`, at most ``max_len`` characters), else
    :class:`UnsafeInputError` naming ``field`` of ``where``."""
    if not isinstance(value, str) or not 0 < len(value) <= max_len or not NAME_PATTERN.fullmatch(value):
        raise UnsafeInputError(
            f"{where}: {field} is {_show(value)}, not a name (at most {max_len} letters, digits or _.+-:/); "
            "the folder was altered."
        )
    return value


def check_text(value: object, field: str, where: str, *, max_len: int = MAX_TEXT) -> str:
    """``value`` when it is text of at most ``max_len`` characters without control characters
    (tab and newline allowed), else :class:`UnsafeInputError`."""
    if not isinstance(value, str) or len(value) > max_len or _CONTROL.search(value):
        what = "too long" if isinstance(value, str) and len(value) > max_len else "not plain text"
        raise UnsafeInputError(f"{where}: {field} is {what} ({_show(value)}); the folder was altered.")
    return value


# --- Confinement ---------------------------------------------------------------------------------------


def refuse_link(path: str | os.PathLike, what: str = "path") -> None:
    """Raise :class:`UnsafeInputError` when ``path`` itself is a symbolic link (it is never followed)."""
    if os.path.islink(path):
        raise UnsafeInputError(
            f"{str(path)!r} is a symbolic link; attnflow neither reads nor writes through links in its "
            f"folders (the {what} must be a real file or folder)."
        )


def inside(folder: str | os.PathLike, rel: object, where: str = "the manifest") -> Path:
    """``folder / rel`` for a relative path ``rel`` named by data: no absolute path, no ``..``, no
    link on the way, and the result resolves inside ``folder``."""
    base = Path(folder)
    if not isinstance(rel, str) or not rel or len(rel) > 1024 or "\x00" in rel or "\\" in rel:
        raise UnsafeInputError(f"{where} names the path {_show(rel)}, which is not a relative file name.")
    parts = rel.split("/")
    if rel.startswith("/") or os.path.isabs(rel) or any(p in ("", ".", "..") for p in parts):
        raise UnsafeInputError(
            f"{where} names {_show(rel)}, a path outside its folder (absolute or with '..'); attnflow reads only "
            "inside the folder."
        )
    q = base
    for part in parts:
        q = q / part
        if q.is_symlink():
            raise UnsafeInputError(f"{where} names {_show(rel)}, which goes through the symbolic link {str(q)!r}.")
    real_base = os.path.realpath(base)
    real = os.path.realpath(q)
    if os.path.commonpath([real_base, real]) != real_base:
        raise UnsafeInputError(f"{where} names {_show(rel)}, which resolves outside {str(base)!r}.")
    return q


def scan_folder(folder: str | os.PathLike, *, max_entries: int = MAX_ENTRIES) -> int:
    """Walk ``folder`` without following links; return the bytes its files hold.

    Refuses (:class:`UnsafeInputError`) a symbolic link anywhere, a device or pipe, more than
    ``max_entries`` entries, a file over :data:`MAX_FILE_BYTES` and a sparse file (allocated far
    less than its size: attnflow never writes one, a zip-bomb-like trick to make hashing slow).
    """
    root = Path(folder)
    refuse_link(root, "folder")
    count, total = 0, 0
    stack = [root]
    while stack:
        d = stack.pop()
        try:
            entries = list(os.scandir(d))
        except OSError as e:
            raise UnsafeInputError(f"{str(d)!r} cannot be listed ({e.strerror or e}).") from None
        for entry in entries:
            count += 1
            if count > max_entries:
                raise UnsafeInputError(
                    f"{str(root)!r} holds more than {max_entries:,} files and folders; an attnflow folder holds far "
                    "fewer."
                )
            st = entry.stat(follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                raise UnsafeInputError(
                    f"{entry.path!r} is a symbolic link; attnflow neither reads nor writes through links in a folder "
                    "(it may point anywhere)."
                )
            if stat.S_ISDIR(st.st_mode):
                stack.append(Path(entry.path))
            elif stat.S_ISREG(st.st_mode):
                _check_file_size(entry.path, st)
                total += st.st_size
            else:
                raise UnsafeInputError(f"{entry.path!r} is not a file or folder (a device, pipe or socket).")
    return total


def _check_file_size(path: str, st: os.stat_result) -> None:
    if st.st_size > MAX_FILE_BYTES:
        raise UnsafeInputError(
            f"{path!r} is {st.st_size:,} bytes, more than the {MAX_FILE_BYTES:,} a file of an attnflow folder may have."
        )
    blocks = getattr(st, "st_blocks", None)
    # Far below what even a compressing file system stores for attnflow's (already compressed) data.
    if blocks is not None and st.st_size > 2**28 and blocks * 512 < st.st_size // 64:
        raise UnsafeInputError(
            f"{path!r} is a sparse file ({st.st_size:,} bytes, {blocks * 512:,} on disk); attnflow never writes "
            "one, so it is not read."
        )


def open_nofollow(path: str | os.PathLike, flags: int, mode: int = 0o644) -> int:
    """``os.open`` that refuses to follow a link at ``path`` (``O_NOFOLLOW``; on a platform without
    it, an ``lstat`` first)."""
    nofollow = getattr(os, "O_NOFOLLOW", 0)
    if not nofollow:  # pragma: no cover - Windows
        refuse_link(path)
    try:
        return os.open(path, flags | nofollow, mode)
    except OSError as e:
        if os.path.islink(path):
            raise UnsafeInputError(
                f"{str(path)!r} is a symbolic link; attnflow does not write through links (it would change the "
                "file it points to). Remove the link."
            ) from None
        raise e


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "w", encoding: str | None = "utf-8") -> Iterator[Any]:
    """Write ``path`` through a new temporary file beside it (created exclusively, never through a
    link), flushed and renamed over ``path``. A link at ``path`` or at its folder is refused: the
    rename would replace the link, but the user asked to write the file it names."""
    target = Path(path)
    refuse_link(target, "file to write")
    refuse_link(target.parent, "folder to write in")
    tmp = target.parent / f".{target.name}.tmp-{uuid.uuid4().hex[:8]}"
    fd = open_nofollow(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    try:
        with os.fdopen(fd, mode, encoding=None if "b" in mode else encoding) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


# --- Bounds --------------------------------------------------------------------------------------------


def memory_budget() -> float:
    """Bytes this process may reasonably allocate: half of the smaller of the machine's available
    memory and what the address-space limit (``ulimit -v``) leaves above what is already mapped."""
    limits: list[float] = []
    try:
        import psutil  # optional

        limits.append(float(psutil.virtual_memory().available))
    except Exception:
        with contextlib.suppress(ValueError, OSError, AttributeError):
            limits.append(float(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")))
    with contextlib.suppress(ImportError, ValueError, OSError):
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        if soft not in (resource.RLIM_INFINITY, -1) and soft > 0:
            mapped = 0.0
            with contextlib.suppress(OSError, ValueError, IndexError):
                with open("/proc/self/statm") as fh:
                    mapped = float(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
            limits.append(max(float(soft) - mapped, 0.0))
    return 0.5 * min(limits) if limits else float(8 * 2**30)


def check_npz(path: str | os.PathLike, *, budget: float | None = None, fh: BinaryIO | None = None) -> None:
    """Refuse an ``.npz`` whose members would decompress to more than ``budget`` bytes (a zip bomb)
    or that is not a plain archive of ``.npy`` members, before anything is decompressed (read from
    ``fh``, the file already opened by :func:`open_regular`, when given)."""
    budget = memory_budget() if budget is None else budget
    try:
        with zipfile.ZipFile(fh if fh is not None else path) as zf:
            infos = zf.infolist()
    except (OSError, zipfile.BadZipFile, ValueError):
        return  # the reader names the damage
    if len(infos) > 10_000:
        raise UnsafeInputError(
            f"{str(path)!r} holds {len(infos):,} archive members; an attnflow file holds a few dozen."
        )
    total = sum(i.file_size for i in infos)
    if total > budget:
        raise UnsafeInputError(
            f"{str(path)!r} would decompress to {total:,} bytes, more than the {int(budget):,} this process can use "
            "(a compressed file that inflates far beyond its size); it is not read."
        )
