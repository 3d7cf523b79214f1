"""Time-stepping schemes on the sphere: explicit Runge-Kutta steppers with the retraction
(:mod:`.integrators`) and JKO minimising movements (:mod:`.jko`)."""

from attnflow.schemes.integrators import ADAPTIVE, INTEGRATORS, MOVEMENTS, EmbeddedPair, Integrator, get_integrator
from attnflow.schemes.jko import JKOResult, jko_step

__all__ = [
    "ADAPTIVE",
    "EmbeddedPair",
    "INTEGRATORS",
    "MOVEMENTS",
    "Integrator",
    "JKOResult",
    "get_integrator",
    "jko_step",
]
