"""The plateau-duration study: segments, the first metastable plateau, bootstrap summaries and the trend
(with controls), the written table and figure, and the ``attnflow plateaus`` command."""

from __future__ import annotations

import math

import numpy as np
import pytest
from typer.testing import CliRunner

from attnflow.analysis.metastability import detect_plateaus
from attnflow.cli import app
from attnflow.sweep.plateaus import PlateauStudy, RunRecord, first_metastable, log_segments, write_study

pd = pytest.importorskip("pandas")  # the sweep extra (xarray needs it too)

runner = CliRunner()


def test_log_segments_cover_the_run_by_decades():
    assert log_segments(1e3) == [(0.0, 1.0), (1.0, 10.0), (10.0, 100.0), (100.0, 1000.0)]
    assert log_segments(0.5) == [(0.0, 0.5)]
    assert log_segments(250.0)[-1] == (100.0, 250.0)


def _stairs(times, drops, T=2000.0):
    t = np.linspace(0, T, 8001)
    E = -sum(f * (1 + np.tanh((t - tk) / 1.0)) / 2 for f, tk in zip(drops, times))
    return detect_plateaus(t, E)


def test_first_metastable_plateau():
    st = _stairs([5.0, 300.0], [0.7, 0.3])  # rest 5 .. 300, then the final rest
    start, end, censored, _ = first_metastable(st, "minimiser")
    assert 5 < start < 15 and 290 < end < 300 and not censored
    # Straight to the minimiser: the only rest after motion is the final one: no metastable plateau ...
    st1 = _stairs([5.0], [1.0])
    assert first_metastable(st1, "minimiser") is None
    # ... unless the end is a saddle (or still moving): then it is a plateau not yet left, a lower bound.
    got = first_metastable(st1, "saddle")
    assert got is not None and got[2] and got[1] == 2000.0


def _record(beta, seed, duration, censored=False, H=1):
    st = _stairs([5.0], [1.0])
    return RunRecord(beta, H, seed, 1.0, None if duration is None else 1.0 + duration, duration, censored, 2, 1, 3, 1,
                     "minimiser", 0, st)  # fmt: skip


def test_summary_geometric_means_and_trend_with_controls():
    rng = np.random.default_rng(0)
    betas = [1.0, 2.0, 4.0]
    recs = []
    for b in betas:
        for s in range(6):
            recs.append(_record(b, s, float(10 ** (0.3 * b + rng.normal(0, 0.1)))))
    recs.append(_record(4.0, 6, 5000.0, censored=True))  # counted, not averaged in
    recs.append(_record(1.0, 6, None))  # no plateau: counted
    st = PlateauStudy(recs, {"betas": betas}).compute()
    for row in st.summary:
        measured = [r.duration for r in recs if r.beta == row["beta"] and r.duration and not r.censored]
        assert row["measured"] == 6
        assert math.isclose(row["duration_geomean"], 10 ** np.mean(np.log10(measured)), rel_tol=1e-12)
        assert row["ci_low"] < row["duration_geomean"] < row["ci_high"]
    assert [r["censored"] for r in st.summary] == [0, 0, 1] and [r["no_plateau"] for r in st.summary] == [1, 0, 0]
    tr = st.trend[1]
    print(
        f"planted slope 0.3 (and one censored lower bound 5000 at beta 4): measured {tr['slope']:.3f} (CI {tr['ci_low']:.3f} .. {tr['ci_high']:.3f})"
    )
    assert tr["ci_low"] > 0 and st.verdict(1) == "grows"
    # Controls: durations that fall with beta, and durations that do not depend on it.
    falling = [_record(b, s, float(10 ** (3 - 0.3 * b + rng.normal(0, 0.1)))) for b in betas for s in range(6)]
    assert PlateauStudy(falling, {}).compute().verdict(1) == "shrinks"
    flat = [_record(b, s, float(10 ** (1 + rng.normal(0, 0.3)))) for b in betas for s in range(6)]
    assert PlateauStudy(flat, {}).compute().verdict(1) == "undecided"


def test_write_study_table_and_figure(tmp_path):
    recs = [_record(b, s, float(10 ** (0.5 * b + 0.1 * s))) for b in (1.0, 4.0, 8.0) for s in range(3)]
    recs.append(_record(8.0, 3, 1e4, censored=True))
    settings = {
        "betas": [1.0, 4.0, 8.0],
        "seeds": 4,
        "n": 8,
        "d": 2,
        "t_end": 1e4,
        "heads_kind": "identity",
        "model": "gf",
    }
    paths = write_study(PlateauStudy(recs, settings).compute(), tmp_path / "out")
    assert all(p.is_file() and p.stat().st_size > 0 for p in paths)
    runs = pd.read_csv(tmp_path / "out" / "runs.csv")
    assert len(runs) == 10 and runs["censored"].sum() == 1
    assert "grows with beta" in (tmp_path / "out" / "summary.md").read_text()
    with pytest.raises(FileExistsError):  # never over an existing folder
        write_study(PlateauStudy(recs, settings).compute(), tmp_path / "out")


@pytest.mark.integration
def test_cli_refuses_bad_input(tmp_path):
    (tmp_path / "exists").mkdir()
    r = runner.invoke(app, ["plateaus", "--out", str(tmp_path / "exists")])
    assert r.exit_code == 2 and "already exists" in r.output
    r = runner.invoke(app, ["plateaus", "--out", str(tmp_path / "x"), "--beta", "1,two"])
    assert r.exit_code == 2 and "comma-separated" in r.output
    r = runner.invoke(app, ["plateaus", "--out", str(tmp_path / "x"), "--beta", "-1"])
    assert r.exit_code == 2 and "positive" in r.output and not (tmp_path / "x").exists()
    r = runner.invoke(app, ["plateaus", "--out", str(tmp_path / "x"), "--heads-kind", "weird"])
    assert r.exit_code == 2 and "heads kind" in r.output


@pytest.mark.integration
@pytest.mark.slow
def test_cli_end_to_end_small(tmp_path):
    r = runner.invoke(
        app, ["plateaus", "--beta", "2,4", "--seeds", "2", "--n", "8", "--t-end", "100", "--out", str(tmp_path / "p")]
    )
    assert r.exit_code == 0, r.output
    summary = pd.read_csv(tmp_path / "p" / "summary.csv")
    assert list(summary["beta"]) == [2.0, 4.0] and (tmp_path / "p" / "plateaus.png").is_file()


def test_heads_for_kinds():
    from attnflow.core.errors import InputError
    from attnflow.sweep.plateaus import heads_for

    A = heads_for("identity", 3.0, 4, 2, seed=0)
    assert A.shape == (4, 2, 2) and np.allclose(A, 3.0 * np.eye(2))
    G = heads_for("goe", 3.0, 4, 3, seed=1)
    assert G.shape == (4, 3, 3) and np.allclose(G, G.transpose(0, 2, 1))
    assert np.allclose(G, heads_for("goe", 3.0, 4, 3, seed=1)) and not np.allclose(
        G, heads_for("goe", 3.0, 4, 3, seed=2)
    )
    with pytest.raises(InputError):
        heads_for("other", 1.0, 1, 2, seed=0)
