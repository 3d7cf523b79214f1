"""The three dynamics and the gradient-flow quantities (docs/model.md): :mod:`.fields` owns ``v``, ``F``,
``b``, ``|dF|`` and the metric speed; :mod:`.lipschitz` bounds the field's Lipschitz constant;
:mod:`.infinite` is the ``H = inf`` limit with Gaussian head laws."""

from attnflow.dynamics.fields import (
    MODELS,
    FieldStats,
    energy,
    log_energy,
    log_mobility,
    log_slope,
    metric_speed,
    mobility,
    slope,
    velocity,
)
from attnflow.dynamics.infinite import GaussianHeads, GaussianOU, GaussianStatic

__all__ = [
    "MODELS",
    "FieldStats",
    "GaussianHeads",
    "GaussianOU",
    "GaussianStatic",
    "energy",
    "log_energy",
    "log_mobility",
    "log_slope",
    "metric_speed",
    "mobility",
    "slope",
    "velocity",
]
