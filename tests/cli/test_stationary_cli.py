"""``attnflow stationary RUN``, and what ``show`` and the report say a run ended at."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

import attnflow as af
from attnflow.cli import app
from attnflow.viz.report import report_html

pytestmark = pytest.mark.integration

runner = CliRunner()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("stationary")
    # Two antipodal clusters of two tokens (a saddle of index 2 in d = 3) stay put under gf.
    x = np.zeros((4, 3))
    x[:2, 0], x[2:, 0] = 1.0, -1.0
    af.simulate(x, 1.5 * np.eye(3)[None], model="gf", t_end=0.5, dt=0.1).save(root / "saddle", figures=False)
    rng = np.random.default_rng(1)
    y = rng.standard_normal((6, 3))
    y /= np.linalg.norm(y, axis=1, keepdims=True)
    af.simulate(y, 3.0 * np.eye(3)[None], model="gf", t_end=40.0, dt=1.0, method="dopri5").save(
        root / "one", figures=False
    )
    heads = np.stack([np.eye(3), np.diag([2.0, 1.0, 0.5])])
    af.simulate(y, heads, model="mha", t_end=0.2, dt=0.1).save(root / "mha", figures=False)
    return root


def test_saddle_run_prints_index_kind_escape(runs, tmp_path):
    r = runner.invoke(app, ["stationary", str(runs / "saddle")])
    assert r.exit_code == 0, r.output
    assert "saddle" in r.stdout and "index" in r.stdout
    r = runner.invoke(app, ["stationary", str(runs / "saddle"), "--json", "--escape-out", str(tmp_path / "u.npy")])
    rec = json.loads(r.stdout)
    assert (rec["index"], rec["kind"], rec["clusters"]) == (2, "saddle", 2)
    u = np.load(tmp_path / "u.npy")
    assert u.shape == (4, 3) and abs(np.linalg.norm(u) - 1) < 1e-12
    # Control: an existing output file is refused, not overwritten.
    r = runner.invoke(app, ["stationary", str(runs / "saddle"), "--escape-out", str(tmp_path / "u.npy")])
    assert r.exit_code == 2 and "exists" in r.output


def test_converged_run_is_a_minimiser(runs):
    r = runner.invoke(app, ["stationary", str(runs / "one"), "--json"])
    rec = json.loads(r.stdout)
    assert (rec["index"], rec["kind"], rec["clusters"], rec["stationary"]) == (0, "minimiser", 1, True)
    assert rec["escape_per_cluster"] is None


def test_user_errors_are_one_paragraph(runs, tmp_path):
    r = runner.invoke(app, ["stationary", str(runs / "mha")])
    assert r.exit_code == 2 and "not a gradient flow" in r.output and "Traceback" not in r.output
    r = runner.invoke(app, ["stationary", str(tmp_path / "nothing")])
    assert r.exit_code == 2 and "no run folder" in r.output


def test_show_and_report_say_what_the_run_ended_at(runs):
    r = runner.invoke(app, ["show", str(runs / "saddle"), "--json"])
    rec = json.loads(r.stdout)
    assert rec["ended_at"]["kind"] == "saddle" and rec["ended_at"]["index"] == 2
    assert "saddle of index 2" in rec["ended_at"]["text"]
    r = runner.invoke(app, ["show", str(runs / "saddle")])
    assert "ended at" in r.stdout and "saddle of index 2" in r.stdout
    rec = json.loads(runner.invoke(app, ["show", str(runs / "mha"), "--json"]).stdout)
    assert rec["ended_at"]["text"].startswith("not classified")  # a non-gradient run: said, not guessed
    assert "Ended at: saddle of index 2" in report_html(af.load(runs / "saddle"), max_frames=2)
