"""Folder checks of a run, before anything heavy loads: may ``out`` take a new run
(:func:`check_out`), and why a folder is not a finished run (:func:`folder_status`).

This module imports neither torch nor xarray (``attnflow run`` refuses a bad ``--out`` and ``attnflow
show`` explains an unfinished folder without them); :mod:`attnflow.runs.runner` re-exports both.
"""

from __future__ import annotations

import datetime as _dt
import errno
import json
import os
from pathlib import Path

from attnflow.core.errors import Hint, UnsafeInputError, hinted
from attnflow.io.checkpoint import CHECKPOINT, load_checkpoint
from attnflow.io.lock import refuse_if_busy
from attnflow.io.safety import scan_folder
from attnflow.io.store import CONFIG, PROVENANCE, folder_kind, read_provenance, refusal, what_it_is

__all__ = ["check_out", "folder_status"]


def check_out(out: str | Path, force: bool = False) -> None:
    """Refuse an ``out`` folder that cannot take a new run, naming what it really is.

    A missing path is fine (its parents must be folders we can write in); with ``force`` a finished
    or unfinished attnflow run folder, or an empty folder, is fine too. Anything else (a file, a
    device, a folder of other files, a sweep) is refused even with ``force``.
    """
    out = Path(out)
    refuse_if_busy(out, "run folder")
    kind = folder_kind(out)
    name = repr(str(out))
    if kind == "missing":
        _check_parents(out)
        return
    if force and kind in ("run", "unfinished", "empty"):
        # Replacing removes the folder: never one holding a link, pipe or device attnflow did not make.
        scan_folder(out)
        return
    if kind == "run":
        raise hinted(
            FileExistsError(
                f"{name} already holds a finished run; choose another out folder, or pass force=True to replace it "
                "(the old run stays in place until the new one has finished)."
            ),
            Hint("force", True),
        )
    if kind == "unfinished":
        raise hinted(
            FileExistsError(
                f"{name} holds an unfinished run: continue it with resume_folder({str(out)!r}), or pass force=True "
                "to replace it."
            ),
            Hint("resume", str(out)),
        )
    if kind == "empty":
        raise hinted(
            FileExistsError(
                f"{name} is an existing empty folder; choose a new out folder, or pass force=True to use it."
            ),
            Hint("force", True),
        )
    raise hinted(FileExistsError(refusal(out)), Hint("out"))


def _check_parents(out: Path) -> None:
    p = out.parent
    while not p.exists() and p.parent != p:
        if p.is_symlink():
            break
        p = p.parent
    if p.exists() and not p.is_dir():
        raise FileExistsError(f"cannot create {str(out)!r}: {str(p)!r} is a file, not a folder.")
    if p.is_dir() and not os.access(p, os.W_OK | os.X_OK):
        # With its errno, the CLI reads it as the user's to fix (a message-only OSError is a bug there).
        raise PermissionError(errno.EACCES, f"no permission to write in {str(p)!r}", str(out))


def folder_status(run_dir: str | Path) -> str:
    """One paragraph saying why ``run_dir`` is not a finished run and what to do about it."""
    p = Path(run_dir)
    name = repr(str(p))
    kind = folder_kind(p)
    if kind == "missing":
        return f"there is no run folder at {name}."
    if kind not in ("run", "unfinished"):
        return f"{name} is not a complete run folder: it is {what_it_is(p)}."
    prov = read_provenance(p)
    if prov is None and (p / PROVENANCE).exists():
        return f"{name} is not a complete run folder: its provenance.json is damaged (not a JSON object)."
    stopped = (prov or {}).get("stopped")
    if prov is not None and not stopped and "complete" in prov and prov["complete"] is not True:
        shown = json.dumps(prov["complete"])[:40]
        return f'{name} is not a complete run folder: its provenance.json says "complete": {shown}, not true.'
    ck = None
    if (p / CHECKPOINT).is_file():
        try:
            ck = load_checkpoint(p / CHECKPOINT)
        except UnsafeInputError as e:  # a zip bomb or a link: say so, not "no usable checkpoint"
            return f"{name} is not a usable run folder: {e}"
        except (ValueError, OSError):
            ck = None
    reason = stopped or (ck.stopped if ck is not None else None)
    if reason:
        return (
            f"{name} is an INCOMPLETE run: it was stopped by the numerical guard ({reason}). The last good "
            f"state (t = {ck.t if ck else float('nan'):.6g}) is in checkpoint.npz and dataset.zarr; start a new run with a "
            "smaller integration.dt or method 'jko'."
        )
    if ck is not None:
        when = _dt.datetime.fromtimestamp((p / CHECKPOINT).stat().st_mtime, _dt.UTC).isoformat(timespec="seconds")
        return (
            f"{name} is an INCOMPLETE run: it did not finish. Its last checkpoint is step {ck.step}{f' of {ck.n_steps}' if ck.n_steps else ' (adaptive)'} "
            f"(last saved time t = {ck.t:.6g}, written {when}). Continue it with resume_folder({str(p)!r})."
        )
    if (p / CONFIG).is_file():
        return (
            f"{name} is an INCOMPLETE run: it did not finish and has no usable checkpoint. "
            f"resume_folder({str(p)!r}) restarts it from its config.yaml."
        )
    prov = read_provenance(p)
    if prov is not None and "complete" in prov and prov["complete"] is not True:
        return f'{name} is not a complete run folder: its provenance.json says "complete": {json.dumps(prov["complete"])[:40]}, not true.'
    return f"{name} is not a complete run folder (no finished provenance.json): the run did not finish."
