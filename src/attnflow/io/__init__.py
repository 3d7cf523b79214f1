"""Run folders and checkpoint files: the :class:`Trajectory` record (:mod:`.trajectory`), the saved
format (:mod:`.store`: Zarr dataset, config, provenance, atomic writes) and checkpoints
(:mod:`.checkpoint`). Nothing here draws figures."""

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
from attnflow.io.trajectory import FIGURE_WRITER, Trajectory, dataset_to_trajectory, load

__all__ = [
    "CONFIG",
    "DATASET",
    "FIGURES",
    "FIGURE_WRITER",
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
    "trajectory_to_dataset",
    "write_dataset",
]
