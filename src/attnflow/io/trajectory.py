"""The simulated flow as data: :class:`Trajectory`, and :func:`load` to read a run folder back.

A trajectory knows how to write its data (:mod:`attnflow.io.store`). Figures belong to the figure
layer (:mod:`attnflow.viz`), which sits above this one: ``traj.save(path, figures=True)`` calls the
writer named in :data:`FIGURE_WRITER` (a ``"module:function"`` reference, resolved only when
figures are asked for, as a plugin entry point is), so the data layer never imports the figures.
"""

from __future__ import annotations

import importlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import xarray as xr
import yaml

from attnflow.analysis.diagnostics import DIAGNOSTICS
from attnflow.analysis.edi import STEP_SERIES
from attnflow.config.errors import ConfigError
from attnflow.config.yamlsafe import load_yaml
from attnflow.core.heads import Heads
from attnflow.io.store import (
    CONFIG,
    DATASET,
    FIGURES,
    PROVENANCE,
    DamagedRun,
    is_complete,
    save_run,
    trajectory_to_dataset,
    verify_run,
)

#: ``"module:function"`` of the ``writer(traj, folder)`` that ``Trajectory.save(figures=True)`` calls
#: to draw ``figures/`` (the run figures of :func:`attnflow.viz.plotting.plot_run` by default).
FIGURE_WRITER = "attnflow.viz.plotting:plot_run"


def resolve_reference(reference: str) -> Callable[..., Any]:
    """The function a ``"module:function"`` reference names, imported when it is first needed (the
    way plugin entry points are): the figure writer, or an ``hf`` dataset's ``heads_reader``."""
    module, _, name = reference.partition(":")
    return getattr(importlib.import_module(module), name)


def figure_writer(reference: str = FIGURE_WRITER) -> Callable[[Any, Path], Any]:
    """The figure writer ``traj.save(figures=True)`` calls (see :data:`FIGURE_WRITER`)."""
    return resolve_reference(reference)


@dataclass
class Trajectory:
    """A simulated token flow at its save times.

    ``t`` ``(S,)``; ``x`` ``(S, N, d)``; ``A`` and ``V`` ``(S, H, d, d)`` the heads at those times
    (``V = None`` when ``V = A`` throughout); ``diagnostics[name]`` ``(S,)`` (see
    :data:`attnflow.diagnostics.DIAGNOSTICS`); masses ``token_weights`` ``(N,)``, ``head_weights`` ``(H,)``.
    """

    t: np.ndarray
    x: np.ndarray
    A: np.ndarray
    V: np.ndarray | None
    diagnostics: dict[str, np.ndarray]
    token_weights: np.ndarray
    head_weights: np.ndarray
    model: str
    method: str
    dt: float
    seed: int | None = None
    config: dict[str, Any] | None = None
    provenance: dict[str, Any] = field(default_factory=dict)
    #: Per-step series (length = number of steps) for the EDI budget, see :data:`attnflow.edi.STEP_SERIES`.
    steps: dict[str, np.ndarray] = field(default_factory=dict)
    steps_info: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Counts (clusters) are whole numbers, as on disk: integers here too, unless a value is missing.
        from attnflow.io.metadata import INTEGER_DIAGNOSTICS

        for name in INTEGER_DIAGNOSTICS:
            values = self.diagnostics.get(name)
            if values is not None and np.all(np.isfinite(values)):
                self.diagnostics[name] = np.rint(np.asarray(values)).astype(np.int64)

    def __repr__(self) -> str:
        """A one-line summary (the arrays are in the fields: ``traj.x``, ``traj.diagnostics``, ...)."""
        t = self.t
        span = f"t={t[0]:g}..{t[-1]:g}" if len(t) else "t=()"
        steps = self.provenance.get("steps")
        if steps is None and self.steps:
            steps = len(next(iter(self.steps.values())))
        return (
            f"Trajectory(model={self.model!r}, method={self.method!r}, N={self.N}, d={self.d}, H={self.H}, "
            f"{span}, saved_times={len(t)}, dt={self.dt:g}{'' if steps is None else f', steps={steps}'}, "
            f"seed={self.seed})"
        )

    def _repr_html_(self) -> str:
        """The notebook view: sizes, times, model, and the first and last value of each diagnostic."""
        from attnflow.core.html import html_table

        t = self.t
        rows: list[tuple[str, object]] = [
            ("model, method", f"{self.model}, {self.method} (dt = {self.dt:g})"),
            ("tokens N, dimension d, heads H", f"{self.N}, {self.d}, {self.H}"),
            ("saved times", f"{len(t)}: t = {t[0]:g} .. {t[-1]:g}" if len(t) else "none"),
            ("seed", self.seed),
        ]
        rows += [(name, np.asarray(v)) for name, v in self.diagnostics.items()]
        return html_table("Trajectory", rows)

    @property
    def N(self) -> int:
        return int(self.x.shape[1])

    @property
    def d(self) -> int:
        return int(self.x.shape[2])

    @property
    def H(self) -> int:
        return int(self.A.shape[1])

    def heads_at(self, k: int) -> Heads:
        """The heads at save index ``k`` as a :class:`Heads`."""
        A = torch.from_numpy(self.A[k])
        return Heads(K=A, V=None if self.V is None else torch.from_numpy(self.V[k]))

    def to_xarray(self) -> xr.Dataset:
        """An ``xarray.Dataset`` with dims ``time, token, dim, head, row, col``."""
        return trajectory_to_dataset(self)

    def save(self, path: str | os.PathLike, *, overwrite: bool = False, figures: bool = True) -> Path:
        """Write the run folder (Zarr dataset, config YAML, provenance and, with ``figures``, the
        figures of :data:`FIGURE_WRITER`) atomically."""
        draw = figure_writer() if figures else None
        return save_run(
            self, path, overwrite=overwrite, extra=None if draw is None else lambda tmp: draw(self, tmp / FIGURES)
        )


def dataset_to_trajectory(ds: xr.Dataset, config: dict | None = None, provenance: dict | None = None) -> Trajectory:
    """The :class:`Trajectory` a dataset of :func:`~attnflow.io.store.trajectory_to_dataset` holds.

    Also reads datasets of older versions (no attributes, ``clusters`` as floats, ``step_time`` a
    data variable); without ``config`` it takes the one recorded in ``ds.attrs`` (if any).
    """
    seed = int(ds.attrs.get("seed", -1))
    if config is None and isinstance(ds.attrs.get("config"), str):
        config = json.loads(ds.attrs["config"])
    if "A" in ds:
        A, V = np.asarray(ds["A"].values), np.asarray(ds["V"].values) if "V" in ds else None
    else:  # heads stored compactly (hf runs: factors once per layer); the "module:function" rebuilds them
        A, V = resolve_reference(str(ds.attrs["heads_reader"]))(ds)
    return Trajectory(
        t=np.asarray(ds["time"].values, dtype=np.float64),
        x=np.asarray(ds["x"].values),
        A=A,
        V=V,
        diagnostics={k: np.asarray(ds[k].values, dtype=np.float64) for k in DIAGNOSTICS if k in ds},
        token_weights=np.asarray(ds["token_weights"].values),
        head_weights=np.asarray(ds["head_weights"].values),
        model=str(ds.attrs["model"]),
        method=str(ds.attrs["method"]),
        dt=float(ds.attrs["dt"]),
        seed=None if seed < 0 else seed,
        config=config,
        provenance=provenance or {},
        steps={k: np.asarray(ds[k].values) for k in _step_names(ds)},
        steps_info={k[len("steps_") :]: str(v) for k, v in ds.attrs.items() if k.startswith("steps_")},
    )


def _step_names(ds: xr.Dataset) -> list[str]:
    """The per-step series of ``ds`` in :data:`STEP_SERIES` order (data variables or coordinates)."""
    names = [str(k) for k in ds.variables if k != "step" and ds[k].dims == ("step",)]
    order = list(STEP_SERIES)
    return sorted(names, key=lambda k: order.index(k) if k in order else len(order))


def load(path: str | os.PathLike, *, verify: bool = True) -> Trajectory:
    """Read a run folder written by :meth:`Trajectory.save` back into a :class:`Trajectory`.

    With ``verify`` (the default) the folder is first checked against its manifest
    (:func:`attnflow.io.store.verify_run`); a damaged folder raises
    :class:`~attnflow.io.store.DamagedRun` naming the file.
    """
    p = Path(path)
    if not p.is_dir():
        raise FileNotFoundError(f"no run folder at {str(p)!r}")
    if not is_complete(p):
        raise ValueError(f"{str(p)!r} is not a complete attnflow run folder (no complete provenance.json)")
    provenance = verify_run(p) if verify else json.loads((p / PROVENANCE).read_text())
    config = None
    if (p / CONFIG).is_file():
        try:
            config = load_yaml((p / CONFIG).read_text(encoding="utf-8"))
        except (yaml.YAMLError, UnicodeDecodeError, ConfigError):
            raise DamagedRun(f"{str(p / CONFIG)!r} is damaged: it is not valid YAML.") from None
        if config is not None and not isinstance(config, dict):
            raise DamagedRun(f"{str(p / CONFIG)!r} is damaged: it is not a mapping of config fields.")
    try:
        ds = xr.open_zarr(p / DATASET).load()
    except Exception as e:  # zarr and numcodecs raise many types on damaged stores
        raise DamagedRun(
            f"{str(p / DATASET)!r} cannot be decoded: the dataset is damaged ({type(e).__name__}: {_short(e)})."
        ) from None
    # Heads are stored densely (A) or, for hf runs, as factors that a named reader rebuilds.
    heads = ("A",) if "heads_reader" not in ds.attrs else ()
    missing = [k for k in ("x", *heads, "token_weights", "head_weights", "time") if k not in ds.variables]
    missing += [f"attribute {k!r}" for k in ("model", "method", "dt") if k not in ds.attrs]
    if missing:
        raise DamagedRun(f"{str(p / DATASET)!r} is damaged or not an attnflow dataset: it lacks {', '.join(missing)}.")
    try:
        return dataset_to_trajectory(ds, config=config, provenance=provenance)
    except (KeyError, TypeError, ValueError) as e:
        raise DamagedRun(f"{str(p / DATASET)!r} is damaged: {_short(e)}.") from None


def _short(e: object, limit: int = 160) -> str:
    text = " ".join(str(e).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
