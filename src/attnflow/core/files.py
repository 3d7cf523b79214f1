"""Array files from outside (token files, weight files), read with their sizes checked first.

``numpy.load`` trusts a file's header: a few bytes declaring a shape of 2 TiB make it try to
allocate that much, and any bytes it cannot parse are called "pickled data" with advice to load
them unsafely. :func:`read_npy` and :func:`read_npz` read the header themselves, refuse object
(pickled) arrays, compare the declared size with the bytes really there (an ``.npy``) or with the
declared decompressed sizes (an ``.npz``) and with ``max_bytes``, and only then load the data,
never with pickles. Every refusal is an :class:`~attnflow.core.errors.InputError` naming the file.

Every file from outside is opened by :func:`open_regular` ("open, then check"): opened without
following a link and without blocking (``O_NOFOLLOW | O_NONBLOCK``: a named pipe would otherwise
wait for a writer forever), checked with ``fstat`` on that same descriptor to be a regular file of
bounded size, and read from that descriptor, so nothing can be swapped between the check and the read.
"""

from __future__ import annotations

import errno
import io
import math
import os
import stat
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnflow.core.errors import InputError, UnsafeInputError

if TYPE_CHECKING:
    import numpy as np

__all__ = ["MAX_ARRAY_BYTES", "MAX_READ_BYTES", "open_regular", "read_npy", "read_npz", "read_regular"]

#: Largest array read from a token or weight file (bytes): far above any real one, far below a bomb.
MAX_ARRAY_BYTES = 8 * 2**30
#: Largest file :func:`open_regular` opens unless told otherwise (attnflow's own biggest files stay below).
MAX_READ_BYTES = 64 * 2**30


def _confined(path: Path, folder: str | os.PathLike) -> None:
    """Refuse ``path`` unless it lies inside ``folder`` with no symbolic link between them."""
    base = Path(folder)
    try:
        rel = Path(os.path.abspath(path)).relative_to(os.path.abspath(base))
    except ValueError:
        raise UnsafeInputError(f"{str(path)!r} lies outside its folder {str(base)!r}; it is not read.") from None
    q = base
    for part in rel.parts[:-1]:
        q = q / part
        if q.is_symlink():
            raise UnsafeInputError(f"{str(path)!r} is reached through the symbolic link {str(q)!r}; it is not read.")
    real_base = os.path.realpath(base)
    if os.path.commonpath([real_base, os.path.realpath(path.parent)]) != real_base:
        raise UnsafeInputError(f"{str(path)!r} resolves outside its folder {str(base)!r}; it is not read.")


def open_regular(
    path: str | os.PathLike, folder: str | os.PathLike | None = None, *, max_bytes: int = MAX_READ_BYTES
) -> io.BufferedReader:
    """``path`` opened for binary reading, after "open, then check" (see the module docstring).

    Refuses (:class:`~attnflow.core.errors.UnsafeInputError`) a symbolic link, a named pipe, device,
    socket or folder, a file over ``max_bytes``, and with ``folder``, a path outside ``folder`` or
    reached through a link. A missing file raises ``FileNotFoundError`` as ``open`` does.
    """
    p = Path(path)
    if folder is not None:
        _confined(p, folder)
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(p, flags)
    except OSError as e:
        if e.errno == errno.ELOOP or (e.errno == errno.EMLINK and p.is_symlink()):
            raise UnsafeInputError(
                f"{str(p)!r} is a symbolic link; attnflow reads no file through a link (it may point anywhere)."
            ) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            what = "a folder" if stat.S_ISDIR(st.st_mode) else "a named pipe, device or socket"
            raise UnsafeInputError(f"{str(p)!r} is {what}, not a regular file; attnflow reads only plain files.")
        if st.st_size > max_bytes:
            raise UnsafeInputError(
                f"{str(p)!r} is {st.st_size:,} bytes, more than the {max_bytes:,} attnflow reads from such a file."
            )
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(
    path: str | os.PathLike, folder: str | os.PathLike | None = None, *, max_bytes: int = MAX_READ_BYTES
) -> bytes:
    """The bytes of ``path``, opened by :func:`open_regular`; refused when it holds more than
    ``max_bytes`` (also when it grew after the check)."""
    with open_regular(path, folder, max_bytes=max_bytes) as fh:
        # Read what fstat announced, then on until the end (a file may grow), never past the bound.
        chunks = [fh.read(os.fstat(fh.fileno()).st_size + 1)]
        got = len(chunks[0])
        while chunks[-1] and got <= max_bytes:
            chunks.append(fh.read(min(2**20, max_bytes + 1 - got)))
            got += len(chunks[-1])
        data = b"".join(chunks)
    if len(data) > max_bytes:
        raise UnsafeInputError(
            f"{str(path)!r} holds more than the {max_bytes:,} bytes attnflow reads from such a file."
        )
    return data


def _header(fh: Any, name: str) -> tuple[tuple[int, ...], np.dtype, int]:
    """``(shape, dtype, nbytes)`` from the ``.npy`` header at the position of ``fh``."""
    import numpy as np  # numpy only when an array is read: the front door stays light

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
    import numpy as np  # numpy only when an array is read: the front door stays light

    p = Path(path)
    name = repr(str(p))
    with open_regular(p) as fh:
        shape, dtype, nbytes = _header(fh, name)
        offset = fh.tell()
        size = os.fstat(fh.fileno()).st_size
        if nbytes > max_bytes:
            raise UnsafeInputError(
                f"{name} declares an array of shape {shape} ({nbytes:,} bytes), more than the {max_bytes:,} attnflow "
                "reads from such a file."
            )
        if size - offset < nbytes:
            raise InputError(
                f"{name} is truncated or its header lies: it declares {nbytes:,} bytes of data but holds "
                f"{size - offset:,}."
            )
        fh.seek(0)
        return np.load(fh, allow_pickle=False)


def read_npz(path: str | os.PathLike, *, max_bytes: int = MAX_ARRAY_BYTES) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz`` file by name, after checking every member's declared and
    decompressed size (a zip bomb is refused before anything is inflated)."""
    import numpy as np  # numpy only when an array is read: the front door stays light

    p = Path(path)
    name = repr(str(p))
    try:
        with open_regular(p) as raw, zipfile.ZipFile(raw) as zf:
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
            raw.seek(0)
            with np.load(raw, allow_pickle=False) as z:
                return {k: z[k] for k in z.files}
    except (zipfile.BadZipFile, EOFError):
        raise InputError(f"{name} is not a valid .npz archive (damaged or another kind of file).") from None
