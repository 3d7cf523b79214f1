"""Hand the C heap's freed memory back to the system between the pieces of a long computation.

glibc's ``malloc`` serves a large block (a tensor or an array of more than 128 KiB, at first) from
its own mapping and unmaps it on free, but it raises that threshold to the size of each such block
freed (up to 32 MiB), so after the first few large frees every block of the study's sizes comes
from the heap. Freed heap memory stays in the process (resident) unless it lies at the top of the
heap; blocks of many sizes, freed in another order than they were taken, leave it scattered, and
the resident size grows with the number of pieces computed, not with what is alive. Measured on
``attnflow hf study`` (MiniLM, 2026-12-03): 1.5 GB of live tensors, resident 7.1 GB after 30
prompts and 10.6 GB after 228; with :func:`release_freed_memory` after each prompt, 2.2 GB after
each (docs/hf.md, "Cost").

:func:`release_freed_memory` calls glibc's ``malloc_trim(0)``, which returns every free page of the
heap to the system. It changes no number (the allocator only) and is a no-op without glibc
(macOS, musl): there the function returns False. Every page it returns is faulted in again when the
heap reuses it: on the MiniLM study, trimmed after every prompt, 0.3-0.5 s more system time a prompt
(0.15 s without), about a tenth of a prompt's CPU time.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys

__all__ = ["release_freed_memory"]


@functools.cache
def _malloc_trim():  # type: ignore[no-untyped-def]
    """glibc's ``malloc_trim``, or None where the C library has none."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def release_freed_memory() -> bool:
    """Return the C heap's free pages to the system (glibc ``malloc_trim(0)``); True when the call was
    made, False where the C library has no such call. Live memory is untouched."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
