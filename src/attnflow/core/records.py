"""What the layers above provide for the :class:`~attnflow.core.trajectory.Trajectory` record
(``traj`` below; typed ``Any`` here because the record's module imports this one).

The record sits in the ground layer so that every stage can name it; its documented conveniences
``traj.spec`` (the typed :class:`~attnflow.config.spec.RunSpec`), ``traj.to_xarray()`` and
``traj.save(path, figures=True)`` need the config, the disk format (:mod:`attnflow.io`) and the
figures (:mod:`attnflow.viz`), which sit above it. The record therefore declares what it needs
(:class:`RecordFormat`) and the package root, which sits above every stage, provides it once at
import (``attnflow/__init__.py``): no stage imports upward and no code is named by a string.

Standard library only: ``import attnflow`` loads this module and stays cheap.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Protocol

__all__ = ["RecordFormat", "provide_format", "record_format"]


class RecordFormat(Protocol):
    """The record's conveniences that live above it: the typed spec, the dataset, the run folder."""

    def spec(self, raw: dict[str, Any]) -> Any:
        """The :class:`~attnflow.config.spec.RunSpec` of a recorded ``provenance["spec"]``."""
        ...

    def to_xarray(self, traj: Any) -> Any:
        """The ``xarray.Dataset`` of ``traj`` (:func:`attnflow.io.store.trajectory_to_dataset`)."""
        ...

    def save(self, traj: Any, path: str | os.PathLike, *, overwrite: bool, figures: bool) -> Path:
        """Write ``traj`` as a run folder (:func:`attnflow.io.trajectory.save_trajectory`), with the
        run's figures when ``figures``."""
        ...


_FORMAT: list[RecordFormat] = []


def provide_format(fmt: RecordFormat) -> None:
    """Install the provider of the record's conveniences (the package root does, once, at import)."""
    _FORMAT[:] = [fmt]


def record_format() -> RecordFormat:
    """The installed :class:`RecordFormat` (always there: ``attnflow/__init__.py`` runs first)."""
    if not _FORMAT:  # only if someone removed it: the package root installs it before any submodule runs
        raise RuntimeError("no record format is installed; import attnflow installs it")
    return _FORMAT[0]
