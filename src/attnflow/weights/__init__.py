"""Weight processes ``Theta_t`` (docs/model.md, "Weight processes"): constant, layers, Ornstein-Uhlenbeck,
oscillating, sampled arrays and callables. ``af.weights.OrnsteinUhlenbeck`` and friends live in
:mod:`attnflow.weights.processes`."""

from attnflow.weights.processes import (
    Constant,
    FromCallable,
    Layers,
    OrnsteinUhlenbeck,
    Oscillating,
    OUSampler,
    Rotated,
    Sampled,
    ValueRule,
    WeightProcess,
    WeightSampler,
    as_process,
    plane_rotation,
)

__all__ = [
    "Constant",
    "FromCallable",
    "Layers",
    "OUSampler",
    "Oscillating",
    "OrnsteinUhlenbeck",
    "Rotated",
    "Sampled",
    "ValueRule",
    "WeightProcess",
    "WeightSampler",
    "as_process",
    "plane_rotation",
]
