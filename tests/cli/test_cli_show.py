"""``attnflow show``: tables for people, --json for scripts, --times, time to clustering, EDI residual;
``repr(Trajectory)`` is a short summary."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

import attnflow as af
from attnflow.analysis.edi import edi_budget
from attnflow.cli import app
from attnflow.config import apply_overrides, preset_config
from attnflow.core import tokens
from attnflow.core.heads import identity_heads
from attnflow.runs import run_config
from attnflow.sweep.table import time_to_cluster

runner = CliRunner()
SMALL = ["tokens.n=16", "heads.count=2", "integration.t_end=1.0", "integration.dt=0.05", "integration.save_every=2"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    traj = run_config(apply_overrides(preset_config("ou"), SMALL))
    path = tmp_path_factory.mktemp("show") / "run"
    traj.save(path, figures=False)
    return path


def show_json(*args) -> dict:
    r = runner.invoke(app, ["show", *map(str, args), "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


@pytest.mark.integration
def test_json_matches_the_run(run_dir):
    traj = af.load(run_dir)
    rec = show_json(run_dir)
    assert rec["times"] == [traj.t[0], traj.t[-1]]
    assert rec["diagnostics"]["energy"] == [traj.diagnostics["energy"][0], traj.diagnostics["energy"][-1]]
    assert (rec["N"], rec["d"], rec["H"], rec["weights"], rec["beta"], rec["cluster_eps"]) == (
        16,
        3,
        2,
        "ou",
        4.0,
        1e-3,
    )
    b = edi_budget(traj)
    assert rec["edi"]["residual"] == b.total_residual
    assert rec["edi"]["relative_residual"] == b.relative_residual
    ttc = time_to_cluster(traj.t, traj.diagnostics["clusters"], traj.N)
    assert rec["time_to_clustering"] == (None if np.isnan(ttc) else ttc)
    assert rec["final_clusters"] == traj.diagnostics["clusters"][-1]


@pytest.mark.integration
def test_times_picks_the_nearest_saved_times(run_dir):
    traj = af.load(run_dir)  # saved every 0.1
    rec = show_json(run_dir, "--times", "0.31,0.5, 2")
    assert rec["times"] == pytest.approx([0.3, 0.5, 1.0], abs=1e-12)
    k = int(np.argmin(abs(traj.t - 0.31)))
    assert rec["diagnostics"]["slope"][0] == traj.diagnostics["slope"][k]
    r = runner.invoke(app, ["show", str(run_dir), "--times", "0,1"])
    assert r.exit_code == 0 and "t = 0 " in r.output and "t = 1 " in r.output
    for bad in ("a,b", ",", "nan", "1,inf"):
        r = runner.invoke(app, ["show", str(run_dir), "--times", bad])
        assert r.exit_code == 2 and "--times" in r.output


@pytest.mark.integration
def test_table_prints_clustering_and_edi_and_no_question_marks(run_dir):
    r = runner.invoke(app, ["show", str(run_dir)])
    assert r.exit_code == 0
    assert "time to clustering" in r.output and "EDI residual" in r.output
    assert "?" not in r.output


@pytest.mark.integration
def test_python_run_shows_not_recorded_instead_of_question_marks(tmp_path):
    """A run saved from Python without a config: no weight process recorded, never '?'."""
    x0 = tokens.uniform(6, 3, seed=0)
    af.simulate(x0, identity_heads(2, 3, beta=1.0), model="mha", t_end=0.1, dt=0.05).save(
        tmp_path / "py", figures=False
    )
    r = runner.invoke(app, ["show", str(tmp_path / "py")])
    assert r.exit_code == 0, r.output
    assert "?" not in r.output and "not recorded" in r.output
    assert "EDI residual" not in r.output  # model mha records no EDI series
    assert show_json(tmp_path / "py")["edi"] is None


@pytest.mark.integration
def test_time_to_clustering_of_a_merging_run(tmp_path):
    """Two tokens at the same point and one far away: 2 clusters from t = 0 on."""
    x0 = np.array([[1.0, 0, 0], [1.0, 0, 0], [-1.0, 0, 0]])
    af.simulate(x0, identity_heads(1, 3, beta=0.0), model="gf", t_end=0.1, dt=0.05).save(tmp_path / "m", figures=False)
    rec = show_json(tmp_path / "m")
    assert rec["final_clusters"] == 2 and rec["time_to_clustering"] == 0.0


def test_repr_is_short(run_dir):
    text = repr(af.load(run_dir))
    assert len(text) < 300
    assert text.startswith("Trajectory(model='gf', method='rk4', N=16, d=3, H=2, t=0..1")
    assert "steps=20" in text
