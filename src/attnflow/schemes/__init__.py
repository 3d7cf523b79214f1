"""Time-stepping schemes on the sphere: explicit Runge-Kutta steppers with the retraction
(:mod:`.integrators`) and JKO minimising movements (:mod:`.jko`); the bare method names in
:mod:`.names` (no torch: the config schema reads them).

Loaded on first use (PEP 562), so that ``attnflow.schemes.names`` stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING as _TYPE_CHECKING

from attnflow.core.lazy import lazy_exports as _lazy_exports

_EXPORTS: dict[str, str] = {
    **dict.fromkeys(
        ["ADAPTIVE", "EmbeddedPair", "INTEGRATORS", "MOVEMENTS", "Integrator", "get_integrator"],
        "attnflow.schemes.integrators",
    ),
    **dict.fromkeys(["JKOResult", "jko_step"], "attnflow.schemes.jko"),
}

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


__getattr__, __dir__ = _lazy_exports(__name__, _EXPORTS, __all__)


if _TYPE_CHECKING:
    from attnflow.schemes.integrators import (
        ADAPTIVE,
        INTEGRATORS,
        MOVEMENTS,
        EmbeddedPair,
        Integrator,
        get_integrator,
    )
    from attnflow.schemes.jko import JKOResult, jko_step
