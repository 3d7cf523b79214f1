"""The folder of ``attnflow hf run``: a normal run folder plus the comparison with the real model."""

from __future__ import annotations

from pathlib import Path

from attnflow.hf.flow import COMPARISON, Comparison
from attnflow.hf.plot import plot_comparison
from attnflow.io.store import FIGURES, save_run, write_dataset
from attnflow.io.trajectory import Trajectory
from attnflow.viz.plotting import plot_run


def save_hf_run(
    traj: Trajectory, cmp: Comparison, path: str | Path, *, overwrite: bool = False, figures: bool = True
) -> Path:
    """A normal run folder plus ``hf_comparison.zarr`` and ``figures/hf_comparison.png``, written atomically."""

    def extra(folder: Path) -> None:
        write_dataset(cmp.to_xarray(), folder / COMPARISON)
        if figures:
            plot_run(traj, folder / FIGURES)
            plot_comparison(cmp, folder / FIGURES / "hf_comparison.png")

    return save_run(traj, path, overwrite=overwrite, extra=extra)
