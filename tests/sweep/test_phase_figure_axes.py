"""Phase-diagram figures (issue 31, item 11), read back from the figure's axes."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.colors import LogNorm

from attnflow.sweep.phase import PhaseDiagram, _edges, categorical_axis, phase_figure


def diagram(xs, ys, values) -> PhaseDiagram:
    values = np.asarray(values, dtype=float)
    return PhaseDiagram("heads.beta", "heads.count", "clusters", np.asarray(xs), np.asarray(ys), values,
                        np.ones(values.shape, dtype=int), {})  # fmt: skip


def test_small_integer_axis_is_categorical() -> None:
    fig = phase_figure(diagram([0.5, 1.0, 2.0], [1, 8], [[1, 2, 3], [4, 5, 6]]))
    ax = fig.axes[0]
    lo, hi = ax.get_ylim()
    assert (lo, hi) == pytest.approx((-0.5, 1.5))  # not -2.5 .. 11.5
    assert [t.get_text() for t in ax.get_yticklabels()] == ["1", "8"]
    assert list(ax.get_yticks()) == [0, 1]
    # x (not whole numbers): ticks at the grid values
    assert list(ax.get_xticks()) == pytest.approx([0.5, 1.0, 2.0])
    plt.close(fig)
    # negative control: the old midpoint edges of {1, 8} give the range the issue saw
    assert list(_edges(np.array([1, 8]), False)) == [-2.5, 4.5, 11.5]
    assert not categorical_axis(np.array([0.5, 1.0]), False) and not categorical_axis(np.array([1, 8]), True)


def test_values_spanning_decades_get_a_log_colour_scale() -> None:
    fig = phase_figure(diagram([1.0, 2.0, 3.0], [0.5, 1.5], [[0.5, 30, 3000], [1, 60, 2000]]))
    mesh = fig.axes[0].collections[0]
    assert isinstance(mesh.norm, LogNorm)
    colours = mesh.to_rgba(np.array([0.5, 30, 3000]))
    assert len({tuple(np.round(c, 3)) for c in colours}) == 3  # three columns, three colours
    plt.close(fig)
    # control: a narrow range stays linear
    fig = phase_figure(diagram([1.0, 2.0], [0.5, 1.5], [[1.0, 2.5], [3.0, 4.0]]))
    assert not isinstance(fig.axes[0].collections[0].norm, LogNorm)
    plt.close(fig)


def test_integer_colourbar_has_integer_ticks() -> None:
    fig = phase_figure(diagram([1.0, 2.0], [0.5, 1.5], [[1, 12], [5, 7]]))
    bar_ax = fig.axes[1]
    ticks = [t for t in bar_ax.get_yticks() if 1 <= t <= 12]
    assert ticks and all(float(t).is_integer() for t in ticks), ticks
    plt.close(fig)
    # control: non-integer means keep matplotlib's default (fractional) ticks possible
    fig = phase_figure(diagram([1.0, 2.0], [0.5, 1.5], [[0.1, 0.7], [0.3, 0.45]]))
    assert any(not float(t).is_integer() for t in fig.axes[1].get_yticks())
    plt.close(fig)
