"""Margins of a verdict in the criterion's own scale, and the smallest margin a verdict may have."""

from __future__ import annotations

#: The smallest margin a verdict may have (:attr:`Prediction.margin`): a prediction that meets its criterion
#: by less than this fraction of the criterion's own scale is a FAIL, and a control rejected by less than it
#: counts as not rejected. Stated before any run; a verdict by a hair says nothing about the physics.
MIN_MARGIN = 0.1


def margin_below(value: float, bound: float) -> float:
    """How far ``value`` is below ``bound``, in units of ``|bound|`` (negative: above it)."""
    return float((bound - value) / abs(bound)) if bound != 0 else float("nan")


def margin_above(value: float, bound: float) -> float:
    """How far ``value`` is above ``bound``, in units of ``|bound|`` (negative: below it)."""
    return -margin_below(value, bound)


def margin_inside(value: float, lo: float, hi: float) -> float:
    """How deep ``value`` lies inside ``[lo, hi]``, in units of the half-width (negative: outside)."""
    half = 0.5 * (hi - lo)
    return float(min(value - lo, hi - value) / half) if half > 0 else float("nan")
