"""Warnings point at the user's line (``stacklevel``), however deep inside attnflow they are raised."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from attnflow import simulate, tokens
from attnflow.core.heads import identity_heads
from attnflow.solve import guards
from attnflow.solve.guards import StabilityWarning


def _stiff_run():
    simulate(tokens.uniform(8, 3, 0), identity_heads(2, 3, 16.0), t_end=0.5, dt=0.25, method="rk4")


def test_stability_warning_points_at_the_callers_line():
    with pytest.warns(StabilityWarning) as rec:
        _stiff_run()
    assert rec[0].filename == __file__


def test_a_fixed_stacklevel_would_point_inside_the_package(monkeypatch):
    # Negative control: the former guards.warn (stacklevel=3) attributes the warning to attnflow.
    monkeypatch.setattr(guards, "warn", lambda m, c: warnings.warn(m, c, stacklevel=3))
    with pytest.warns(StabilityWarning) as rec:
        _stiff_run()
    assert rec[0].filename != __file__ and "attnflow" in rec[0].filename


def test_token_projection_warning_points_at_the_callers_line(tmp_path):
    path = tmp_path / "x.npy"
    np.save(path, 2.0 * tokens.uniform(5, 3, 1))
    with pytest.warns(UserWarning, match="projected onto the unit sphere") as rec:
        tokens.from_file(path)
    assert rec[0].filename == __file__
