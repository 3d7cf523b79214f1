"""A Zarr store from a stranger is data: check what zarr will actually read before it reads it.

attnflow writes Zarr format 2 with consolidated metadata (``.zmetadata``), Blosc-compressed
numeric arrays, every chunk present (:func:`attnflow.io.store.write_dataset`). zarr 3 itself
prefers format 3: a ``zarr.json`` planted beside the format-2 files is what a plain
``xarray.open_zarr`` reads, so checks of the format-2 metadata alone can be bypassed. Hence,
before anything is decoded (:func:`check_store`):

- **One format**: a store holding any ``zarr.json`` is refused (both formats at once, or a
  format-3 store where attnflow writes format 2); the store is then opened with
  ``zarr_format=2, consolidated=True`` (:func:`open_store`), so zarr reads exactly the metadata
  checked here.
- **Short allow-lists**: every array's compressor is Blosc (:data:`BLOSC_CNAMES`) or none, it has
  no filters, a numeric or fixed-width dtype (:data:`DTYPE_KINDS`), C or F order.
- **Every chunk bounded before decoding**: a Blosc chunk's 16-byte header states its
  decompressed size (``nbytes``) and its compressed size (``cbytes``); the first must equal the
  chunk's declared size (chunk shape times item size) and the second the file's size, so a chunk
  that would inflate beyond its shape is refused unread (Blosc allocates and writes ``nbytes``,
  nothing more). An uncompressed chunk's file is exactly its declared size.
- **The whole load within the budget**: the declared chunk bytes of all arrays (the memory zarr
  allocates, whole edge chunks included) stay under the process's budget
  (:func:`attnflow.io.safety.memory_budget`).

Every refusal is one :class:`~attnflow.core.errors.UnsafeInputError` sentence (exit code 2).
"""

from __future__ import annotations

import json
import math
import os
import stat
import struct
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnflow.core.errors import UnsafeInputError
from attnflow.io.safety import inside, memory_budget

if TYPE_CHECKING:
    import xarray as xr

__all__ = ["BLOSC_CNAMES", "DTYPE_KINDS", "MAX_METADATA", "check_store", "open_store", "read_bounded"]

#: The Blosc inner codecs (what ``numcodecs.Blosc`` knows); attnflow writes ``lz4``.
BLOSC_CNAMES = frozenset({"lz4", "lz4hc", "blosclz", "zstd", "zlib"})
#: numpy dtype kinds a stored array may have: bool, integers, floats, complex, fixed-width text.
DTYPE_KINDS = frozenset("biufcSU")
#: Largest ``.zmetadata`` read (bytes); a run's is some tens of kB.
MAX_METADATA = 16 * 2**20
#: Most chunk files checked (the same bound as :data:`attnflow.io.store.MAX_CHUNKS`).
MAX_CHUNKS = 1_000_000
V3_NAME = "zarr.json"
_BLOSC_HEADER = 16


def read_bounded(path: str | os.PathLike, limit: int, *, head: bool = False) -> bytes:
    """The bytes of the regular file ``path`` (at most ``limit``; with ``head``, its first ``limit``
    bytes), opened without following a link or blocking on a pipe and checked with ``fstat`` on the
    same descriptor it is read from (no check-then-open race)."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if os.path.islink(path):
            raise UnsafeInputError(f"{str(path)!r} is a symbolic link; attnflow does not read through links.") from None
        raise UnsafeInputError(f"{str(path)!r} cannot be read ({e.strerror or e}).") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeInputError(f"{str(path)!r} is not a file (a folder, device, pipe or socket).")
        if st.st_size > limit and not head:
            raise UnsafeInputError(f"{str(path)!r} is {st.st_size:,} bytes, more than the {limit:,} it may have.")
        with os.fdopen(os.dup(fd), "rb") as fh:
            return fh.read(limit)
    finally:
        os.close(fd)


def _metadata(store: Path) -> dict[str, Any]:
    where = str(store / ".zmetadata")
    try:
        meta = json.loads(read_bounded(store / ".zmetadata", MAX_METADATA).decode("utf-8"))["metadata"]
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        meta = None
    if not isinstance(meta, dict):
        raise UnsafeInputError(f"{where!r} is missing or damaged (the dataset's metadata).")
    return meta


def _refuse_v3(store: Path) -> None:
    """No ``zarr.json`` anywhere in ``store`` (zarr 3 would read it instead of the checked files)."""
    for dirpath, dirnames, filenames in os.walk(store, followlinks=False):
        if V3_NAME in filenames or V3_NAME in dirnames:
            found = os.path.join(dirpath, V3_NAME)
            raise UnsafeInputError(
                f"{found!r} is Zarr format-3 metadata in a store attnflow wrote in format 2; zarr would read it "
                "instead of the checked metadata, so the dataset is not read."
            )


def _array(store: Path, name: str, spec: object) -> tuple[int, int, str, bool]:
    """``(n_chunks, chunk_bytes, separator, blosc)`` of one declared array, after its allow-lists."""
    where = f"{str(store / name)!r}"
    if not isinstance(spec, dict) or spec.get("zarr_format") != 2:
        raise UnsafeInputError(f"{where} declares no Zarr format-2 array.")
    shape, chunks = spec.get("shape"), spec.get("chunks")
    ok = isinstance(shape, list) and isinstance(chunks, list) and len(shape) == len(chunks) <= 32
    ok = ok and all(type(n) is int and 0 <= n < 2**62 for n in shape)  # type: ignore[union-attr]
    ok = ok and all(type(c) is int and 0 < c < 2**62 for c in chunks)  # type: ignore[union-attr]
    if not ok:
        raise UnsafeInputError(f"{where} declares an impossible shape or chunking.")
    import numpy as np

    dtype = spec.get("dtype")
    try:
        dt = np.dtype(dtype) if isinstance(dtype, str) and len(dtype) <= 32 else None
    except TypeError:
        dt = None
    if dt is None or dt.kind not in DTYPE_KINDS or dt.itemsize == 0:
        raise UnsafeInputError(f"{where} declares the dtype {str(dtype)[:40]!r}, which attnflow never writes.")
    if spec.get("filters") not in (None, []):
        raise UnsafeInputError(f"{where} declares filters; attnflow writes none, so the dataset is not read.")
    if spec.get("order", "C") not in ("C", "F"):
        raise UnsafeInputError(f"{where} declares an unknown memory order.")
    comp = spec.get("compressor")
    if comp is not None and not (
        isinstance(comp, dict)
        and comp.get("id") == "blosc"
        and isinstance(comp.get("cname"), str)
        and comp["cname"] in BLOSC_CNAMES
    ):
        shown = " ".join(str(comp.get(k)) for k in ("id", "cname") if k in comp) if isinstance(comp, dict) else comp
        raise UnsafeInputError(
            f"{where} is compressed with {str(shown)[:40]!r}, outside the codecs attnflow reads (Blosc or none)."
        )
    sep = spec.get("dimension_separator") or "."
    if sep not in (".", "/"):
        raise UnsafeInputError(f"{where} declares an unknown chunk separator.")
    n_chunks = math.prod(-(-n // c) for n, c in zip(shape, chunks))  # type: ignore[arg-type]
    return n_chunks, dt.itemsize * math.prod(chunks), sep, comp is not None  # type: ignore[arg-type]


def _check_chunk(path: Path, chunk_bytes: int, blosc: bool) -> None:
    """One chunk file decompresses to exactly its declared size (read: its 16-byte header only)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return  # zarr fills a missing chunk with the fill value (verify_run names it as damage)
    if not stat.S_ISREG(st.st_mode):
        raise UnsafeInputError(f"{str(path)!r} is not a file (a link, folder, device or pipe).")
    if not blosc:
        if st.st_size != chunk_bytes:
            raise UnsafeInputError(
                f"{str(path)!r} holds {st.st_size:,} bytes, not the {chunk_bytes:,} its uncompressed chunk declares."
            )
        return
    header = read_bounded(path, _BLOSC_HEADER, head=True)
    if len(header) < _BLOSC_HEADER:
        raise UnsafeInputError(f"{str(path)!r} is not a Blosc chunk (shorter than its header).")
    nbytes, _, cbytes = struct.unpack("<III", header[4:16])
    if nbytes != chunk_bytes or cbytes != st.st_size:
        raise UnsafeInputError(
            f"{str(path)!r} states it inflates to {nbytes:,} bytes from {cbytes:,}, but its chunk declares "
            f"{chunk_bytes:,} bytes from a file of {st.st_size:,}; it is not decoded."
        )


def check_store(store: str | os.PathLike, budget: float | None = None) -> None:
    """Refuse (:class:`~attnflow.core.errors.UnsafeInputError`) a Zarr store that zarr would read
    differently from what attnflow checks, or that could decode to more than ``budget`` bytes (by
    default :func:`~attnflow.io.safety.memory_budget`); see the module docstring."""
    root = Path(store)
    if root.is_symlink() or not root.is_dir():
        raise UnsafeInputError(f"{str(root)!r} is not a Zarr store folder.")
    _refuse_v3(root)
    budget = memory_budget() if budget is None else budget
    arrays = []
    total, n_total = 0, 0
    for key, spec in _metadata(root).items():
        if not isinstance(key, str) or not key.endswith(".zarray"):
            continue
        name = key[: -len(".zarray")].rstrip("/")
        if not name:
            raise UnsafeInputError(f"{str(root)!r} is an array, not a dataset (a group of arrays).")
        inside(root, name, repr(str(root / ".zmetadata")))
        n_chunks, chunk_bytes, sep, blosc = _array(root, name, spec)
        n_total += n_chunks
        if n_total > MAX_CHUNKS:
            raise UnsafeInputError(
                f"{str(root)!r} declares more than {MAX_CHUNKS:,} chunks; an attnflow dataset has few."
            )
        total += n_chunks * chunk_bytes
        shape, chunks = spec["shape"], spec["chunks"]
        arrays.append((name, [-(-n // c) for n, c in zip(shape, chunks)], chunk_bytes, sep, blosc))
    if total > budget:
        raise UnsafeInputError(
            f"{str(root)!r} declares chunks of {total:,} bytes in all, more than the {int(budget):,} this process can "
            "use; it is not read."
        )
    for name, counts, chunk_bytes, sep, blosc in arrays:
        if 0 in counts:
            continue
        for flat in range(math.prod(counts)):
            idx = []
            for c in reversed(counts):
                flat, i = divmod(flat, c)
                idx.append(i)
            key = sep.join(str(i) for i in reversed(idx)) if idx else "0"
            _check_chunk(root / name / key, chunk_bytes, blosc)


def open_store(store: str | os.PathLike, budget: float | None = None) -> xr.Dataset:
    """``xarray.open_zarr`` of an attnflow store, after :func:`check_store`, reading exactly the
    checked metadata (format 2, consolidated); lazy, as ``open_zarr`` is, without dask (``chunks=None``:
    every caller loads what it reads at once, and asking xarray for dask chunks loads dask's entry
    points, ``distributed`` included, about 1.5 s of CPU for nothing: issue 43)."""
    check_store(store, budget)
    import xarray as xr

    return xr.open_zarr(store, zarr_format=2, consolidated=True, chunks=None)
