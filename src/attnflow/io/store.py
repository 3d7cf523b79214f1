"""The saved run format: one folder per run, written atomically.

::

    RUN/
      dataset.zarr/      xarray Dataset (xarray.open_zarr(RUN / "dataset.zarr"))
      config.yaml        the exact config that produced the run (when there was one)
      provenance.json    attnflow/torch versions, seed, git commit, wall time, "complete": true
      figures/*.png      sphere snapshots (PCA for d > 3) and diagnostic curves

The folder is assembled under a hidden temporary name beside ``RUN`` and renamed into place
only when every file is written, so a crash never leaves a folder that looks complete.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import platform
import shutil
import subprocess
import uuid
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

DATASET = "dataset.zarr"
CONFIG = "config.yaml"
PROVENANCE = "provenance.json"
FIGURES = "figures"


def write_dataset(ds: xr.Dataset, path: str | os.PathLike) -> None:
    """Write ``ds`` as Zarr format 2 with consolidated metadata: a plain ``xarray.open_zarr(path)``
    opens it without the warnings that zarr 3 gives for consolidated format-3 stores."""
    ds.to_zarr(path, mode="w", zarr_format=2, consolidated=True)


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
    the complete new one. ``overwrite`` replaces an existing ``path`` (renamed aside, then deleted).
    """
    final = Path(path)
    if final.exists() and not overwrite:
        raise FileExistsError(f"{str(final)!r} already exists; choose another folder or pass overwrite=True (--force)")
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".{final.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        yield tmp
        if final.exists():
            old = final.parent / f".{final.name}.old-{uuid.uuid4().hex[:8]}"
            os.rename(final, old)
            os.rename(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


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
        # Written last: its presence with "complete": true marks a finished folder.
        (tmp / PROVENANCE).write_text(json.dumps(record, indent=2, default=str))
    return Path(path)


def is_complete(path: str | os.PathLike) -> bool:
    p = Path(path) / PROVENANCE
    if not p.is_file():
        return False
    try:
        return bool(json.loads(p.read_text()).get("complete"))
    except (OSError, ValueError):
        return False
