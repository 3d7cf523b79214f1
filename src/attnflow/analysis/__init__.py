"""What is measured on states and trajectories: diagnostics and clusters (:mod:`.diagnostics`), the
energy-dissipation budget (:mod:`.edi`), limits and stationarity (:mod:`.limits`), Wasserstein
distances (:mod:`.distances`), stationary points classified (:mod:`.stationary`), metastable
plateaus (:mod:`.metastability`), relaxation modes, windows and settling (:mod:`.relaxation`), the floor and
following slope scales (:mod:`.following`), a weight law's path length (:mod:`.laws`) and lock-in fits at a known
frequency (:mod:`.lockin`).

Loaded on first use (PEP 562), so that the torch-free parts (the budget of a saved run,
:mod:`.budget`; the grid cluster labels, :mod:`.grid`) can be read without torch (issue 43:
``attnflow report`` of a finished run).
"""

from __future__ import annotations

from typing import TYPE_CHECKING as _TYPE_CHECKING

from attnflow.core.lazy import lazy_exports as _lazy_exports

_EXPORTS: dict[str, str] = {
    **dict.fromkeys(["DIAGNOSTICS", "count_clusters", "state_diagnostics"], "attnflow.analysis.diagnostics"),
    **dict.fromkeys(
        ["DistanceResult", "wasserstein_sphere", "weighted_wasserstein", "weighted_wasserstein_bounds"],
        "attnflow.analysis.distances",
    ),
    **dict.fromkeys(["EDIBudget", "edi_budget"], "attnflow.analysis.budget"),
    **dict.fromkeys(["PathLength", "Stationarity", "stationarity", "weight_path_length"], "attnflow.analysis.limits"),
}

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


__getattr__, __dir__ = _lazy_exports(__name__, _EXPORTS, __all__)


if _TYPE_CHECKING:
    from attnflow.analysis.budget import EDIBudget, edi_budget
    from attnflow.analysis.diagnostics import DIAGNOSTICS, count_clusters, state_diagnostics
    from attnflow.analysis.distances import (
        DistanceResult,
        wasserstein_sphere,
        weighted_wasserstein,
        weighted_wasserstein_bounds,
    )
    from attnflow.analysis.limits import PathLength, Stationarity, stationarity, weight_path_length
