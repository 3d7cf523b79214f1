"""What is measured on states and trajectories: diagnostics and clusters (:mod:`.diagnostics`), the
energy-dissipation budget (:mod:`.edi`), limits and stationarity (:mod:`.limits`), Wasserstein
distances (:mod:`.distances`), stationary points classified (:mod:`.stationary`), metastable
plateaus (:mod:`.metastability`), relaxation modes, windows and settling (:mod:`.relaxation`), the floor and
following slope scales (:mod:`.following`), a weight law's path length (:mod:`.laws`) and lock-in fits at a known
frequency (:mod:`.lockin`)."""

from attnflow.analysis.diagnostics import DIAGNOSTICS, count_clusters, state_diagnostics
from attnflow.analysis.distances import (
    DistanceResult,
    wasserstein_sphere,
    weighted_wasserstein,
    weighted_wasserstein_bounds,
)
from attnflow.analysis.edi import EDIBudget, edi_budget
from attnflow.analysis.limits import PathLength, Stationarity, stationarity, weight_path_length

__all__ = [
    "DIAGNOSTICS",
    "DistanceResult",
    "EDIBudget",
    "PathLength",
    "Stationarity",
    "count_clusters",
    "edi_budget",
    "state_diagnostics",
    "stationarity",
    "wasserstein_sphere",
    "weight_path_length",
    "weighted_wasserstein",
    "weighted_wasserstein_bounds",
]
