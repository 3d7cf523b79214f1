"""The former home of ``ou`` and ``oscillating`` (2,355 lines until issue 42), now split; every public name
it had stays importable from here:

* :mod:`attnflow.experiments.ou` and :mod:`attnflow.experiments.oscillating`: the two experiments;
* :mod:`attnflow.experiments.relax_runs`: their parameters, shared runs, continuations and settling;
* :mod:`attnflow.experiments.settle_row`: ``ou``'s sequential row #2 and its turned control;
* :mod:`attnflow.experiments.relax_figures`: their figures;
* :mod:`attnflow.analysis.relaxation` (relaxation modes, windows, settling), :mod:`attnflow.analysis.following`
  (the floor and following scales, rest distance), :mod:`attnflow.analysis.laws` (Bures-Wasserstein, the
  law's path length) and :mod:`attnflow.analysis.lockin` (the lock-in fit and its decisions): the pure analysis.

Nothing in the package imports this module.
"""

from __future__ import annotations

from attnflow.analysis.following import FollowingScale, floor_scale, following_scale, rest_distance, stationary_draws
from attnflow.analysis.laws import bures_wasserstein, law_path_length
from attnflow.analysis.lockin import (
    LOCKIN_MAX_PERIODS,
    LOCKIN_PERIODS,
    LOCKIN_Z,
    lockin_decides,
    lockin_margins,
    lockin_scales,
    position_decides,
    position_margins,
    sequential_lockin,
)
from attnflow.analysis.relaxation import (
    ANTIPODAL_TOL,
    SETTLED_FRACTION,
    WANDER_FACTOR,
    ClusterModes,
    PairModes,
    Settling,
    cluster_modes,
    pair_modes,
    settling,
    settling_window,
    slow_rate,
    transient_window,
)
from attnflow.experiments.oscillating import (
    CONVERGED_FRACTION,
    LINEAR_RANGE,
    ROUGH_EXPONENT,
    ROUGH_STEPS,
    experiment_oscillating,
    finite_h_path_length,
    lockin_pair,
)
from attnflow.experiments.ou import POSITION_CONTROL_TAUS, experiment_ou
from attnflow.experiments.relax_runs import (
    FLOOR_DRAWS,
    FLOOR_FACTOR,
    HYPOTHESES,
    RUNS_NOTE,
    WANDER_REPLICAS,
    LawParams,
    RelaxationParams,
    RelaxHeads,
    RelaxIntegration,
    RelaxOU,
    RelaxTokens,
    RunLength,
    build,
    default_config,
    default_params,
    run_window,
    wander_scale,
)
from attnflow.experiments.settle_row import (
    CONTROL_TURN_FRACTION,
    SETTLE_CAP_FACTOR,
    SETTLE_CONTINUATIONS,
    SettleStage,
    control_plane,
    control_process,
    control_turn,
    settle_row,
)

__all__ = [
    "ANTIPODAL_TOL",
    "CONTROL_TURN_FRACTION",
    "CONVERGED_FRACTION",
    "FLOOR_DRAWS",
    "FLOOR_FACTOR",
    "HYPOTHESES",
    "LINEAR_RANGE",
    "LOCKIN_MAX_PERIODS",
    "LOCKIN_PERIODS",
    "LOCKIN_Z",
    "POSITION_CONTROL_TAUS",
    "ROUGH_EXPONENT",
    "ROUGH_STEPS",
    "RUNS_NOTE",
    "SETTLED_FRACTION",
    "SETTLE_CAP_FACTOR",
    "SETTLE_CONTINUATIONS",
    "WANDER_FACTOR",
    "WANDER_REPLICAS",
    "ClusterModes",
    "FollowingScale",
    "LawParams",
    "PairModes",
    "RelaxHeads",
    "RelaxIntegration",
    "RelaxOU",
    "RelaxTokens",
    "RelaxationParams",
    "RunLength",
    "SettleStage",
    "Settling",
    "build",
    "bures_wasserstein",
    "cluster_modes",
    "control_plane",
    "control_process",
    "control_turn",
    "default_config",
    "default_params",
    "experiment_oscillating",
    "experiment_ou",
    "finite_h_path_length",
    "floor_scale",
    "following_scale",
    "law_path_length",
    "lockin_decides",
    "lockin_margins",
    "lockin_pair",
    "lockin_scales",
    "pair_modes",
    "position_decides",
    "position_margins",
    "rest_distance",
    "run_window",
    "sequential_lockin",
    "settle_row",
    "settling",
    "settling_window",
    "slow_rate",
    "stationary_draws",
    "transient_window",
    "wander_scale",
]
