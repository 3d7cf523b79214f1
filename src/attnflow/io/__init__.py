"""Run folders and checkpoint files: the disk format of the :class:`Trajectory` record
(:mod:`.trajectory`; the record itself is :mod:`attnflow.core.trajectory`), the saved format (:mod:`.store`: Zarr dataset, config, provenance, atomic writes) and checkpoints
(:mod:`.checkpoint`). Nothing here draws figures.

Loaded on first use (PEP 562): checking a folder (:mod:`.safety`, :mod:`.store`'s folder checks,
:mod:`.lock`) imports neither torch nor xarray; reading a dataset loads xarray then.
"""

from __future__ import annotations

from typing import TYPE_CHECKING as _TYPE_CHECKING

from attnflow.core.lazy import lazy_exports as _lazy_exports

#: Public name -> the module of this package that defines it.
_EXPORTS: dict[str, str] = {
    **dict.fromkeys(["Checkpoint", "Checkpointer", "load_checkpoint", "save_checkpoint"], "attnflow.io.checkpoint"),
    **dict.fromkeys(
        [
            "CONFIG",
            "DATASET",
            "FIGURES",
            "PROVENANCE",
            "atomic_folder",
            "git_commit",
            "is_complete",
            "provenance_record",
            "save_run",
            "trajectory_to_dataset",
            "write_dataset",
        ],
        "attnflow.io.store",
    ),
    **dict.fromkeys(["Trajectory", "dataset_to_trajectory", "load", "save_trajectory"], "attnflow.io.trajectory"),
}

__all__ = [
    "CONFIG",
    "DATASET",
    "FIGURES",
    "PROVENANCE",
    "Checkpoint",
    "Checkpointer",
    "Trajectory",
    "atomic_folder",
    "dataset_to_trajectory",
    "git_commit",
    "is_complete",
    "load",
    "load_checkpoint",
    "provenance_record",
    "save_checkpoint",
    "save_run",
    "save_trajectory",
    "trajectory_to_dataset",
    "write_dataset",
]


__getattr__, __dir__ = _lazy_exports(__name__, _EXPORTS, __all__)


if _TYPE_CHECKING:
    from attnflow.io.checkpoint import Checkpoint, Checkpointer, load_checkpoint, save_checkpoint
    from attnflow.io.store import (
        CONFIG,
        DATASET,
        FIGURES,
        PROVENANCE,
        atomic_folder,
        git_commit,
        is_complete,
        provenance_record,
        save_run,
        trajectory_to_dataset,
        write_dataset,
    )
    from attnflow.io.trajectory import Trajectory, dataset_to_trajectory, load, save_trajectory
