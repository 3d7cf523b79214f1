"""What each saved diagnostic and EDI per-step series means, one sentence each.

Plain data with no imports, so that reading or checking a run folder (``attnflow show``, the
folder checks) names the variables without loading torch. :mod:`attnflow.analysis.diagnostics`
and :mod:`attnflow.analysis.edi` compute them and re-export these dictionaries.
"""

from __future__ import annotations

#: The per-state diagnostics a run saves, name -> definition.
DIAGNOSTICS: dict[str, str] = {
    "energy": "interaction energy F(mu, t)",
    "log_abs_energy": "log |F(mu, t)| (finite at any beta)",
    "slope": "metric slope |dF|(mu, t)",
    "metric_speed": "metric speed ||v||_mu of the simulated field",
    "mobility_min": "min_i b(x_i)",
    "mobility_max": "max_i b(x_i)",
    "order_parameter": "|sum_i a_i x_i|",
    "clusters": "connected components of the graph <x_i, x_j> > 1 - eps",
    "min_inner": "min_{i != j} <x_i, x_j>",
    "mean_inner": "mean_{i < j} <x_i, x_j>",
}

#: Diagnostics that count things: stored as integers, on disk and in a trajectory.
INTEGER_DIAGNOSTICS = ("clusters",)

#: The EDI per-step series (length = number of steps), name -> definition.
STEP_SERIES: dict[str, str] = {
    "step_time": "t_{k+1}, the end of step k",
    "step_energy_change": "F(mu_{k+1}, t_{k+1}) - F(mu_k, t_k)",
    "step_weight_work": "int_{t_k}^{t_{k+1}} dF/dr (mu_r, r) dr (quadrature or exact increment)",
    "step_speed_action": "1/2 int_{t_k}^{t_{k+1}} |mu'|^2",
    "step_slope_action": "1/2 int_{t_k}^{t_{k+1}} |dF|^2",
}
