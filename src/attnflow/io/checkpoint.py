"""Checkpoints: the whole state of a simulation at step ``k``, written atomically, read back exactly.

A :class:`Checkpoint` holds what :func:`attnflow.simulate` needs to continue as if it had never
stopped: the current tokens ``x_k`` (in the run's dtype, bit for bit), the weight sampler's state
(for an Ornstein-Uhlenbeck path: ``A(t)`` and the numpy generator state), and everything recorded
so far (save times, tokens, heads, diagnostics). A fingerprint of the run's inputs guards against
resuming with a different setup.

On disk it is one ``.npz`` file (no pickle): arrays by name plus a JSON ``meta`` string. It is
written to a hidden temporary file beside the target, flushed to disk and renamed over it, so a
kill at any moment leaves either the previous checkpoint or the new one, never half of one.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import time
import uuid
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from attnflow.core.errors import InputError, UnsafeInputError
from attnflow.io.safety import check_npz, open_nofollow, open_regular, refuse_link

FORMAT = "attnflow-checkpoint/1"
CHECKPOINT = "checkpoint.npz"


@dataclass
class Checkpoint:
    """State after ``step`` of ``n_steps``; ``saved_*`` are the records at the save times so far."""

    step: int
    n_steps: int
    x: np.ndarray
    sampler_state: dict[str, Any]
    saved_t: np.ndarray
    saved_x: np.ndarray
    saved_A: np.ndarray
    saved_V: np.ndarray
    any_V: bool
    diagnostics: dict[str, np.ndarray]
    wall_time_s: float
    fingerprint: str
    stopped: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def t(self) -> float:
        """The time of the last recorded state (what a user sees as "how far the run got")."""
        return float(self.saved_t[-1]) if len(self.saved_t) else float("nan")


def fingerprint(**parts: Any) -> str:
    """SHA-256 of the run's inputs (arrays by their bytes, everything else by its JSON form)."""
    h = hashlib.sha256()
    for key in sorted(parts):
        value = parts[key]
        h.update(key.encode())
        if isinstance(value, np.ndarray):
            h.update(str(value.dtype).encode() + str(value.shape).encode())
            h.update(np.ascontiguousarray(value).tobytes())
        else:
            h.update(json.dumps(value, sort_keys=True, default=str).encode())
    return h.hexdigest()


def _split_state(state: dict[str, Any]) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Sampler state -> (JSON part, arrays): numpy arrays cannot go through JSON exactly."""
    plain, arrays = {}, {}
    for k, v in state.items():
        if isinstance(v, np.ndarray):
            arrays[f"sampler.{k}"] = v
        else:
            plain[k] = v
    return plain, arrays


def _json_default(v: Any) -> Any:
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, np.floating):
        return float(v)
    raise TypeError(f"cannot store {type(v).__name__} in a checkpoint")


def save_checkpoint(path: str | os.PathLike, ckpt: Checkpoint) -> Path:
    """Write ``ckpt`` to ``path`` atomically (temporary file, fsync, rename)."""
    target = Path(path)
    refuse_link(target, "checkpoint")
    target.parent.mkdir(parents=True, exist_ok=True)
    plain, sampler_arrays = _split_state(ckpt.sampler_state)
    meta = {
        "format": FORMAT,
        "step": ckpt.step,
        "n_steps": ckpt.n_steps,
        "any_V": ckpt.any_V,
        "wall_time_s": ckpt.wall_time_s,
        "fingerprint": ckpt.fingerprint,
        "stopped": ckpt.stopped,
        "sampler": plain,
        "diagnostics": list(ckpt.diagnostics),
        "extra": ckpt.extra,
        "written": time.time(),
    }
    arrays: dict[str, Any] = {
        "x": ckpt.x,
        "saved_t": ckpt.saved_t,
        "saved_x": ckpt.saved_x,
        "saved_A": ckpt.saved_A,
        "saved_V": ckpt.saved_V,
        **{f"diag.{k}": v for k, v in ckpt.diagnostics.items()},
        **sampler_arrays,
        "meta": np.array(json.dumps(meta, default=_json_default)),
    }
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    tmp = target.parent / f".{target.name}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        with os.fdopen(open_nofollow(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL), "wb") as fh:
            fh.write(buf.getbuffer())
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return target


def _read_npz(p: Path, fh) -> dict:
    try:
        with np.load(fh, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        why = " ".join(str(e).split())[:200]
        raise InputError(f"checkpoint {str(p)!r} is damaged or not an attnflow checkpoint ({why})") from None


def load_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """Read a checkpoint written by :func:`save_checkpoint`; a damaged file is a ``ValueError``."""
    p = Path(path)
    if p.is_dir() and p.name != CHECKPOINT:  # a run folder: its checkpoint
        p = p / CHECKPOINT
    if p.exists() and not p.is_file():
        raise InputError(f"checkpoint {str(p)!r} is not a file (a folder or a device), so it is not a checkpoint")
    if not p.is_file():
        raise FileNotFoundError(f"no checkpoint at {str(p)!r}")
    refuse_link(p, "checkpoint")
    with open_regular(p) as fh:  # every check and the read on one descriptor: nothing swapped in between
        if not zipfile.is_zipfile(fh):
            raise InputError(
                f"checkpoint {str(p)!r} is damaged or not an attnflow checkpoint (it is not a .npz archive; truncated?)"
            )
        check_npz(p, fh=fh)  # a zip bomb is refused before anything is inflated
        fh.seek(0)
        check_npy_headers(p, fh=fh)  # and a member whose .npy header lies about its size before allocation
        fh.seek(0)
        data = _read_npz(p, fh)
    try:
        meta = json.loads(str(data["meta"]))
        if meta.get("format") != FORMAT:
            raise InputError(f"unknown format {meta.get('format')!r}")
        # Adaptive runs do not know their step count in advance and record n_steps = 0.
        n_steps = int(meta["n_steps"])
        if int(meta["step"]) < 0 or (n_steps > 0 and int(meta["step"]) > n_steps):
            raise InputError(f"its step {meta['step']} lies outside the run's 0..{meta['n_steps']} steps")
        if len(data["saved_t"]) < 1:
            raise InputError("it records no saved state")
        state = dict(meta["sampler"])
        state.update({k.removeprefix("sampler."): v for k, v in data.items() if k.startswith("sampler.")})
        return Checkpoint(
            step=int(meta["step"]),
            n_steps=int(meta["n_steps"]),
            x=data["x"],
            sampler_state=state,
            saved_t=data["saved_t"],
            saved_x=data["saved_x"],
            saved_A=data["saved_A"],
            saved_V=data["saved_V"],
            any_V=bool(meta["any_V"]),
            diagnostics={k: data[f"diag.{k}"] for k in meta["diagnostics"]},
            wall_time_s=float(meta["wall_time_s"]),
            fingerprint=str(meta["fingerprint"]),
            stopped=meta.get("stopped"),
            extra=dict(meta.get("extra") or {}),
        )
    except (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile) as e:
        why = " ".join(str(e).split())[:200]
        raise InputError(f"checkpoint {str(p)!r} is damaged or not an attnflow checkpoint ({why})") from None


def check_npy_headers(path: str | os.PathLike, fh: Any = None) -> None:
    """Refuse (:class:`~attnflow.core.errors.UnsafeInputError`) an ``.npz`` whose members' ``.npy``
    headers declare arrays other than their size in the archive: ``numpy.load`` allocates the
    declared shape before reading, so a few-byte member claiming ``(10**12,)`` would allocate
    terabytes. Reads only each member's header; the archive's sizes were bounded by
    :func:`~attnflow.io.safety.check_npz`. ``fh``: the archive's open descriptor, read instead of ``path``."""
    fmt = np.lib.format
    with zipfile.ZipFile(path if fh is None else fh) as zf:
        for info in zf.infolist():
            where = f"checkpoint {str(path)!r} member {info.filename[:60]!r}"
            try:
                with zf.open(info) as fh:
                    version = fmt.read_magic(fh)
                    if version == (1, 0):
                        shape, _, dtype = fmt.read_array_header_1_0(fh)
                    else:
                        shape, _, dtype = fmt.read_array_header_2_0(fh)
                    header = fh.tell()
            except (ValueError, OSError, EOFError, zipfile.BadZipFile) as e:
                raise UnsafeInputError(f"{where} is not a .npy array ({' '.join(str(e).split())[:80]}).") from None
            if dtype.hasobject:
                raise UnsafeInputError(f"{where} holds Python objects; a checkpoint holds only numbers and text.")
            declared = header + math.prod(shape) * dtype.itemsize
            if declared != info.file_size:
                raise UnsafeInputError(
                    f"{where} declares an array of shape {tuple(shape)!r} ({declared:,} bytes with its header) in "
                    f"{info.file_size:,} bytes; the header lies about its size, so it is not read."
                )


class Checkpointer:
    """When and where :func:`attnflow.simulate` writes checkpoints: every ``every_steps`` steps
    and/or every ``every_seconds`` seconds of wall time (whichever comes first), and at step 0.

    ``on_begin`` runs once, just before the first write (the CLI writes ``config.yaml`` there), so
    that nothing reaches the disk before the simulation has validated its inputs.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        every_steps: int | None = None,
        every_seconds: float | None = None,
        on_begin=None,
    ):
        if every_steps is not None and int(every_steps) < 1:
            raise InputError(f"checkpoint every_steps must be a positive integer; got {every_steps}")
        if every_seconds is not None and not every_seconds > 0:
            raise InputError(f"checkpoint every_seconds must be positive; got {every_seconds}")
        self.path = Path(path)
        self.every_steps = None if every_steps is None else int(every_steps)
        self.every_seconds = every_seconds
        self.on_begin = on_begin
        self._last = time.monotonic()
        self._begun = False
        self.writes = 0

    def due(self, step: int) -> bool:
        if self.every_steps is not None and step % self.every_steps == 0:
            return True
        return self.every_seconds is not None and time.monotonic() - self._last >= self.every_seconds

    def write(self, ckpt: Checkpoint) -> Path:
        if not self._begun:
            self._begun = True
            if self.on_begin is not None:
                self.on_begin()
        out = save_checkpoint(self.path, ckpt)
        self._last = time.monotonic()
        self.writes += 1
        return out
