"""The saved run format: one folder per run, written atomically.

::

    RUN/
      dataset.zarr/      xarray Dataset (xarray.open_zarr(RUN / "dataset.zarr"))
      config.yaml        the exact config that produced the run (when there was one)
      summary.json       what `attnflow show` prints, all saved times (attnflow.io.summary)
      provenance.json    attnflow/torch versions, seed, git commit, wall time, "complete": true
      manifest.json      SHA-256 of every other file but the figures (written last)
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
import math
import os
import platform
import re
import shutil
import stat
import subprocess
import uuid
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import yaml

from attnflow._version import __version__
from attnflow.core.errors import Hint, InputError, UnsafeInputError, hinted
from attnflow.core.trajectory import Trajectory
from attnflow.io.metadata import INTEGER_DIAGNOSTICS, RUN_VARIABLES, describe, jsonable_attr
from attnflow.io.safety import (
    MAX_TEXT,
    atomic_write,
    check_name,
    check_text,
    inside,
    memory_budget,
    open_nofollow,
    open_regular,
    read_regular,
    refuse_link,
    scan_folder,
)

if TYPE_CHECKING:
    import xarray as xr

#: The global ``Conventions`` attribute of every dataset attnflow writes (CF metadata conventions).
CF_CONVENTIONS = "CF-1.10"
DATASET = "dataset.zarr"
CONFIG = "config.yaml"
PROVENANCE = "provenance.json"
FIGURES = "figures"
MANIFEST = "manifest.json"
MANIFEST_FORMAT = "attnflow-manifest/1"
SUMMARY = "summary.json"  # what `attnflow show` prints (attnflow.io.summary)
CHECKPOINT_NAME = "checkpoint.npz"  # io.checkpoint.CHECKPOINT (not imported: that module is heavier)
#: Marks a folder attnflow is still assembling (removed before the rename that publishes it): a
#: leftover holding it is provably ours.
WRITING_MARK = ".attnflow-writing"
#: Largest JSON or YAML file of a folder read whole (provenance, manifest, config, Zarr metadata).
MAX_SMALL_FILE = 16 * 2**20
#: Most chunk files a dataset may declare (a run's variables hold a handful each).
MAX_CHUNKS = 1_000_000


class DamagedRun(InputError):
    """A run folder whose files do not match what was written (missing, altered or unreadable)."""


def read_small_text(path: Path, limit: int = MAX_SMALL_FILE) -> str:
    """The text of a small file of a folder (JSON, YAML): never through a link, at most ``limit`` bytes."""
    return read_regular(path, max_bytes=limit).decode("utf-8")


def read_json(path: Path, limit: int = MAX_SMALL_FILE) -> Any:
    """A small JSON file of a folder (see :func:`read_small_text`); ``ValueError`` when not JSON."""
    return json.loads(read_small_text(path, limit))


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
    spec = traj.spec  # what the run used, before what a config passed along says
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
        "cluster_eps": spec.cluster_eps if spec is not None else section("diagnostics").get("cluster_eps"),
        "weights_process": section("weights").get("process"),
        "beta": section("heads").get("beta"),
        "heads_preset": section("heads").get("preset"),
        "tokens_init": section("tokens").get("init"),
        "save_every": spec.save_every if spec is not None else section("integration").get("save_every"),
        "kernel_backend": spec.backend if spec is not None else section("kernel").get("backend"),
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
    import xarray as xr  # here, not at the top: checking a folder needs no xarray

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
    import torch  # only its version; a run has loaded it already

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
    refuse_link(final, "output folder")
    if final.exists() or final.is_symlink():
        if not overwrite:
            raise hinted(
                FileExistsError(f"{str(final)!r} already exists; choose another folder or pass overwrite=True"),
                Hint("overwrite", True),
            )
        if not replaceable(final):
            raise hinted(FileExistsError(refusal(final)), Hint("out"))
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".{final.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    (tmp / WRITING_MARK).touch()
    try:
        yield tmp
        if not (tmp / MANIFEST).exists():  # every folder attnflow writes has one (its ownership mark)
            write_manifest(tmp)
        (tmp / WRITING_MARK).unlink()
        sync_tree(tmp)  # the new folder is on disk before any rename publishes it
        refuse_link(final, "output folder")
        if final.exists():
            if not replaceable(final):  # it changed while we wrote: leave it alone
                raise FileExistsError(refusal(final))
            old = final.parent / f".{final.name}.old-{uuid.uuid4().hex[:8]}"
            os.rename(final, old)
            os.rename(tmp, final)
            sync_tree(final.parent, recurse=False)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, final)
            sync_tree(final.parent, recurse=False)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def sync_tree(folder: Path, *, recurse: bool = True) -> None:
    """``fsync`` every file and folder under ``folder`` (or only ``folder`` itself): what a rename
    publishes is then on disk, not only in the page cache (a power cut after the rename finds the
    complete folder). Links are never followed; a file system without ``fsync`` on folders is fine."""
    paths = [folder]
    if recurse:
        for dirpath, dirnames, filenames in os.walk(folder, followlinks=False):
            paths += [Path(dirpath, n) for n in filenames + dirnames]
    for q in paths:
        try:
            fd = os.open(q, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
        except OSError:
            continue
        try:
            if stat.S_ISREG(os.fstat(fd).st_mode) or stat.S_ISDIR(os.fstat(fd).st_mode):
                with contextlib.suppress(OSError):
                    os.fsync(fd)
        finally:
            os.close(fd)


def clean_leftovers(path: str | os.PathLike) -> list[Path]:
    """Remove the hidden ``.NAME.tmp-*`` / ``.NAME.force-*`` folders a killed writer left beside ``path``.

    Call it only while holding the output lock of ``path`` (no other writer can own them then).
    Only what is provably ours is touched (:func:`is_our_leftover`): a real folder (no link) whose
    name is exactly ``.NAME.tmp-XXXXXXXX`` (8 hex digits) and which holds attnflow's writing mark or
    is itself an attnflow run folder (or empty). A ``.NAME.old-*`` folder (a kill between the two
    renames of a replacement) is put back when ``path`` itself is missing, else removed. A file or
    folder of the user's with a similar name stays. Returns what was removed.
    """
    final = Path(path)
    removed: list[Path] = []
    if not final.parent.is_dir():
        return removed
    ours = [q for q in final.parent.glob(f".{glob_escape(final.name)}.*-*") if is_our_leftover(q, final.name)]
    olds = sorted((q for q in ours if ".old-" in q.name), key=lambda q: q.lstat().st_mtime)
    if olds and not final.exists() and not final.is_symlink() and folder_kind(olds[-1]) in ("run", "unfinished"):
        os.rename(olds.pop(), final)
        ours = [q for q in ours if q.exists()]
    for q in ours:
        shutil.rmtree(q, ignore_errors=True)
        removed.append(q)
    return removed


def is_our_leftover(q: Path, name: str) -> bool:
    """Whether ``q`` is a leftover of attnflow's writing ``name`` (see :func:`clean_leftovers`)."""
    if not re.fullmatch(rf"\.{re.escape(name)}\.(tmp|force|old)-[0-9a-f]{{8}}", q.name):
        return False
    if q.is_symlink() or not q.is_dir():
        return False
    if (q / WRITING_MARK).is_file() and not (q / WRITING_MARK).is_symlink():
        return True
    return folder_kind(q) in ("run", "unfinished", "empty")


def glob_escape(name: str) -> str:
    """``name`` with glob metacharacters escaped (folder names may hold ``[``)."""
    return "".join(f"[{c}]" if c in "*?[" else c for c in name)


# --- What a path is: what may be replaced, and why not -------------------------------------------------

RUN_FILES = {DATASET, CONFIG, PROVENANCE, FIGURES, MANIFEST, CHECKPOINT_NAME, "report.html", WRITING_MARK, SUMMARY}
#: What an attnflow sweep folder holds (:mod:`attnflow.sweep.table`); a folder recognised as one by
#: its manifest (``"kind": "sweep"``), or for sweeps written before manifests, by holding only these.
SWEEP_FILES = {"sweep.yaml", "points", "results.parquet", "timeseries.parquet", "trajectories", MANIFEST}


def read_manifest(path: str | os.PathLike) -> dict | None:
    """``manifest.json`` of a folder as a mapping with a known ``format``, or ``None``."""
    p = Path(path) / MANIFEST
    try:
        data = read_json(p)
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("format") != MANIFEST_FORMAT:
        return None
    return data


def read_provenance(path: str | os.PathLike) -> dict | None:
    """``provenance.json`` of a folder as a mapping, or ``None`` when absent or not a JSON object."""
    p = Path(path) / PROVENANCE
    try:
        data = read_json(p)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def folder_kind(path: str | os.PathLike) -> str:
    """What ``path`` is: ``missing``, ``file``, ``special`` (device, fifo, socket), ``empty``,
    ``run`` (finished), ``unfinished`` (an attnflow run in progress or stopped), ``sweep`` (by its
    manifest), ``link`` (a symbolic link: never written through), ``foreign``."""
    p = Path(path)
    if p.is_symlink():
        return "link"
    try:
        st = p.stat()
    except (FileNotFoundError, NotADirectoryError):
        return "missing"
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
    manifest = read_manifest(p)
    if manifest is not None and manifest.get("kind") == "sweep":
        return "sweep"
    prov = read_provenance(p)
    if prov is not None and "attnflow_version" in prov:
        return "run" if prov.get("complete") is True else "unfinished"
    if CONFIG in names and names <= RUN_FILES | {n for n in names if n.startswith(f".{CHECKPOINT_NAME}.tmp-")}:
        return "unfinished"
    if {"sweep.yaml", "points"} <= names <= SWEEP_FILES and (p / "points").is_dir() and not (p / "points").is_symlink():
        return "sweep"
    return "foreign"


def is_attnflow_folder(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a run folder written by attnflow (finished or not)."""
    return folder_kind(path) in ("run", "unfinished")


def replaceable(path: str | os.PathLike) -> bool:
    """What ``overwrite``/``force`` may replace: an attnflow run folder or an empty folder."""
    return folder_kind(path) in ("run", "unfinished", "empty", "missing")


def what_it_is(path: str | os.PathLike) -> str:
    """A phrase naming what ``path`` is when it is not a run folder (``'a file'``, ``'a sweep folder'``, ...)."""
    p = Path(path)
    kind = folder_kind(p)
    if kind == "file":
        return "a file"
    if kind == "link":
        return "a symbolic link (attnflow never writes through one)"
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
    """Why ``overwrite``/``force`` will not replace ``path`` (one sentence naming what it is)."""
    return (
        f"{str(path)!r} is {what_it_is(path)}, not an attnflow run folder; attnflow will not replace it, even when "
        "told to overwrite it (force=True). Choose a new folder."
    )


#: The mark in the head of every ``report.html`` attnflow writes (how a report is recognised as ours).
REPORT_MARK = '<meta name="generator" content="attnflow report">'
#: What each command's output file starts with: the one kind of file that command may replace.
FILE_KINDS: dict[str, tuple[str, Callable[[bytes], bool]]] = {
    "report": ("an attnflow report", lambda head: REPORT_MARK.encode() in head),
    "movie": ("a movie (MP4 or GIF)", lambda head: head[:6] in (b"GIF87a", b"GIF89a") or head[4:8] == b"ftyp"),
    "figure": ("a figure (PNG or PDF)", lambda head: head[:8] == b"\x89PNG\r\n\x1a\n" or head[:5] == b"%PDF-"),
}


def check_file_out(path: str | os.PathLike, kind: str, *, force: bool, owned: bool = False) -> None:
    """The one ownership rule for a command that writes a file (``report``, ``movie``, ``plot``).

    A missing ``path`` is fine. An existing one must be a real file (a link is refused: writing
    would change what it points to) of the command's own kind (:data:`FILE_KINDS`, recognised by
    its first bytes), and is replaced only with ``force`` or when ``owned`` (the file belongs to
    an attnflow folder, as ``RUN/report.html`` does). Anything else is refused, even with ``force``.
    """
    p = Path(path)
    refuse_link(p, "output file")
    refuse_link(p.parent, "output folder")
    if not p.exists():
        return
    what, recognise = FILE_KINDS[kind]
    if not p.is_file():
        raise InputError(
            f"{str(p)!r} is {what_it_is(p)}, not {what}; attnflow will not replace it. Choose another output.",
            hint=Hint("out"),
        )
    if owned:
        return
    try:
        with os.fdopen(open_nofollow(p, os.O_RDONLY), "rb") as fh:
            head = fh.read(4096)
    except OSError:
        head = b""
    if not recognise(head):
        raise InputError(
            f"{str(p)!r} is a file that is not {what} written by attnflow; attnflow will not replace it, even with "
            "force=True. Choose another output.",
            hint=Hint("out"),
        )
    if not (force or owned):
        raise InputError(
            f"{str(p)!r} already exists; choose another output, or pass force=True to replace it.",
            hint=Hint("force", True),
        )


# --- Integrity: the manifest written before provenance.json, checked on read --------------------------


def file_digest(path: Path) -> str:
    """SHA-256 of a file's bytes (hex)."""
    with open_regular(path) as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def write_manifest(folder: Path, kind: str = "run") -> Path:
    """Record the SHA-256 of every data file under ``folder`` in ``manifest.json``: the dataset, the
    config and ``provenance.json`` when it is there (figures are drawings of the data that ``attnflow plot``
    redraws, so they are left out).
    ``kind`` (``run``, ``sweep``) is what the folder is: the mark by which attnflow recognises its
    own folders before replacing anything (see :func:`folder_kind`)."""
    files = {}
    for q in sorted(folder.rglob("*")):
        rel = q.relative_to(folder).as_posix()
        if q.is_symlink():
            continue
        if q.is_file() and rel not in (MANIFEST, WRITING_MARK) and not rel.startswith(f"{FIGURES}/"):
            files[rel] = file_digest(q)
    out = folder / MANIFEST
    text = json.dumps({"format": MANIFEST_FORMAT, "kind": kind, "algorithm": "sha256", "files": files}, indent=0)
    with atomic_write(out) as fh:
        fh.write(text)
    return out


def mark_folder(folder: Path, kind: str) -> Path:
    """Write the ``manifest.json`` that marks ``folder`` as attnflow's ``kind`` (a sweep folder, whose
    records change as it runs, carries no digests): the mark :func:`folder_kind` recognises."""
    out = folder / MANIFEST
    with atomic_write(out) as fh:
        fh.write(json.dumps({"format": MANIFEST_FORMAT, "kind": kind, "algorithm": "sha256", "files": {}}, indent=0))
    return out


def zarr_metadata(store: Path) -> dict:
    """The consolidated Zarr (format 2) metadata of ``store`` (bounded read, no links)."""
    meta_path = store / ".zmetadata"
    try:
        meta = read_json(meta_path)["metadata"]
        if not isinstance(meta, dict):
            raise TypeError
    except (OSError, ValueError, KeyError, TypeError):
        raise DamagedRun(f"{str(meta_path)!r} is missing or damaged (the dataset's metadata).") from None
    return meta


def _arrays(store: Path) -> Iterator[tuple[str, list[int], list[int], int, str]]:
    """``(name, shape, chunks, itemsize, separator)`` of every array the metadata of ``store`` declares,
    each checked to be small non-negative integers (a damaged or hostile declaration is refused)."""
    for key, value in zarr_metadata(store).items():
        if not key.endswith("/.zarray") or not isinstance(value, dict):
            continue
        name = key[: -len("/.zarray")]
        inside(store, name, f"{str(store / '.zmetadata')!r}")
        shape, chunks = value.get("shape") or [], value.get("chunks") or []
        ok = isinstance(shape, list) and isinstance(chunks, list) and len(shape) == len(chunks) <= 32
        ok = ok and all(isinstance(n, int) and not isinstance(n, bool) and 0 <= n < 2**62 for n in shape)
        ok = ok and all(isinstance(c, int) and not isinstance(c, bool) and 0 < c < 2**62 for c in chunks)
        sep = value.get("dimension_separator") or "."
        if not ok or sep not in (".", "/"):
            raise DamagedRun(f"{str(store / name)!r} declares an impossible shape or chunking ({_short(shape)}).")
        try:
            itemsize = int(np.dtype(check_text(str(value.get("dtype", "")), "dtype", name, max_len=32)).itemsize)
        except TypeError:
            itemsize = 8
        yield name, shape, chunks, max(1, itemsize), sep


def check_declared_sizes(store: str | os.PathLike, budget: float | None = None) -> None:
    """Refuse a Zarr dataset whose declared arrays would not fit in memory, or declare more than
    :data:`MAX_CHUNKS` chunks, before anything is decompressed (a few kB of metadata may declare
    ``1e12`` rows)."""
    store = Path(store)
    budget = memory_budget() if budget is None else budget
    total, n_chunks = 0, 0
    for name, shape, chunks, itemsize, _ in _arrays(store):
        total += itemsize * math.prod(shape)
        n_chunks += math.prod(-(-n // c) for n, c in zip(shape, chunks))
        if n_chunks > MAX_CHUNKS:
            raise UnsafeInputError(
                f"{str(store)!r} declares more than {MAX_CHUNKS:,} chunks (at {name!r}); an attnflow dataset has few."
            )
    if total > budget:
        raise UnsafeInputError(
            f"{str(store)!r} declares arrays of {total:,} bytes, more than the {int(budget):,} this process can use; "
            "it is not read."
        )


def _expected_chunks(store: Path) -> list[str]:
    """Every chunk file the consolidated Zarr (format 2) metadata of ``store`` implies."""
    check_declared_sizes(store, budget=float("inf"))
    out = []
    for name, shape, chunks, _, sep in _arrays(store):
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
    scan_folder(p)
    prov_path = p / PROVENANCE
    try:
        text = read_small_text(prov_path)
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
    for key in ("attnflow_version", "git_commit", "torch_version", "python_version"):
        if prov.get(key) is not None:
            check_name(prov[key], f"{key!r}", repr(str(prov_path)))
    for key, value in prov.items():
        if isinstance(value, str):
            check_text(value, f"{str(key)[:40]!r}", repr(str(prov_path)), max_len=100 * MAX_TEXT)
    manifest_path = p / MANIFEST
    if manifest_path.is_file():
        try:
            manifest = read_json(manifest_path)
            files = manifest["files"]
            if not isinstance(files, dict) or len(files) > MAX_CHUNKS:
                raise TypeError
        except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError):
            raise DamagedRun(f"{str(manifest_path)!r} is damaged (not a manifest of digests).") from None
        where = repr(str(manifest_path))
        for rel, digest in files.items():
            q = inside(p, rel, where)
            if not isinstance(digest, str) or len(digest) != 64:
                raise DamagedRun(f"{where} is damaged: the digest of {rel!r} is not a SHA-256.")
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
        if not inside(store, rel, repr(str(store / ".zmetadata"))).is_file():
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
    summary: Callable[[Path, dict | None, dict], object] | None = None,
) -> Path:
    """Write ``traj`` as a run folder at ``path`` (atomically; see the module docstring).

    ``extra(tmp)`` may add files (figures, say) before ``provenance.json`` seals the folder; saving
    itself draws nothing. ``summary(tmp, config, provenance)`` writes ``summary.json``
    (:func:`attnflow.io.trajectory.write_summary`) before the manifest, so its digest is recorded.
    """
    record = provenance_record(traj)
    with atomic_folder(path, overwrite=overwrite) as tmp:
        write_dataset(trajectory_to_dataset(traj, provenance=record), tmp / DATASET)
        if traj.config is not None:
            (tmp / CONFIG).write_text(yaml.safe_dump(traj.config, sort_keys=False))
        if extra is not None:
            extra(tmp)
        if summary is not None:
            summary(tmp, traj.config, record)
        # Before the manifest, which records its digest too (a damaged provenance value, the seed or the
        # version shown by `show`, is caught like a damaged chunk); the folder appears whole or not at all.
        (tmp / PROVENANCE).write_text(json.dumps(record, indent=2, default=str))
        write_manifest(tmp, "run")
    return Path(path)


def is_complete(path: str | os.PathLike) -> bool:
    """Whether ``path`` holds a ``provenance.json`` object with ``"complete": true`` (the boolean)."""
    prov = read_provenance(path)
    return prov is not None and prov.get("complete") is True
