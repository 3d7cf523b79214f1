"""The saved run format: one folder per run, written atomically.

::

    RUN/
      dataset.zarr/      xarray Dataset (xarray.open_zarr(RUN / "dataset.zarr"))
      config.yaml        the exact config that produced the run (when there was one)
      manifest.json      SHA-256 of every other file (written just before provenance.json)
      provenance.json    attnflow/torch versions, seed, git commit, wall time, "complete": true
      figures/*.png      sphere snapshots (PCA for d > 3) and diagnostic curves

The folder is assembled under a hidden temporary name beside ``RUN`` and renamed into place
only when every file is written, so a crash never leaves a folder that looks complete. Replacing
an existing folder (``--force``) renames the old one aside only once the new one is complete.

Reading checks what writing recorded (:func:`verify_run`): ``complete`` is the boolean ``true``,
every file of the manifest is there with its digest, and every chunk the Zarr metadata implies
exists. A damaged folder is a :class:`DamagedRun` naming the file.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import os
import platform
import shutil
import stat
import subprocess
import uuid
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import xarray as xr
import yaml

from attnflow._version import __version__
from attnflow.io.metadata import INTEGER_DIAGNOSTICS, RUN_VARIABLES, describe, jsonable_attr

if TYPE_CHECKING:  # the record type only; a trajectory module imports this one
    from attnflow.io.trajectory import Trajectory

#: The global ``Conventions`` attribute of every dataset attnflow writes (CF metadata conventions).
CF_CONVENTIONS = "CF-1.10"
DATASET = "dataset.zarr"
CONFIG = "config.yaml"
PROVENANCE = "provenance.json"
FIGURES = "figures"
MANIFEST = "manifest.json"
MANIFEST_FORMAT = "attnflow-manifest/1"
CHECKPOINT_NAME = "checkpoint.npz"  # io.checkpoint.CHECKPOINT (not imported: that module is heavier)


class DamagedRun(ValueError):
    """A run folder whose files do not match what was written (missing, altered or unreadable)."""


class DataWarning(UserWarning):
    """A run folder that reads, with a caveat (no manifest to verify, another attnflow version)."""


def write_dataset(ds: xr.Dataset, path: str | os.PathLike) -> None:
    """Write ``ds`` as Zarr format 2 with consolidated metadata: a plain ``xarray.open_zarr(path)``
    opens it without the warnings that zarr 3 gives for consolidated format-3 stores. Every chunk is
    written, even one that holds only the fill value, so a missing chunk always means damage. Every
    dataset carries the global ``Conventions`` attribute (:data:`CF_CONVENTIONS`)."""
    if "Conventions" not in ds.attrs:
        ds = ds.assign_attrs(Conventions=CF_CONVENTIONS)
    ds.to_zarr(path, mode="w", zarr_format=2, consolidated=True, write_empty_chunks=True)


def run_parameters(traj: Trajectory) -> dict[str, Any]:
    """The run's parameters as flat dataset attributes: sizes, scheme, and from its config (when it
    came from one) the weight process, ``beta``, ``cluster_eps``, ... (``None`` values left out)."""
    cfg = traj.config or {}
    section = lambda name: cfg.get(name) or {}
    params: dict[str, Any] = {
        "model": traj.model,
        "method": traj.method,
        "dt": float(traj.dt),
        "N": traj.N,
        "d": traj.d,
        "H": traj.H,
        "t_start": float(traj.t[0]),
        "t_end": float(traj.t[-1]),
        "seed": -1 if traj.seed is None else int(traj.seed),
        "name": cfg.get("name"),
        "dtype": cfg.get("dtype") or traj.provenance.get("dtype"),
        "cluster_eps": section("diagnostics").get("cluster_eps", traj.provenance.get("cluster_eps")),
        "weights_process": section("weights").get("process"),
        "beta": section("heads").get("beta"),
        "heads_preset": section("heads").get("preset"),
        "tokens_init": section("tokens").get("init"),
        "save_every": section("integration").get("save_every"),
        "kernel_backend": section("kernel").get("backend"),
    }
    return {k: jsonable_attr(v) for k, v in params.items() if v is not None}


def trajectory_to_dataset(traj: Trajectory, provenance: dict[str, Any] | None = None) -> xr.Dataset:
    """The trajectory as a self-describing ``xarray.Dataset``.

    Dims ``time, token, dim, head, row, col`` and ``step`` (the EDI per-step series), each with an
    index coordinate (``step_time`` is a coordinate along ``step``); every variable and coordinate
    carries ``long_name``, ``units`` and ``description`` (:mod:`attnflow.io.metadata`); counts
    (``clusters``) are integers; ``attrs`` hold the run's parameters (:func:`run_parameters`), its
    config and provenance as JSON text.
    """
    data: dict[str, Any] = {
        "x": (("time", "token", "dim"), traj.x),
        "A": (("time", "head", "row", "col"), traj.A),
        "token_weights": (("token",), traj.token_weights),
        "head_weights": (("head",), traj.head_weights),
    }
    if traj.V is not None:
        data["V"] = (("time", "head", "row", "col"), traj.V)
    for name, values in traj.diagnostics.items():
        values = np.asarray(values)
        if name in INTEGER_DIAGNOSTICS and np.all(np.isfinite(values)):
            values = np.rint(values).astype(np.int64)
        data[name] = (("time",), values)
    attrs: dict[str, Any] = {
        "Conventions": CF_CONVENTIONS,
        "title": f"attnflow run: model {traj.model}, N = {traj.N}, d = {traj.d}, H = {traj.H}",
        "source": f"attnflow {__version__}",
        **run_parameters(traj),
        "attnflow_version": __version__,
    }
    if traj.config is not None:
        attrs["config"] = jsonable_attr(traj.config)
    attrs["provenance"] = jsonable_attr(provenance if provenance is not None else traj.provenance)
    steps = getattr(traj, "steps", {}) or {}
    for name, values in steps.items():
        if name != "step_time":
            data[name] = (("step",), values)
    for key, value in getattr(traj, "steps_info", {}).items():
        attrs[f"steps_{key}"] = value
    n, d, H = traj.x.shape[1], traj.x.shape[2], traj.A.shape[1]
    coords: dict[str, Any] = {
        "time": traj.t,
        "token": np.arange(n),
        "dim": np.arange(d),
        "head": np.arange(H),
        "row": np.arange(traj.A.shape[2]),
        "col": np.arange(traj.A.shape[3]),
    }
    if steps:
        n_steps = len(next(iter(steps.values())))
        coords["step"] = np.arange(n_steps)
        if "step_time" in steps:
            coords["step_time"] = ("step", np.asarray(steps["step_time"]))
    return describe(xr.Dataset(data, coords=coords, attrs=attrs), RUN_VARIABLES)


def git_commit() -> str | None:
    """The commit of the attnflow source tree, when it is a git checkout."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=5,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def provenance_record(traj: Trajectory) -> dict[str, Any]:
    return {
        "attnflow_version": __version__,
        "torch_version": torch.__version__,
        "python_version": platform.python_version(),
        "git_commit": git_commit(),
        "seed": traj.seed,
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        **traj.provenance,
        "complete": True,
    }


@contextlib.contextmanager
def atomic_folder(path: str | os.PathLike, *, overwrite: bool = False) -> Iterator[Path]:
    """Yield a hidden temporary folder beside ``path``; rename it to ``path`` when the block succeeds.

    On any error the temporary folder is removed, so ``path`` is either absent, the old folder, or
    the complete new one. ``overwrite`` replaces an existing ``path``, which must then be an
    attnflow folder (:func:`is_attnflow_folder`) or empty: the old folder is renamed aside only
    after the block succeeded, then deleted.
    """
    final = Path(path)
    if final.exists() or final.is_symlink():
        if not overwrite:
            raise FileExistsError(
                f"{str(final)!r} already exists; choose another folder or pass overwrite=True (--force)"
            )
        if not replaceable(final):
            raise FileExistsError(refusal(final))
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".{final.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        yield tmp
        if final.exists():
            if not replaceable(final):  # it changed while we wrote: leave it alone
                raise FileExistsError(refusal(final))
            old = final.parent / f".{final.name}.old-{uuid.uuid4().hex[:8]}"
            os.rename(final, old)
            os.rename(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def clean_leftovers(path: str | os.PathLike) -> list[Path]:
    """Remove the hidden ``.NAME.tmp-*`` / ``.NAME.force-*`` folders a killed writer left beside ``path``.

    Call it only while holding the output lock of ``path`` (no other writer can own them then).
    A ``.NAME.old-*`` folder (a kill between the two renames of a replacement) is put back when
    ``path`` itself is missing, else removed. Returns what was removed.
    """
    final = Path(path)
    removed: list[Path] = []
    if not final.parent.is_dir():
        return removed
    olds = sorted(final.parent.glob(f".{glob_escape(final.name)}.old-*"), key=lambda q: q.stat().st_mtime)
    if olds and not final.exists():
        os.rename(olds.pop(), final)
    for pattern in ("tmp-*", "force-*", "old-*"):
        for q in final.parent.glob(f".{glob_escape(final.name)}.{pattern}"):
            if q in olds or pattern != "old-*":
                shutil.rmtree(q, ignore_errors=True) if q.is_dir() else q.unlink(missing_ok=True)
                removed.append(q)
    return removed


def glob_escape(name: str) -> str:
    """``name`` with glob metacharacters escaped (folder names may hold ``[``)."""
    return "".join(f"[{c}]" if c in "*?[" else c for c in name)


# --- What a path is: what may be replaced, and why not -------------------------------------------------

RUN_FILES = {DATASET, CONFIG, PROVENANCE, FIGURES, MANIFEST, CHECKPOINT_NAME, "report.html"}


def read_provenance(path: str | os.PathLike) -> dict | None:
    """``provenance.json`` of a folder as a mapping, or ``None`` when absent or not a JSON object."""
    p = Path(path) / PROVENANCE
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def folder_kind(path: str | os.PathLike) -> str:
    """What ``path`` is: ``missing``, ``file``, ``special`` (device, fifo, socket), ``empty``,
    ``run`` (finished), ``unfinished`` (an attnflow run in progress or stopped), ``sweep``, ``foreign``."""
    p = Path(path)
    try:
        st = p.stat()
    except (FileNotFoundError, NotADirectoryError):
        return "file" if p.is_symlink() else "missing"
    except OSError:
        return "special"
    if stat.S_ISREG(st.st_mode):
        return "file"
    if not stat.S_ISDIR(st.st_mode):
        return "special"
    try:
        names = set(os.listdir(p))
    except OSError:
        return "special"
    if not names:
        return "empty"
    prov = read_provenance(p)
    if prov is not None and "attnflow_version" in prov:
        return "run" if prov.get("complete") is True else "unfinished"
    if CONFIG in names and names <= RUN_FILES | {n for n in names if n.startswith(f".{CHECKPOINT_NAME}.tmp-")}:
        return "unfinished"
    if {"spec.yaml", "points"} <= names:
        return "sweep"
    return "foreign"


def is_attnflow_folder(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a run folder written by attnflow (finished or not)."""
    return folder_kind(path) in ("run", "unfinished")


def replaceable(path: str | os.PathLike) -> bool:
    """What ``--force`` may replace: an attnflow run folder or an empty folder."""
    return folder_kind(path) in ("run", "unfinished", "empty", "missing")


def what_it_is(path: str | os.PathLike) -> str:
    """A phrase naming what ``path`` is when it is not a run folder (``'a file'``, ``'a sweep folder'``, ...)."""
    p = Path(path)
    kind = folder_kind(p)
    if kind == "file":
        return "a file"
    if kind == "special":
        return "not a folder (a device, pipe or unreadable path)"
    if kind == "sweep":
        return "a sweep folder"
    if kind == "empty":
        return "an empty folder"
    if kind == "missing":
        return "missing"
    if kind in ("run", "unfinished"):
        return "an attnflow run folder"
    try:
        shown = sorted(os.listdir(p))[:3]
    except OSError:
        shown = []
    listed = ", ".join(repr(n) for n in shown)
    return f"a folder of other files ({listed}{', ...' if shown else ''})"


def refusal(path: str | os.PathLike) -> str:
    """Why ``--force`` will not replace ``path`` (one sentence naming what it is)."""
    return (
        f"{str(path)!r} is {what_it_is(path)}, not an attnflow run folder; attnflow will not replace it, even with "
        "--force. Choose a new folder."
    )


# --- Integrity: the manifest written before provenance.json, checked on read --------------------------


def file_digest(path: Path) -> str:
    """SHA-256 of a file's bytes (hex)."""
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def write_manifest(folder: Path) -> Path:
    """Record the SHA-256 of every data file under ``folder`` in ``manifest.json``: the dataset and the
    config (figures are drawings of the data that ``attnflow plot`` redraws, so they are left out)."""
    files = {}
    for q in sorted(folder.rglob("*")):
        rel = q.relative_to(folder).as_posix()
        if q.is_file() and rel not in (MANIFEST, PROVENANCE) and not rel.startswith(f"{FIGURES}/"):
            files[rel] = file_digest(q)
    out = folder / MANIFEST
    out.write_text(json.dumps({"format": MANIFEST_FORMAT, "algorithm": "sha256", "files": files}, indent=0))
    return out


def _expected_chunks(store: Path) -> list[str]:
    """Every chunk file the consolidated Zarr (format 2) metadata of ``store`` implies."""
    meta_path = store / ".zmetadata"
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))["metadata"]
    except (OSError, ValueError, KeyError, TypeError):
        raise DamagedRun(f"{str(meta_path)!r} is missing or damaged (the dataset's metadata).") from None
    out = []
    for key, value in meta.items():
        if not key.endswith("/.zarray") or not isinstance(value, dict):
            continue
        name = key[: -len("/.zarray")]
        shape, chunks = value.get("shape") or [], value.get("chunks") or []
        sep = value.get("dimension_separator") or "."
        counts = [-(-int(n) // max(1, int(c))) for n, c in zip(shape, chunks)]
        if any(n == 0 for n in counts):
            continue
        for idx in _indices(counts):
            out.append(f"{name}/{sep.join(str(i) for i in idx) if idx else '0'}")
    return out


def _indices(counts: list[int]) -> Iterator[tuple[int, ...]]:
    if not counts:
        yield ()
        return
    for i in range(counts[0]):
        for rest in _indices(counts[1:]):
            yield (i, *rest)


def verify_run(path: str | os.PathLike) -> dict:
    """Check a finished run folder against what was written; returns its provenance.

    Raises :class:`DamagedRun` naming the file when ``provenance.json`` is not an object with
    ``"complete": true``, a file of ``manifest.json`` is missing or altered, or a chunk of the
    dataset is missing. Warns (:class:`DataWarning`) when there is no manifest (a folder written
    before attnflow 0.1 kept one: nothing to verify digests against) or the attnflow version differs.
    """
    p = Path(path)
    prov_path = p / PROVENANCE
    try:
        text = prov_path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DamagedRun(f"{str(p)!r} has no provenance.json: it is not a finished attnflow run.") from None
    except (OSError, UnicodeDecodeError) as e:
        raise DamagedRun(f"{str(prov_path)!r} cannot be read ({type(e).__name__}).") from None
    try:
        prov = json.loads(text)
    except ValueError:
        raise DamagedRun(f"{str(prov_path)!r} is damaged: it is not valid JSON.") from None
    if not isinstance(prov, dict):
        raise DamagedRun(f"{str(prov_path)!r} is damaged: it holds a {type(prov).__name__}, not a JSON object.")
    if prov.get("complete") is not True:
        raise DamagedRun(
            f'{str(prov_path)!r} does not mark a finished run ("complete" is {_short(prov.get("complete"))}, not true).'
        )
    manifest_path = p / MANIFEST
    if manifest_path.is_file():
        try:
            manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
            files = manifest["files"]
            if not isinstance(files, dict):
                raise TypeError
        except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError):
            raise DamagedRun(f"{str(manifest_path)!r} is damaged (not a manifest of digests).") from None
        for rel, digest in files.items():
            q = p / rel
            if not q.is_file():
                raise DamagedRun(f"{str(q)!r} is missing: the run folder is damaged (manifest.json lists it).")
            if file_digest(q) != digest:
                raise DamagedRun(
                    f"{str(q)!r} is damaged: its SHA-256 differs from the one recorded when the run was written."
                )
    else:
        warnings.warn(
            f"{str(p)!r} has no manifest.json (written by an older attnflow): its files cannot be checked for damage.",
            DataWarning,
            stacklevel=2,
        )
    store = p / DATASET
    if not store.is_dir():
        raise DamagedRun(f"{str(store)!r} is missing: the run folder has no dataset.")
    for rel in _expected_chunks(store):
        if not (store / rel).is_file():
            raise DamagedRun(f"{str(store / rel)!r} is missing: a chunk of the dataset was deleted.")
    version = prov.get("attnflow_version")
    if version != __version__:
        warnings.warn(
            f"{str(p)!r} was written by attnflow {_short(version)}; this is attnflow {__version__}.",
            DataWarning,
            stacklevel=2,
        )
    return prov


def _short(value: Any, limit: int = 40) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def save_run(
    traj: Trajectory,
    path: str | os.PathLike,
    *,
    overwrite: bool = False,
    extra: Callable[[Path], object] | None = None,
) -> Path:
    """Write ``traj`` as a run folder at ``path`` (atomically; see the module docstring).

    ``extra(tmp)`` may add files (figures, say) before ``provenance.json`` seals the folder; saving
    itself draws nothing.
    """
    record = provenance_record(traj)
    with atomic_folder(path, overwrite=overwrite) as tmp:
        write_dataset(trajectory_to_dataset(traj, provenance=record), tmp / DATASET)
        if traj.config is not None:
            (tmp / CONFIG).write_text(yaml.safe_dump(traj.config, sort_keys=False))
        if extra is not None:
            extra(tmp)
        write_manifest(tmp)
        # Written last: its presence with "complete": true marks a finished folder.
        (tmp / PROVENANCE).write_text(json.dumps(record, indent=2, default=str))
    return Path(path)


def is_complete(path: str | os.PathLike) -> bool:
    """Whether ``path`` holds a ``provenance.json`` object with ``"complete": true`` (the boolean)."""
    prov = read_provenance(path)
    return prov is not None and prov.get("complete") is True
