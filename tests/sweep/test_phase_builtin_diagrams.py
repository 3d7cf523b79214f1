"""Built-in phase diagrams: log colour where values span decades, ticks at the grid values, the Dask run."""

from __future__ import annotations

import numpy as np
import pytest

from attnflow.config import ConfigError
from attnflow.sweep.diagrams import geometric, phase_sweep, plot_diagram, spans_decades
from attnflow.sweep.phase import PhaseDiagram


def _pd(values, xs=(0.5, 1, 2, 4, 8), ys=(1, 2, 4)):
    v = np.asarray(values, dtype=float)
    return PhaseDiagram(
        "heads.beta", "heads.count", "t_cluster", np.array(xs), np.array(ys), v, np.full(v.shape, 2), {}
    )


def test_scales_and_ticks_follow_the_data():
    import matplotlib

    matplotlib.use("Agg")
    assert geometric([0.5, 1, 2, 4, 8]) and not geometric([1, 2, 3, 4, 5])
    assert spans_decades(np.array([0.1, 3.0, np.nan])) and not spans_decades(np.array([1.0, 5.0]))
    assert not spans_decades(np.array([-1.0, 50.0]))  # a sign change cannot go on a log scale


def test_plot_uses_log_colour_and_grid_ticks(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    seen = {}
    real_savefig = plt.Figure.savefig

    def spy(fig, path, **kw):
        ax = fig.axes[0]
        seen["xticks"] = list(ax.get_xticks())
        seen["yticks"] = list(ax.get_yticks())
        seen["norm"] = type(ax.collections[0].norm).__name__
        seen["xscale"] = ax.get_xscale()
        return real_savefig(fig, path, **kw)

    monkeypatch.setattr(plt.Figure, "savefig", spy)
    wide = np.outer([1, 10, 100], [1, 2, 3, 4, 5]) * 0.01
    p = plot_diagram(_pd(wide), tmp_path / "a.png")
    assert p.is_file()
    assert seen["norm"] == "LogNorm" and seen["xscale"] == "log"
    assert np.allclose(seen["xticks"], [0.5, 1, 2, 4, 8]) and np.allclose(seen["yticks"], [1, 2, 4])
    # control: values within a decade keep a linear colour scale
    plot_diagram(_pd(np.ones((3, 5)) + np.arange(5)), tmp_path / "b.png")
    assert seen["norm"] == "Normalize"


def test_sweep_spec_and_refusals():
    spec = phase_sweep(betas=[1, 2], heads=[1, 4], seeds=3, overrides={"tokens.n": 16})
    assert spec.grid.product == {"heads.beta": [1.0, 2.0], "heads.count": [1, 4]} and spec.seeds == 3
    with pytest.raises(ConfigError):
        phase_sweep(betas=[1], heads=[0])
    with pytest.raises(ConfigError):
        phase_sweep(betas=[], heads=[1])


@pytest.mark.integration
@pytest.mark.slow
def test_the_command_runs_the_sweep_on_dask_and_draws_every_diagram(tmp_path):
    from typer.testing import CliRunner

    from attnflow.cli import app

    out = tmp_path / "ph"
    r = CliRunner().invoke(
        app,
        ["phase-diagrams", str(out), "--beta", "1,2,4", "--heads", "1,4", "--seeds", "2", "--workers", "1",
         "--set", "tokens.n=16", "--set", "integration.t_end=2.0", "--set", "integration.dt=0.1",
         "--set", "integration.save_every=5", "--yes"],
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    names = {p.name for p in (out / "diagrams").iterdir()}
    assert names == {
        f"{s}.png"
        for s in ("beta_H_clusters", "beta_H_t_cluster", "beta_H_late_slope", "beta_t_clusters", "beta_t_slope")
    }
    bad = CliRunner().invoke(app, ["phase-diagrams", str(tmp_path / "x"), "--beta", "a,b"])
    assert bad.exit_code == 2 and "comma-separated" in bad.output
