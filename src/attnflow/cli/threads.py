"""``--threads`` for every command that computes: one option, applied through
:class:`attnflow.core.threads.ThreadPolicy`.

:func:`threaded` adds the option to a command and runs its body inside
``ThreadPolicy(threads).applied(pairs)``, ``pairs`` (token pairs x heads of one field evaluation)
estimated from the command's arguments before the work starts; without ``--threads`` the policy
chooses one thread for small work and the cores for large work.
"""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

import typer

from attnflow.core.files import read_regular

__all__ = ["threaded", "run_pairs", "THREADS_HELP"]

THREADS_HELP = (
    "CPU threads (default: chosen from the problem size, one thread for small problems, "
    "the cores for large ones; see docs/performance.md)."
)

#: The largest zarr array header read to size the work (a real one is under 1 KB).
_MAX_HEADER_BYTES = 64 * 1024


def _shape(array_dir: Path) -> list[int] | None:
    """The ``shape`` of a zarr (v2 or v3) array from its header, or ``None`` when unreadable."""
    for name in (".zarray", "zarr.json"):
        f = array_dir / name
        try:
            if f.is_symlink() or not f.is_file():
                continue
            shape = json.loads(read_regular(f, max_bytes=_MAX_HEADER_BYTES)).get("shape")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(shape, list) and all(isinstance(s, int) and s >= 0 for s in shape):
            return shape
    return None


def run_pairs(run_dir: Path | str | None) -> float:
    """``N^2 H`` of a run folder (from its arrays' headers), 0 when it cannot be read: the work of
    one field evaluation, what :meth:`ThreadPolicy.for_work` sizes threads by. The folder itself
    is validated later by the command; this only reads two small JSON headers."""
    if run_dir is None:
        return 0.0
    ds = Path(run_dir) / "dataset.zarr"
    x, a = _shape(ds / "x"), _shape(ds / "A")
    if not x or len(x) < 2:
        return 0.0
    heads = a[1] if a and len(a) >= 2 else 1
    return float(x[1]) ** 2 * heads


def threaded(pairs: Callable[[dict[str, Any]], float] = lambda kw: 0.0) -> Callable[[Any], Any]:
    """Decorator: add ``--threads`` to a typer command and run it under the thread policy.

    ``pairs(kwargs)`` sizes the work from the command's arguments (e.g. ``run_pairs`` of its run
    folder). Put it below ``@guarded`` so that a bad value is reported as a user error.
    """

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        sig = inspect.signature(fn)
        option = inspect.Parameter(
            "threads",
            inspect.Parameter.KEYWORD_ONLY,
            default=typer.Option(None, "--threads", min=1, max=1024, help=THREADS_HELP),
            annotation=Optional[int],
        )

        @functools.wraps(fn)
        def wrapper(*args: Any, threads: int | None = None, **kwargs: Any) -> Any:
            # imported here: `attnflow --help` must not load torch (attnflow.core imports it)
            from attnflow.core.threads import ThreadPolicy

            bound = sig.bind_partial(*args, **kwargs)
            policy = ThreadPolicy(threads)
            with policy.applied(pairs(dict(bound.arguments)) if threads is None else 0.0):
                return fn(*args, **kwargs)

        wrapper.__signature__ = sig.replace(parameters=[*sig.parameters.values(), option])  # type: ignore[attr-defined]
        wrapper.__annotations__ = {**getattr(fn, "__annotations__", {}), "threads": Optional[int]}
        return wrapper

    return wrap
