"""The ground layer: the sphere's geometry (once), heads, initial tokens, array plumbing."""

from attnflow.core import arrays, geometry, heads, tokens
from attnflow.core.geometry import geodesic_distance, geodesic_distance_sq, project_tangent, retract, sphere_deviation
from attnflow.core.heads import Heads, as_heads

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
