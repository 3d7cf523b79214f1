"""attnflow: transformers as time-dependent Wasserstein gradient flows of tokens on the sphere.

The public API (see ``../shared/MODEL.md`` for the mathematics):

* fields: :func:`velocity`, :func:`energy`, :func:`log_energy`, :func:`mobility`,
  :func:`log_mobility`, :func:`slope`, :func:`log_slope`, :func:`metric_speed`; heads :class:`Heads`;
* weight processes in :mod:`attnflow.weights`; initial tokens in :mod:`attnflow.tokens`;
* :func:`simulate` -> :class:`Trajectory`; :func:`load` reads a saved run folder.
* gradient-flow toolkit (``docs/gradient-flow.md``): :func:`edi_budget`, :func:`jko_step`,
  :func:`wasserstein_sphere`, :func:`weighted_wasserstein_bounds`, :func:`weighted_wasserstein`,
  :func:`weight_path_length`, :func:`stationarity`, infinite heads :class:`GaussianHeads`,
  :class:`GaussianStatic`, :class:`GaussianOU`.
"""

__version__ = "0.1.0"

from .fields import energy, log_energy, log_mobility, log_slope, metric_speed, mobility, slope, velocity  # noqa: E402
from .heads import Heads  # noqa: E402
from .integrators import INTEGRATORS  # noqa: E402
from .simulate import Trajectory, simulate  # noqa: E402
from .io import load  # noqa: E402
from . import tokens, weights  # noqa: E402
from .edi import EDIBudget, edi_budget  # noqa: E402
from .jko import JKOResult, jko_step  # noqa: E402
from .distances import DistanceResult, wasserstein_sphere, weighted_wasserstein, weighted_wasserstein_bounds  # noqa: E402
from .limits import PathLength, Stationarity, stationarity, weight_path_length  # noqa: E402
from .infinite import GaussianHeads, GaussianOU, GaussianStatic  # noqa: E402
from . import hf  # noqa: E402
from .hf import load_heads, to_gradient_flow  # noqa: E402
from .sweep_spec import SweepSpec, load_sweep, sweep_points  # noqa: E402
from .sweep import SweepReport, run_sweep  # noqa: E402
from .sweep_table import load_sweep_results  # noqa: E402
from .phase import PhaseDiagram, phase_diagram, plot_phase_diagram  # noqa: E402
from .checkpoint import Checkpoint, Checkpointer, load_checkpoint, save_checkpoint  # noqa: E402
from .guards import NumericalInstability, PrecisionWarning, StabilityWarning, stability_estimate  # noqa: E402
from .runner import folder_status, resume_folder, run_to_folder  # noqa: E402
from .backends import BACKENDS  # noqa: E402
from .ensemble import Ensemble, simulate_ensemble  # noqa: E402
from .fastsum import FastSumResult, fast_attention_stats  # noqa: E402

__all__ = [
    "__version__",
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
    "tokens",
    "weights",
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
    "GaussianHeads",
    "GaussianStatic",
    "GaussianOU",
    "hf",
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
    "fast_attention_stats",
]


def __getattr__(name: str):
    # plotly / matplotlib + ffmpeg load only when the report or the movie is asked for
    if name == "write_report":
        from .report import write_report

        return write_report
    if name == "render_movie":
        from .movie import render_movie

        return render_movie
    raise AttributeError(f"module 'attnflow' has no attribute {name!r}")
