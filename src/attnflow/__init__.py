"""attnflow: transformers as time-dependent Wasserstein gradient flows of tokens on the sphere.

The public API (see ``../shared/MODEL.md`` for the mathematics):

* fields: :func:`velocity`, :func:`energy`, :func:`log_energy`, :func:`mobility`,
  :func:`log_mobility`, :func:`slope`, :func:`log_slope`, :func:`metric_speed`; heads :class:`Heads`;
* weight processes in :mod:`attnflow.weights`; initial tokens in :mod:`attnflow.tokens`;
* :func:`simulate` -> :class:`Trajectory`; :func:`load` reads a saved run folder.
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
    "write_report",
    "render_movie",
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
