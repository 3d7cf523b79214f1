"""The simulation: :func:`simulate` (a stepping loop with observers), ensembles of runs at once
(:mod:`.ensemble`) and the numerical guards (:mod:`.guards`)."""

from attnflow.solve.ensemble import Ensemble, simulate_ensemble
from attnflow.solve.guards import NumericalInstability, PrecisionWarning, StabilityWarning, stability_estimate
from attnflow.solve.simulation import simulate

__all__ = [
    "Ensemble",
    "NumericalInstability",
    "PrecisionWarning",
    "StabilityWarning",
    "simulate",
    "simulate_ensemble",
    "stability_estimate",
]
