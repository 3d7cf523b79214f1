"""The lock-in fit's former home: :mod:`attnflow.analysis.lockin` holds it since issue 42 (these names stay
importable from here)."""

from __future__ import annotations

from attnflow.analysis.lockin import MIN_PERIODS, LockIn, design, lockin_fit

__all__ = ["MIN_PERIODS", "LockIn", "design", "lockin_fit"]
