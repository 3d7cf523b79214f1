"""Checks of the data a user hands us beyond the config schema: weight files (and sweep files).

Every failure is a :class:`~attnflow.config.ConfigError` whose one-paragraph message names the
file, the field and the offending value, so that ``attnflow`` reports it with exit code 2.
Token files are checked by :func:`attnflow.core.tokens.check_tokens`.

Weight file format (``heads.preset: file``, ``heads.path: FILE``): ``.npy`` holding ``A`` of shape
``(H, d, d)`` (or ``(d, d)`` for one head), or ``.npz`` with an array ``A`` of that shape and
optionally ``V`` of the same shape. The matrices are used as they are (``heads.beta`` does not
rescale them).
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np

from attnflow.config.errors import ConfigError
from attnflow.core.errors import UnsafeInputError
from attnflow.core.files import read_npy, read_npz


def _read(p: Path) -> dict[str, np.ndarray]:
    try:
        if p.suffix == ".npy":
            return {"A": read_npy(p)}  # headers and sizes checked before anything is allocated
        if p.suffix == ".npz":
            return read_npz(p)
    except UnsafeInputError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        raise ConfigError(f"heads.path: could not read weight file {str(p)!r} ({' '.join(str(e).split())}).") from None
    raise ConfigError(f"heads.path: weight file {str(p)!r} must end in .npy (A) or .npz (A and optional V).")


def _as_stack(arr: np.ndarray, name: str, src: str) -> np.ndarray:
    if not (np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)):
        raise ConfigError(f"heads.path: {name} in {src} must hold real numbers; it has dtype {arr.dtype}.")
    arr = np.asarray(arr, dtype=np.float64)
    if arr.ndim == 2:
        arr = arr[None]
    if arr.ndim != 3 or arr.shape[1] != arr.shape[2] or arr.shape[0] < 1 or arr.shape[1] < 1:
        raise ConfigError(f"heads.path: {name} in {src} must have shape (H, d, d); got {arr.shape}.")
    bad = ~np.isfinite(arr).all(axis=(1, 2))
    if bad.any():
        raise ConfigError(f"heads.path: {name} in {src} contains NaN or inf (head {int(np.flatnonzero(bad)[0])}).")
    return arr


def load_weight_file(
    path: str | Path, *, d: int | None = None, count: int | None = None, model: str | None = None
) -> tuple[np.ndarray, np.ndarray | None]:
    """``(A, V)`` from a weight file, checked against ``tokens.d``, ``heads.count`` and the model.

    ``model='gf'`` needs every ``A_h`` symmetric and ``V`` absent or equal to ``A`` (docs/model.md).
    """
    p = Path(path)
    src = repr(str(p))
    if not p.is_file():
        raise ConfigError(f"heads.path: weight file {src} does not exist.")
    data = _read(p)
    if "A" not in data:
        raise ConfigError(f"heads.path: weight file {src} has no array 'A' (it has {sorted(data) or 'nothing'}).")
    unknown = sorted(set(data) - {"A", "V"})
    if unknown:
        raise ConfigError(
            f"heads.path: weight file {src} has unknown arrays {unknown}; expected 'A' and optionally 'V'."
        )
    A = _as_stack(data["A"], "A", src)
    V = _as_stack(data["V"], "V", src) if "V" in data else None
    if V is not None and V.shape != A.shape:
        raise ConfigError(f"heads.path: V in {src} has shape {V.shape} but A has {A.shape}; they must match.")
    if d is not None and A.shape[1] != d:
        raise ConfigError(
            f"heads.path: the matrices in {src} act on d = {A.shape[1]} but tokens.d = {d}; make them match."
        )
    if count is not None and A.shape[0] != count:
        raise ConfigError(
            f"heads.path: {src} holds {A.shape[0]} heads but heads.count = {count}; set heads.count: {A.shape[0]}."
        )
    if model == "gf":
        scale = max(1.0, float(np.abs(A).max()))
        asym = np.abs(A - A.transpose(0, 2, 1)).max(axis=(1, 2))
        if (asym > 1e-10 * scale).any():
            h = int(np.argmax(asym))
            raise ConfigError(
                f"heads.path: model 'gf' needs symmetric A_h, but head {h} in {src} has max |A - A^T| = {asym[h]:.3g}; "
                "symmetrise the matrices ((A + A^T)/2) or use model 'mha'."
            )
        if V is not None and np.abs(V - A).max() > 1e-10 * scale:
            raise ConfigError(
                f"heads.path: model 'gf' needs V = A, but V in {src} differs from A by up to {np.abs(V - A).max():.3g}; "
                "drop V from the file or use model 'mha'."
            )
    return A, V


# Sweep files: the sweep feature (issue 7) is written in parallel; its loader should raise
# ConfigError naming the offending key and value in the same way, and be added to the fuzz test in
# tests/config/test_fuzz_loaders.py (see the note there).
