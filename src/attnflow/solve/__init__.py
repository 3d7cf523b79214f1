"""The simulation: :func:`simulate` (a thin wrapper), the composable :func:`solve` (a
:class:`Problem`, a stepper, a step controller, what to save) and its one loop
(:func:`attnflow.solve.loop.integrate`), ensembles of runs at once (:mod:`.ensemble`) and the
numerical guards (:mod:`.guards`)."""

from attnflow.solve.controllers import ConstantStep, PIController
from attnflow.solve.ensemble import Ensemble, simulate_ensemble
from attnflow.solve.guards import NumericalInstability, PrecisionWarning, StabilityWarning, stability_estimate
from attnflow.solve.problem import Problem
from attnflow.solve.saveat import SaveAt
from attnflow.solve.simulation import simulate
from attnflow.solve.solver import solve, stepper

__all__ = [
    "ConstantStep",
    "Ensemble",
    "NumericalInstability",
    "PIController",
    "PrecisionWarning",
    "Problem",
    "SaveAt",
    "StabilityWarning",
    "simulate",
    "simulate_ensemble",
    "solve",
    "stability_estimate",
    "stepper",
]
