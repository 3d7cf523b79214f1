"""What every saved variable means: ``long_name``, ``units`` and ``description`` attributes (CF
conventions where they fit; the model is dimensionless, so ``units`` is ``"1"`` throughout).

Descriptions live in one place each: the diagnostics' in
:data:`attnflow.analysis.diagnostics.DIAGNOSTICS`, the EDI per-step series' in
:data:`attnflow.analysis.edi.STEP_SERIES`, the rest of a run dataset's here
(:data:`RUN_VARIABLES`). :func:`describe` writes them onto a dataset; :func:`missing_attrs` lists
what is still bare (the test of every dataset attnflow writes uses it).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from attnflow.core.descriptions import DIAGNOSTICS, STEP_SERIES
from attnflow.core.descriptions import INTEGER_DIAGNOSTICS as _INTEGER_DIAGNOSTICS

#: The attributes each variable and coordinate carries.
REQUIRED_ATTRS = ("long_name", "units", "description")

#: Short names (``long_name``) of the diagnostics; their descriptions are ``DIAGNOSTICS``'.
_DIAGNOSTIC_NAMES: dict[str, str] = {
    "energy": "interaction energy F",
    "log_abs_energy": "log |F|",
    "slope": "metric slope |dF|",
    "metric_speed": "metric speed |mu'|",
    "mobility_min": "smallest mobility min b",
    "mobility_max": "largest mobility max b",
    "order_parameter": "order parameter |sum a_i x_i|",
    "clusters": "number of clusters",
    "min_inner": "smallest inner product min <x_i, x_j>",
    "mean_inner": "mean inner product <x_i, x_j>",
}

#: Short names of the EDI per-step series; their descriptions are ``STEP_SERIES``'.
_STEP_NAMES: dict[str, str] = {
    "step_time": "time at the end of the step",
    "step_energy_change": "energy change over the step",
    "step_weight_work": "work of the weights over the step",
    "step_speed_action": "speed action over the step",
    "step_slope_action": "slope action over the step",
}

#: name -> (long_name, units, description) of a run dataset's other variables and coordinates.
RUN_VARIABLES: dict[str, tuple[str, str, str]] = {
    "time": ("time t", "1", "time t of the flow (dimensionless model time; saved times)"),
    "token": ("token index i", "1", "index i = 0..N-1 of the token x_i"),
    "dim": ("coordinate index", "1", "coordinate 0..d-1 of R^d"),
    "head": ("head index h", "1", "index h = 0..H-1 of the attention head"),
    "row": ("matrix row", "1", "row index of a d x d head matrix"),
    "col": ("matrix column", "1", "column index of a d x d head matrix"),
    "step": ("step index k", "1", "integrator step k = 0..n-1, from t_k to t_{k+1}"),
    "x": ("token position x_i(t)", "1", "position of token i on the unit sphere S^{d-1} at time t"),
    "A": ("interaction matrix A_h(t)", "1", "A_h = Q_h^T K_h of head h at time t (temperature folded in)"),
    "V": ("value matrix V_h(t)", "1", "value matrix V_h of head h at time t (absent when V_h = A_h throughout)"),
    "token_weights": ("token mass a_i", "1", "mass a_i of token i (sum_i a_i = 1)"),
    "head_weights": ("head weight w_h", "1", "weight w_h of head h in the multi-head sum (sum_h w_h = 1)"),
    **{k: (_DIAGNOSTIC_NAMES.get(k, k), "1", v) for k, v in DIAGNOSTICS.items()},
    **{k: (_STEP_NAMES.get(k, k), "1", v) for k, v in STEP_SERIES.items()},
}

#: Diagnostics that count things: stored as integers (defined beside the diagnostics, re-exported here).
INTEGER_DIAGNOSTICS = _INTEGER_DIAGNOSTICS


def describe(ds: Any, table: Mapping[str, tuple[str, str, str]]) -> Any:
    """Set ``long_name``, ``units`` and ``description`` on every variable and coordinate of the
    xarray dataset ``ds`` that ``table`` names (in place; returns ``ds``)."""
    for name in ds.variables:
        if name in table:
            long_name, units, description = table[name]
            ds[name].attrs.update(long_name=long_name, units=units, description=description)
    return ds


def missing_attrs(ds: Any) -> list[str]:
    """Variables and coordinates of ``ds`` lacking one of :data:`REQUIRED_ATTRS` (empty: all described)."""
    return [str(n) for n in ds.variables if any(not ds[n].attrs.get(a) for a in REQUIRED_ATTRS)]


#: name -> (long_name, units, description) of the sweep tables' own columns.
SWEEP_COLUMNS: dict[str, tuple[str, str, str]] = {
    "t": RUN_VARIABLES["time"],
    "point": ("sweep point id", "1", "id of the sweep point (its record is points/<id>.json)"),
    "index": ("point index", "1", "position of the point in the sweep's grid order"),
    "seed": ("seed", "1", "seed of the point's run"),
    "status": ("status", "1", "ok, failed or pending"),
    "error": ("error", "1", "the error message of a failed point"),
    "wall_s": ("wall time", "s", "wall-clock seconds the point took"),
    "trajectory": ("run folder", "1", "the point's run folder (keep_trajectories: true)"),
    "slope_floor": (
        "slope floor",
        "1",
        "late-time average of |dF|^2 (the late window, by default the last half of the run)",
    ),
    "t_cluster": ("time to clustering", "1", "first saved time from which the cluster count stays at its final value"),
    "t_end": ("final time", "1", "last saved time of the run"),
}


def column_attrs(columns: Sequence[str], parameters: Sequence[str] = ()) -> dict[str, dict[str, str]]:
    """``{column: {long_name, units, description}}`` for a sweep table: diagnostics and ``t`` from
    :data:`RUN_VARIABLES`, ``<diagnostic>_end`` / ``_mean`` summaries, swept ``parameters`` and the
    bookkeeping columns of :data:`SWEEP_COLUMNS`."""
    out: dict[str, dict[str, str]] = {}
    for c in columns:
        base = c.rsplit("_", 1)[0]
        if c in SWEEP_COLUMNS or c in RUN_VARIABLES:
            long_name, units, description = SWEEP_COLUMNS.get(c) or RUN_VARIABLES[c]
        elif c in parameters:
            long_name, units, description = c, "1", f"swept parameter {c} of the run config"
        elif base in DIAGNOSTICS and c.endswith("_end"):
            long_name, units, description = f"final {_DIAGNOSTIC_NAMES[base]}", "1", f"{DIAGNOSTICS[base]} at t_end"
        elif base in DIAGNOSTICS and c.endswith("_mean"):
            long_name, units = f"late mean {_DIAGNOSTIC_NAMES[base]}", "1"
            description = (
                f"{DIAGNOSTICS[base]}, time average over the late window (by default the last half of the run)"
            )
        else:
            continue
        out[c] = {"long_name": long_name, "units": units, "description": description}
    return out


def jsonable_attr(value: Any) -> Any:
    """A value safe for Zarr and netCDF attributes: numbers and strings stay, the rest as JSON text."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, (int, float, str)):
        return value
    return json.dumps(value, default=str, sort_keys=True)
