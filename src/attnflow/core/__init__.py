"""The ground layer: the sphere's geometry (once), heads, initial tokens, array plumbing, and the
shared errors, warnings and thread policy.

Loaded on first use (PEP 562): ``attnflow.core.errors`` and ``attnflow.core.caller`` stay light (no
numpy, no torch), so the command line can name attnflow's errors without paying for torch at start-up.
"""

from __future__ import annotations

from typing import TYPE_CHECKING as _TYPE_CHECKING

from attnflow.core.lazy import lazy_exports as _lazy_exports

#: Public name -> the module of this package that defines it.
_EXPORTS = {
    **dict.fromkeys(
        ["geodesic_distance", "geodesic_distance_sq", "project_tangent", "retract", "sphere_deviation"],
        "attnflow.core.geometry",
    ),
    "Heads": "attnflow.core.heads",
    "as_heads": "attnflow.core.heads",
}
_SUBMODULES = ("arrays", "caller", "errors", "geometry", "heads", "memory", "threads", "tokens")

__all__ = [
    "Heads",
    "arrays",
    "as_heads",
    "geodesic_distance",
    "geodesic_distance_sq",
    "geometry",
    "heads",
    "project_tangent",
    "retract",
    "sphere_deviation",
    "tokens",
]


__getattr__, __dir__ = _lazy_exports(__name__, _EXPORTS, __all__, _SUBMODULES)


if _TYPE_CHECKING:
    from attnflow.core import arrays, geometry, heads, tokens
    from attnflow.core.geometry import (
        geodesic_distance,
        geodesic_distance_sq,
        project_tangent,
        retract,
        sphere_deviation,
    )
    from attnflow.core.heads import Heads, as_heads
