"""Time-stepping schemes on the sphere: explicit Runge-Kutta steppers with the retraction
(:mod:`.integrators`) and JKO minimising movements (:mod:`.jko`); the bare method names in
:mod:`.names` (no torch: the config schema reads them).

Loaded on first use (PEP 562), so that ``attnflow.schemes.names`` stays light.
"""

from __future__ import annotations

import importlib as _importlib
from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any as _Any

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


def __getattr__(name: str) -> _Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'attnflow.schemes' has no attribute {name!r}")
    value = getattr(_importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


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
