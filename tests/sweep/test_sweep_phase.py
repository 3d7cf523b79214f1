"""Phase diagrams from a sweep folder whose records are known in closed form (no simulation)."""

from __future__ import annotations

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from attnflow.cli.main import app
from attnflow.config import ConfigError
from attnflow.sweep.phase import _edges, phase_diagram
from attnflow.sweep.spec import parse_sweep, sweep_points
from attnflow.sweep.table import POINTS, SPEC, assemble, write_record
from helpers import skip_without_sweep_extra

T = [0.0, 1.0, 2.0]


def _fake(beta: float, count: int, seed: int) -> dict[str, list[float]]:
    """Diagnostics with a known formula: clusters = 10 beta + count + seed + t."""
    n = len(T)
    return {
        "clusters": [10 * beta + count + seed + t for t in T],
        "slope": [beta * (3 - t) for t in T],
        **{k: [0.0] * n for k in ("energy", "order_parameter", "metric_speed", "min_inner")},
    }


@pytest.fixture()
def sweep_dir(tmp_path):
    skip_without_sweep_extra()
    spec = parse_sweep({"grid": {"product": {"heads.beta": [1.0, 2.0, 4.0], "heads.count": [1, 2]}}, "seeds": 3})
    (tmp_path / POINTS).mkdir()
    (tmp_path / SPEC).write_text(yaml.safe_dump(spec.model_dump(mode="json")))
    points = sweep_points(spec)
    for p in points:
        b, c = p.params["heads.beta"], p.params["heads.count"]
        write_record(
            tmp_path,
            {
                "point": p.id,
                "status": "ok",
                "t": T,
                "diagnostics": _fake(b, c, p.seed),
                "config": p.config,
                "wall_s": 0.1,
            },
        )
    assemble(tmp_path, points)
    return tmp_path


def test_parameter_by_time_averages_over_seeds(sweep_dir):
    pd = phase_diagram(sweep_dir, "beta", "t", "clusters", ["count=2"])
    assert pd.x == "heads.beta" and pd.y == "t"
    np.testing.assert_array_equal(pd.xs, [1.0, 2.0, 4.0])
    np.testing.assert_array_equal(pd.ys, T)
    # mean over seeds 0, 1, 2 of 10 beta + 2 + seed + t = 10 beta + 3 + t
    expected = 10 * pd.xs[None, :] + 3 + np.array(T)[:, None]
    np.testing.assert_allclose(pd.values, expected, rtol=0, atol=1e-12)
    assert (pd.counts == 3).all()


def test_two_parameters_use_the_results_table(sweep_dir):
    pd = phase_diagram(sweep_dir, "heads.beta", "count", "clusters")
    assert pd.color == "clusters_end"
    np.testing.assert_allclose(pd.values, 10 * pd.xs[None, :] + pd.ys[:, None] + 1 + 2, atol=1e-12)
    # slope_floor: time average of (beta (3 - t))^2 over the late half [1, 2], trapezoid rule: beta^2 (4 + 1) / 2
    floor = phase_diagram(sweep_dir, "beta", "count", "slope_floor")
    np.testing.assert_allclose(floor.values, np.broadcast_to(2.5 * floor.xs**2, floor.values.shape), atol=1e-12)


@pytest.mark.parametrize(
    "args, words",
    [
        (("beta", "t", "clusters", []), ["heads.count also varies", "where=['heads.count=VALUE']"]),
        (("gamma", "t", "clusters", []), ["'gamma' is not a swept parameter", "heads.beta"]),
        (("beta", "t", "nope", ["count=2"]), ["color='nope'", "clusters"]),
        (("beta", "t", "clusters", ["count=3"]), ["matches no point", "1, 2"]),
        (("t", "time", "clusters", []), ["both be time"]),
        (("beta", "beta", "clusters", []), ["both 'heads.beta'"]),
    ],
)
def test_mistakes_are_explained(sweep_dir, args, words):
    with pytest.raises(ConfigError) as e:
        phase_diagram(sweep_dir, *args)
    for w in words:
        assert w in str(e.value)
    assert "--" not in str(e.value)  # the library names parameters; only the CLI names flags


def test_cell_edges_bracket_the_centres():
    np.testing.assert_allclose(_edges(np.array([1.0, 2.0, 4.0]), False), [0.5, 1.5, 3.0, 5.0])
    np.testing.assert_allclose(_edges(np.array([1.0, 4.0, 16.0]), True), [0.5, 2.0, 8.0, 32.0])


@pytest.mark.integration
def test_cli_writes_the_figure_and_exits_2_on_mistakes(sweep_dir):
    r = CliRunner().invoke(
        app, ["sweep-plot", str(sweep_dir), "--x", "beta", "--y", "t", "--where", "heads.count=1", "--log-x"]
    )
    assert r.exit_code == 0, r.output
    png = sweep_dir / "figures" / "phase_beta_t_clusters.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    r = CliRunner().invoke(app, ["sweep-plot", str(sweep_dir), "--x", "beta", "--y", "t"])
    flat = " ".join(r.output.split())
    assert r.exit_code == 2 and "With this command: --where heads.count=VALUE." in flat and "Traceback" not in r.output
    r = CliRunner().invoke(app, ["sweep-plot", str(sweep_dir), "--x", "beta", "--y", "t", "--color", "nope"])
    assert r.exit_code == 2 and "With this command: --color clusters." in " ".join(r.output.split())
    r = CliRunner().invoke(app, ["sweep-plot", str(sweep_dir / "nothing"), "--x", "beta", "--y", "t"])
    assert r.exit_code == 2 and "no sweep folder" in r.output
