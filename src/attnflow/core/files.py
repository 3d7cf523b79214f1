"""Array files from outside (token files, weight files), read with their sizes checked first.

``numpy.load`` trusts a file's header: a few bytes declaring a shape of 2 TiB make it try to
allocate that much, and any bytes it cannot parse are called "pickled data" with advice to load
them unsafely. :func:`read_npy` and :func:`read_npz` read the header themselves, refuse object
(pickled) arrays, compare the declared size with the bytes really there (an ``.npy``) or with the
declared decompressed sizes (an ``.npz``) and with ``max_bytes``, and only then load the data,
never with pickles. Every refusal is an :class:`~attnflow.core.errors.InputError` naming the file.
"""

from __future__ import annotations

import math
import os
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from attnflow.core.errors import InputError, UnsafeInputError

__all__ = ["MAX_ARRAY_BYTES", "read_npy", "read_npz"]

#: Largest array read from a token or weight file (bytes): far above any real one, far below a bomb.
MAX_ARRAY_BYTES = 8 * 2**30


def _header(fh: Any, name: str) -> tuple[tuple[int, ...], np.dtype, int]:
    """``(shape, dtype, nbytes)`` from the ``.npy`` header at the position of ``fh``."""
    try:
        version = np.lib.format.read_magic(fh)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(fh)
        elif version in ((2, 0), (3, 0)):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(fh)
        else:
            raise ValueError
    except (ValueError, OSError, EOFError, SyntaxError, TypeError):
        raise InputError(f"{name} is not a .npy array file (its first bytes are not a valid NumPy header).") from None
    if dtype.hasobject:
        raise UnsafeInputError(
            f"{name} holds Python objects (an object array), which attnflow never loads: save plain numbers instead."
        )
    if not all(isinstance(n, int) and n >= 0 for n in shape):
        raise InputError(f"{name} declares an impossible shape {shape}.")
    return tuple(shape), dtype, math.prod(shape) * dtype.itemsize


def read_npy(path: str | os.PathLike, *, max_bytes: int = MAX_ARRAY_BYTES) -> np.ndarray:
    """The array of an ``.npy`` file, after checking its header (see the module docstring)."""
    p = Path(path)
    name = repr(str(p))
    with open(p, "rb") as fh:
        shape, dtype, nbytes = _header(fh, name)
        offset = fh.tell()
    size = p.stat().st_size
    if nbytes > max_bytes:
        raise UnsafeInputError(
            f"{name} declares an array of shape {shape} ({nbytes:,} bytes), more than the {max_bytes:,} attnflow "
            "reads from such a file."
        )
    if size - offset < nbytes:
        raise InputError(
            f"{name} is truncated or its header lies: it declares {nbytes:,} bytes of data but holds {size - offset:,}."
        )
    return np.load(p, allow_pickle=False)


def read_npz(path: str | os.PathLike, *, max_bytes: int = MAX_ARRAY_BYTES) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz`` file by name, after checking every member's declared and
    decompressed size (a zip bomb is refused before anything is inflated)."""
    p = Path(path)
    name = repr(str(p))
    try:
        with zipfile.ZipFile(p) as zf:
            infos = zf.infolist()
            if len(infos) > 1000 or sum(i.file_size for i in infos) > max_bytes:
                raise UnsafeInputError(
                    f"{name} would decompress to more than {max_bytes:,} bytes (or holds {len(infos):,} members); "
                    "it is not read."
                )
            for info in infos:
                with zf.open(info) as fh:
                    _, _, nbytes = _header(fh, f"{name} (member {info.filename!r})")
                if nbytes > max_bytes or nbytes > info.file_size:
                    raise UnsafeInputError(
                        f"{name}: member {info.filename!r} declares {nbytes:,} bytes of data but holds "
                        f"{info.file_size:,}; it is not read."
                    )
            with np.load(p, allow_pickle=False) as z:
                return {k: z[k] for k in z.files}
    except (zipfile.BadZipFile, EOFError):
        raise InputError(f"{name} is not a valid .npz archive (damaged or another kind of file).") from None
