"""The simulated flow as data: the :class:`Trajectory` record.

It sits in the ground layer so that every stage can name it (the analysis that measures it, the
solver that records it, the data layer that writes it). Its disk format stays in
:mod:`attnflow.io.trajectory` (reading, writing, ``load``), which re-exports the name; its
conveniences that need the layers above (``spec``, ``to_xarray``, ``save``) go through the
:class:`~attnflow.core.records.RecordFormat` that the package root provides.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from attnflow.core.descriptions import INTEGER_DIAGNOSTICS
from attnflow.core.records import record_format

if TYPE_CHECKING:  # torch and xarray load where a trajectory is rebuilt or read, not at import
    import xarray as xr

    from attnflow.core.heads import Heads

__all__ = ["DeferredDiagnostics", "Trajectory"]


class DeferredDiagnostics:
    """The diagnostics table of a :class:`Trajectory`, made on first use: ``make()`` returns it.

    A run whose saved states' diagnostics are made in bulk (``provenance["deferred_diagnostics"]``)
    hands this to its trajectory instead of the table, so a caller that reads only the states does
    not pay for them (issue 43: at ``N = 32`` with 301 saves, 2.7 ms of a 9.3 ms run). The numbers
    are the same whenever they are made."""

    __slots__ = ("make",)

    def __init__(self, make: Callable[[], dict[str, np.ndarray]]) -> None:
        self.make = make


@dataclass
class Trajectory:
    """A simulated token flow at its save times.

    ``t`` ``(S,)``; ``x`` ``(S, N, d)``; ``A`` and ``V`` ``(S, H, d, d)`` the heads at those times
    (``V = None`` when ``V = A`` throughout); ``diagnostics[name]`` ``(S,)`` (see
    :data:`attnflow.diagnostics.DIAGNOSTICS`); masses ``token_weights`` ``(N,)``, ``head_weights`` ``(H,)``.
    ``diagnostics`` may be given as a :class:`DeferredDiagnostics`: the table is then made when
    ``traj.diagnostics`` is first read (or the trajectory is pickled or copied).
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
        if isinstance(self.diagnostics, DeferredDiagnostics):  # made on first read (__getattr__)
            self.__dict__["_deferred_diagnostics"] = self.__dict__.pop("diagnostics")
            return
        self._whole_counts()

    def __getattr__(self, name: str) -> Any:
        # Called only for attributes not set: a deferred table is made here, once.
        deferred = self.__dict__.pop("_deferred_diagnostics", None) if name == "diagnostics" else None
        if deferred is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        self.__dict__["diagnostics"] = deferred.make()
        self._whole_counts()
        return self.__dict__["diagnostics"]

    def __getstate__(self) -> dict[str, Any]:
        """A pickled (or copied) trajectory carries its diagnostics, not the recipe for them."""
        self.diagnostics  # noqa: B018 - made here if deferred
        return self.__dict__

    def _whole_counts(self) -> None:
        # Counts (clusters) are whole numbers, as on disk: integers here too, unless a value is missing.
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
    def spec(self) -> Any:
        """The typed record of every parameter the run was made with (a :class:`~attnflow.config.spec.RunSpec`;
        annotated ``Any`` because the config layer sits above this one), ``None`` for runs that did not
        record one (made before it existed, or assembled by hand)."""
        raw = self.provenance.get("spec")
        return None if raw is None else record_format().spec(raw)

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
        import torch

        from attnflow.core.heads import Heads

        A = torch.from_numpy(self.A[k])
        return Heads(K=A, V=None if self.V is None else torch.from_numpy(self.V[k]))

    def first(self, m: int) -> Trajectory:
        """The same run restricted to its first ``m`` saved times (``t``, ``x``, ``A``, ``V`` and the
        diagnostics cut; masses, per-step series and provenance kept as they are)."""
        return dataclasses.replace(
            self,
            t=self.t[:m],
            x=self.x[:m],
            A=self.A[:m],
            V=None if self.V is None else self.V[:m],
            diagnostics={k: v[:m] for k, v in self.diagnostics.items()},
        )

    def to_xarray(self) -> xr.Dataset:
        """An ``xarray.Dataset`` with dims ``time, token, dim, head, row, col``."""
        return record_format().to_xarray(self)

    def save(self, path: str | os.PathLike, *, overwrite: bool = False, figures: bool = True) -> Path:
        """Write the run folder (Zarr dataset, config YAML, provenance and, with ``figures``, the
        figures of :func:`attnflow.viz.plotting.plot_run`) atomically."""
        return record_format().save(self, path, overwrite=overwrite, figures=figures)
