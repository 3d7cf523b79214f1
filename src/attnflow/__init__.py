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
    "BACKENDS",
    "Ensemble",
    "simulate_ensemble",
    "FastSumResult",
    "fast_attention_stats",
]
