"""The disk format of a :class:`Trajectory`: :func:`save_trajectory` writes a run folder,
:func:`load` reads one back.

The record itself is :class:`attnflow.core.trajectory.Trajectory` (re-exported here, so
``from attnflow.io.trajectory import Trajectory`` keeps working). Figures belong to the figure layer
(:mod:`attnflow.viz`), which sits above this one: :func:`save_trajectory` takes the figure writer as
a function and names none. Nothing read from a folder names code: a dataset that stores its heads
compactly chooses a reader from the closed registry :data:`attnflow.io.readers.HEADS_READERS`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import yaml

from attnflow.config.errors import ConfigError
from attnflow.config.yamlsafe import load_yaml
from attnflow.core.descriptions import DIAGNOSTICS, STEP_SERIES
from attnflow.core.errors import InputError, UnsafeInputError
from attnflow.core.trajectory import DeferredDiagnostics, Trajectory  # noqa: F401  (re-exported: their home is core)
from attnflow.io.readers import heads_reader
from attnflow.io.safety import check_name, check_text, scan_folder
from attnflow.io.store import (
    CONFIG,
    DATASET,
    FIGURES,
    PROVENANCE,
    DamagedRun,
    check_declared_sizes,
    is_complete,
    read_json,
    read_small_text,
    save_run,
    verify_run,
    zarr_metadata,
)
from attnflow.io.zarr_guard import check_store, open_store

if TYPE_CHECKING:  # torch and xarray load where a trajectory is rebuilt or read, not at import
    import xarray as xr


def save_trajectory(
    traj: Trajectory,
    path: str | os.PathLike,
    *,
    overwrite: bool = False,
    figures: Callable[[Trajectory, Path], object] | None = None,
) -> Path:
    """Write ``traj`` as a run folder (Zarr dataset, config YAML, provenance, ``summary.json``)
    atomically; ``figures(traj, folder)``, when given, draws ``figures/`` before the folder is sealed
    (the data layer names no figure code: ``traj.save(figures=True)`` passes
    :func:`attnflow.viz.plotting.plot_run`)."""
    return save_run(
        traj,
        path,
        overwrite=overwrite,
        extra=None if figures is None else lambda tmp: figures(traj, tmp / FIGURES),
        summary=write_summary,
    )


def check_attrs(attrs: dict, config: dict | None, where: str) -> dict[str, Any]:
    """The validated attributes of a run dataset that a :class:`Trajectory` is built from:
    ``seed``, ``config``, ``model``, ``method``, ``dt``, ``steps_info`` (and the heads reader's name
    checked); :class:`UnsafeInputError` for a value of the wrong type or a string that could do harm."""
    seed = attrs.get("seed", -1)
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise UnsafeInputError(f"{where}: the attribute 'seed' is a {type(seed).__name__}, not an integer.")
    seed = int(seed)
    if config is None and isinstance(attrs.get("config"), str):
        config = json.loads(check_text(attrs["config"], "the attribute 'config'", where, max_len=1_000_000))
        if not isinstance(config, dict):
            raise UnsafeInputError(f"{where}: the attribute 'config' is not a mapping of config fields.")
    model = check_name(attrs["model"], "the attribute 'model'", where)
    method = check_name(attrs["method"], "the attribute 'method'", where)
    dt = attrs["dt"]
    if isinstance(dt, bool) or not isinstance(dt, (int, float, np.integer, np.floating)):
        raise UnsafeInputError(f"{where}: the attribute 'dt' is a {type(dt).__name__}, not a number.")
    steps_info = {}
    for k, v in attrs.items():
        if str(k).startswith("steps_"):
            key = check_name(str(k)[len("steps_") :], f"the attribute {str(k)[:40]!r}", where)
            v = str(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v
            steps_info[key] = check_text(v, f"the attribute {str(k)[:40]!r}", where)
    if "heads_reader" in attrs:
        heads_reader(attrs["heads_reader"], where)
    return {"seed": seed, "config": config, "model": model, "method": method, "dt": dt, "steps_info": steps_info}


def dataset_to_trajectory(
    ds: xr.Dataset, config: dict | None = None, provenance: dict | None = None, *, where: str = "the dataset"
) -> Trajectory:
    """The :class:`Trajectory` a dataset of :func:`~attnflow.io.store.trajectory_to_dataset` holds.

    Also reads datasets of older versions (no attributes, ``clusters`` as floats, ``step_time`` a
    data variable); without ``config`` it takes the one recorded in ``ds.attrs`` (if any).
    """
    checked = check_attrs(dict(ds.attrs), config, where)
    seed, config, model, method, dt = (checked[k] for k in ("seed", "config", "model", "method", "dt"))
    steps_info = checked["steps_info"]
    if "A" in ds:
        A, V = np.asarray(ds["A"].values), np.asarray(ds["V"].values) if "V" in ds else None
    else:  # heads stored compactly (hf runs: factors once per layer): a registered reader rebuilds them
        A, V = heads_reader(ds.attrs["heads_reader"], where)(ds)
    return Trajectory(
        t=np.asarray(ds["time"].values, dtype=np.float64),
        x=np.asarray(ds["x"].values),
        A=A,
        V=V,
        diagnostics={k: np.asarray(ds[k].values, dtype=np.float64) for k in DIAGNOSTICS if k in ds},
        token_weights=np.asarray(ds["token_weights"].values),
        head_weights=np.asarray(ds["head_weights"].values),
        model=model,
        method=method,
        dt=float(dt),
        seed=None if seed < 0 else seed,
        config=config,
        provenance=provenance or {},
        steps={k: np.asarray(ds[k].values) for k in _step_names(ds)},
        steps_info=steps_info,
    )


def _step_names(ds: xr.Dataset) -> list[str]:
    """The per-step series of ``ds`` in :data:`STEP_SERIES` order (data variables or coordinates)."""
    names = [str(k) for k in ds.variables if k != "step" and ds[k].dims == ("step",)]
    order = list(STEP_SERIES)
    return sorted(names, key=lambda k: order.index(k) if k in order else len(order))


def write_summary(folder: Path, config: dict | None, provenance: dict) -> Path | None:
    """Write ``summary.json`` (:mod:`attnflow.io.summary`) into the run folder being written at
    ``folder`` (its dataset already there), computed from the dataset as read back, exactly as
    ``show``'s full path would; ``None`` when it cannot be computed (``show`` then takes the full
    path, which says why)."""
    import xarray as xr

    from attnflow.io.summary import SUMMARY, run_summary

    try:
        ds = xr.open_zarr(folder / DATASET).load()
        rec = run_summary(dataset_to_trajectory(ds, config=config, provenance=provenance), dict(ds.attrs))
    except Exception:  # a cache only: whatever fails here fails again, with its message, in show's full path
        return None
    out = folder / SUMMARY
    out.write_text(json.dumps(rec, indent=0))
    return out


def read_run_config(p: Path) -> dict | None:
    """The run folder's ``config.yaml`` as a mapping (``None`` when absent); :class:`DamagedRun` otherwise."""
    if not (p / CONFIG).is_file():
        return None
    try:
        config = load_yaml(read_small_text(p / CONFIG))
    except (yaml.YAMLError, UnicodeDecodeError, ConfigError):
        raise DamagedRun(f"{str(p / CONFIG)!r} is damaged: it is not valid YAML.") from None
    if config is not None and not isinstance(config, dict):
        raise DamagedRun(f"{str(p / CONFIG)!r} is damaged: it is not a mapping of config fields.")
    return config


def check_run_metadata(path: str | os.PathLike) -> tuple[dict, dict | None, dict]:
    """Every check :func:`load` makes of a finished run folder short of decoding its arrays (links,
    sizes, manifest digests, config, the dataset's declared arrays and attributes), reading the Zarr
    metadata as plain JSON (no xarray); returns ``(provenance, config, checked attributes)``."""
    p = Path(path)
    scan_folder(p)
    if not is_complete(p):
        raise InputError(f"{str(p)!r} is not a complete attnflow run folder (no complete provenance.json)")
    provenance = verify_run(p)
    config = read_run_config(p)
    check_declared_sizes(p / DATASET)
    check_store(p / DATASET)  # what zarr would read: one format, allowed codecs, every chunk bounded
    meta = zarr_metadata(p / DATASET)
    attrs = meta.get(".zattrs")
    if not isinstance(attrs, dict):
        raise DamagedRun(f"{str(p / DATASET)!r} is damaged: its metadata holds no attributes.")
    names = {k.rsplit("/", 1)[0] for k in meta if k.endswith("/.zarray")}
    heads = ("A",) if "heads_reader" not in attrs else ()
    missing = [k for k in ("x", *heads, "token_weights", "head_weights", "time") if k not in names]
    missing += [f"attribute {k!r}" for k in ("model", "method", "dt") if k not in attrs]
    if missing:
        raise DamagedRun(f"{str(p / DATASET)!r} is damaged or not an attnflow dataset: it lacks {', '.join(missing)}.")
    try:
        checked = check_attrs(attrs, config, repr(str(p / DATASET)))
    except UnsafeInputError:
        raise
    except (KeyError, TypeError, ValueError) as e:
        raise DamagedRun(f"{str(p / DATASET)!r} is damaged: {_short(e)}.") from None
    return provenance, config, checked


def load(path: str | os.PathLike, *, verify: bool = True) -> Trajectory:
    """Read a run folder written by :meth:`Trajectory.save` back into a :class:`Trajectory`.

    The folder is data, never code (see docs/robustness.md): it is first walked without following
    links (a link anywhere, a sparse or oversized file is refused), the declared array sizes are
    checked against the memory this process has, and every string used is validated. With
    ``verify`` (the default) the folder is also checked against its manifest
    (:func:`attnflow.io.store.verify_run`); a damaged folder raises
    :class:`~attnflow.io.store.DamagedRun` naming the file, an unsafe one
    :class:`~attnflow.core.errors.UnsafeInputError`.
    """
    p = Path(path)
    if p.is_symlink() and not p.is_dir():
        raise UnsafeInputError(f"{str(p)!r} is a symbolic link to no folder; give the run folder itself.")
    if not p.is_dir():
        raise InputError(f"no run folder at {str(p)!r}")
    scan_folder(p)
    if not is_complete(p):
        raise InputError(f"{str(p)!r} is not a complete attnflow run folder (no complete provenance.json)")
    provenance = verify_run(p) if verify else read_json(p / PROVENANCE)
    config = read_run_config(p)
    check_declared_sizes(p / DATASET)
    check_store(p / DATASET)  # what zarr will read: one format, allowed codecs, every chunk bounded
    try:
        ds = open_store(p / DATASET, budget=float("inf")).load()
    except Exception as e:  # zarr and numcodecs raise many types on damaged stores
        raise DamagedRun(
            f"{str(p / DATASET)!r} cannot be decoded: the dataset is damaged ({type(e).__name__}: {_short(e)})."
        ) from None
    # Heads are stored densely (A) or, for hf runs, as factors that a registered reader rebuilds.
    heads = ("A",) if "heads_reader" not in ds.attrs else ()
    missing = [k for k in ("x", *heads, "token_weights", "head_weights", "time") if k not in ds.variables]
    missing += [f"attribute {k!r}" for k in ("model", "method", "dt") if k not in ds.attrs]
    if missing:
        raise DamagedRun(f"{str(p / DATASET)!r} is damaged or not an attnflow dataset: it lacks {', '.join(missing)}.")
    try:
        return dataset_to_trajectory(ds, config=config, provenance=provenance, where=repr(str(p / DATASET)))
    except UnsafeInputError:
        raise
    except (KeyError, TypeError, ValueError) as e:
        raise DamagedRun(f"{str(p / DATASET)!r} is damaged: {_short(e)}.") from None


def _short(e: object, limit: int = 160) -> str:
    text = " ".join(str(e).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
