"""attnflow: transformers as time-dependent Wasserstein gradient flows of tokens on the sphere.

The mathematics is written out in ``docs/model.md``. The package is a pipeline, one subpackage a
stage, each importing only the ones below it (``pyproject.toml``, ``[tool.importlinter]``)::

    core -> weights -> kernels -> dynamics -> schemes -> config -> verdicts -> analysis -> io
         -> solve -> pde -> viz -> runs -> sweep -> experiments | hf | bench -> cli

The public API, re-exported here and loaded on first use (``import attnflow`` itself is cheap):

* :class:`AttnflowError`, the root of every exception attnflow raises on purpose;
* fields: :func:`velocity`, :func:`energy`, :func:`log_energy`, :func:`mobility`,
  :func:`log_mobility`, :func:`slope`, :func:`log_slope`, :func:`metric_speed`; heads :class:`Heads`;
* weight processes in :mod:`attnflow.weights`; initial tokens in :mod:`attnflow.core.tokens` (also ``attnflow.tokens``);
* :func:`simulate` -> :class:`Trajectory`; :func:`load` reads a saved run folder;
* gradient-flow toolkit: :func:`edi_budget`, :func:`jko_step`, :func:`wasserstein_sphere`,
  :func:`weighted_wasserstein_bounds`, :func:`weighted_wasserstein`, :func:`weight_path_length`,
  :func:`stationarity`, :func:`classify_stationary`, infinite heads :class:`GaussianHeads`, :class:`GaussianStatic`,
  :class:`GaussianOU`;
* the mean-field limit: :func:`solve_pde` (the Transformer PDE), :func:`linear_growth_rates` (the
  uniform state's stability), :func:`meanfield_convergence` (particles -> PDE distances).

Modules live at their place in the tree (``attnflow.dynamics.fields``, ``attnflow.solve.simulation``);
the flat paths of an unreleased earlier layout (``attnflow.fields``) do not exist, and
``import attnflow.simulate`` is an ``ImportError`` (``attnflow.simulate`` is the function).
"""

from __future__ import annotations

import os as _os
from pathlib import Path as _Path
from typing import TYPE_CHECKING as _TYPE_CHECKING

from attnflow._version import __version__
from attnflow.core.lazy import lazy_exports as _lazy_exports
from attnflow.core.records import provide_format as _provide_format

#: Public name -> the module that defines it (imported when the name is first used).
_EXPORTS: dict[str, str] = {
    **dict.fromkeys(
        ["velocity", "energy", "log_energy", "mobility", "log_mobility", "slope", "log_slope", "metric_speed"],
        "attnflow.dynamics.fields",
    ),
    "Heads": "attnflow.core.heads",
    "AttnflowError": "attnflow.core.errors",
    "INTEGRATORS": "attnflow.schemes.integrators",
    "simulate": "attnflow.solve.simulation",
    "Trajectory": "attnflow.core.trajectory",
    "load": "attnflow.io.trajectory",
    "edi_budget": "attnflow.analysis.edi",
    "EDIBudget": "attnflow.analysis.edi",
    "jko_step": "attnflow.schemes.jko",
    "JKOResult": "attnflow.schemes.jko",
    **dict.fromkeys(
        ["wasserstein_sphere", "weighted_wasserstein_bounds", "weighted_wasserstein", "DistanceResult"],
        "attnflow.analysis.distances",
    ),
    **dict.fromkeys(["weight_path_length", "PathLength", "stationarity", "Stationarity"], "attnflow.analysis.limits"),
    **dict.fromkeys(["classify_stationary", "StationaryPoint"], "attnflow.analysis.stationary"),
    **dict.fromkeys(["GaussianHeads", "GaussianStatic", "GaussianOU"], "attnflow.dynamics.infinite"),
    **dict.fromkeys(["load_heads", "to_gradient_flow"], "attnflow.hf"),
    **dict.fromkeys(["SweepSpec", "load_sweep", "sweep_points"], "attnflow.sweep.spec"),
    **dict.fromkeys(["SweepReport", "run_sweep"], "attnflow.sweep.runner"),
    "load_sweep_results": "attnflow.sweep.table",
    **dict.fromkeys(["PhaseDiagram", "phase_diagram", "plot_phase_diagram"], "attnflow.sweep.phase"),
    **dict.fromkeys(["Checkpoint", "Checkpointer", "load_checkpoint", "save_checkpoint"], "attnflow.io.checkpoint"),
    **dict.fromkeys(
        ["NumericalInstability", "PrecisionWarning", "StabilityWarning", "stability_estimate"], "attnflow.solve.guards"
    ),
    **dict.fromkeys(["run_to_folder", "resume_folder", "folder_status"], "attnflow.runs.runner"),
    "write_report": "attnflow.viz.report",
    "render_movie": "attnflow.viz.movie",
    "BACKENDS": "attnflow.kernels.dispatch",
    **dict.fromkeys(["Ensemble", "simulate_ensemble"], "attnflow.solve.ensemble"),
    **dict.fromkeys(["FastSumResult", "fast_stats", "fast_attention_stats"], "attnflow.kernels.fastsum"),
    **dict.fromkeys(["solve_pde", "PDESolution", "ResolutionExceeded"], "attnflow.pde.solver"),
    **dict.fromkeys(["linear_growth_rates", "GrowthRates"], "attnflow.pde.growth"),
    **dict.fromkeys(["meanfield_convergence", "MeanFieldConvergence", "mmd_sphere"], "attnflow.pde.meanfield"),
}

#: Public submodules reachable as attributes (``af.weights``, ``af.tokens``, ``af.heads``, ``af.hf``).
_SUBMODULES: dict[str, str] = {
    "tokens": "attnflow.core.tokens",
    "heads": "attnflow.core.heads",
    "weights": "attnflow.weights",
    "hf": "attnflow.hf",
}

__all__ = [
    "__version__",
    "AttnflowError",
    "tokens",
    "heads",
    "weights",
    "hf",
    "velocity",
    "energy",
    "log_energy",
    "mobility",
    "log_mobility",
    "slope",
    "log_slope",
    "metric_speed",
    "Heads",
    "INTEGRATORS",
    "simulate",
    "Trajectory",
    "load",
    "edi_budget",
    "EDIBudget",
    "jko_step",
    "JKOResult",
    "wasserstein_sphere",
    "weighted_wasserstein_bounds",
    "weighted_wasserstein",
    "DistanceResult",
    "weight_path_length",
    "PathLength",
    "stationarity",
    "Stationarity",
    "classify_stationary",
    "StationaryPoint",
    "GaussianHeads",
    "GaussianStatic",
    "GaussianOU",
    "load_heads",
    "to_gradient_flow",
    "SweepSpec",
    "load_sweep",
    "sweep_points",
    "SweepReport",
    "run_sweep",
    "load_sweep_results",
    "PhaseDiagram",
    "phase_diagram",
    "plot_phase_diagram",
    "Checkpoint",
    "Checkpointer",
    "load_checkpoint",
    "save_checkpoint",
    "NumericalInstability",
    "PrecisionWarning",
    "StabilityWarning",
    "stability_estimate",
    "run_to_folder",
    "resume_folder",
    "folder_status",
    "write_report",
    "render_movie",
    "BACKENDS",
    "Ensemble",
    "simulate_ensemble",
    "FastSumResult",
    "fast_stats",
    "fast_attention_stats",
    "solve_pde",
    "PDESolution",
    "ResolutionExceeded",
    "linear_growth_rates",
    "GrowthRates",
    "meanfield_convergence",
    "MeanFieldConvergence",
    "mmd_sphere",
]


# dir() lists the public names (what ``__all__`` lists), not the loader's helpers.
__getattr__, __dir__ = _lazy_exports(__name__, _EXPORTS, __all__, _SUBMODULES)


class _RecordFormat:
    """The :class:`Trajectory` record's conveniences that need the layers above it
    (:class:`attnflow.core.records.RecordFormat`). The package root sits above every stage, so it
    provides them here, importing each layer only when a convenience is used."""

    def spec(self, raw: dict) -> object:
        from attnflow.config.spec import RunSpec

        return RunSpec.from_dict(raw)

    def to_xarray(self, traj: Trajectory) -> object:
        from attnflow.io.store import trajectory_to_dataset

        return trajectory_to_dataset(traj)

    def save(self, traj: Trajectory, path: str | _os.PathLike, *, overwrite: bool, figures: bool) -> _Path:
        from attnflow.io.trajectory import save_trajectory

        if not figures:
            return save_trajectory(traj, path, overwrite=overwrite)
        from attnflow.viz.plotting import plot_run

        return save_trajectory(traj, path, overwrite=overwrite, figures=plot_run)


_provide_format(_RecordFormat())


if _TYPE_CHECKING:  # what type checkers and IDEs see: the same names, imported eagerly
    from attnflow import hf, weights
    from attnflow.analysis.distances import (
        DistanceResult,
        wasserstein_sphere,
        weighted_wasserstein,
        weighted_wasserstein_bounds,
    )
    from attnflow.analysis.edi import EDIBudget, edi_budget
    from attnflow.analysis.limits import PathLength, Stationarity, stationarity, weight_path_length
    from attnflow.analysis.stationary import StationaryPoint, classify_stationary
    from attnflow.core import heads, tokens
    from attnflow.core.errors import AttnflowError
    from attnflow.core.heads import Heads
    from attnflow.core.trajectory import Trajectory
    from attnflow.dynamics.fields import (
        energy,
        log_energy,
        log_mobility,
        log_slope,
        metric_speed,
        mobility,
        slope,
        velocity,
    )
    from attnflow.dynamics.infinite import GaussianHeads, GaussianOU, GaussianStatic
    from attnflow.hf import load_heads, to_gradient_flow
    from attnflow.io.checkpoint import Checkpoint, Checkpointer, load_checkpoint, save_checkpoint
    from attnflow.io.trajectory import load
    from attnflow.kernels.dispatch import BACKENDS
    from attnflow.kernels.fastsum import FastSumResult, fast_attention_stats, fast_stats
    from attnflow.pde.growth import GrowthRates, linear_growth_rates
    from attnflow.pde.meanfield import MeanFieldConvergence, meanfield_convergence, mmd_sphere
    from attnflow.pde.solver import PDESolution, ResolutionExceeded, solve_pde
    from attnflow.runs.runner import folder_status, resume_folder, run_to_folder
    from attnflow.schemes.integrators import INTEGRATORS
    from attnflow.schemes.jko import JKOResult, jko_step
    from attnflow.solve.ensemble import Ensemble, simulate_ensemble
    from attnflow.solve.guards import NumericalInstability, PrecisionWarning, StabilityWarning, stability_estimate
    from attnflow.solve.simulation import simulate
    from attnflow.sweep.phase import PhaseDiagram, phase_diagram, plot_phase_diagram
    from attnflow.sweep.runner import SweepReport, run_sweep
    from attnflow.sweep.spec import SweepSpec, load_sweep, sweep_points
    from attnflow.sweep.table import load_sweep_results
    from attnflow.viz.movie import render_movie
    from attnflow.viz.report import write_report
