"""Per-point records and the summaries of the results table (run in-process, no cluster)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from attnflow.config import parse_config
from attnflow.runs import run_config
from attnflow.sweep.runner import batch_size, run_batch, run_point
from attnflow.sweep.spec import parse_sweep, sweep_points
from attnflow.sweep.table import (
    POINTS,
    assemble,
    finished_ids,
    read_record,
    summarise,
    time_average,
    time_to_cluster,
)
from helpers import skip_without_sweep_extra

TINY = {
    "base": "ou",
    "set": {
        "tokens.n": 8,
        "heads.count": 2,
        "integration.t_end": 1.0,
        "integration.dt": 0.05,
        "integration.save_every": 2,
    },
}


def test_time_average_is_exact_for_linear_functions_and_uses_the_late_window():
    t = np.linspace(0.0, 2.0, 21)
    # mean of 3t + 1 over [1, 2] is 3 * 1.5 + 1; the trapezoid rule is exact for lines.
    assert time_average(t, 3 * t + 1, 0.5) == pytest.approx(5.5, abs=1e-12)
    assert time_average(t, 3 * t + 1, 1.0) == pytest.approx(4.0, abs=1e-12)
    # t^2 over [1, 2]: 7/3, trapezoid error h^2/12 * (f'(2) - f'(1)) / 1 = 0.01/12 * 2
    assert time_average(t, t**2, 0.5) == pytest.approx(7 / 3 + 0.01 * 2 / 12, abs=1e-12)


def test_time_to_cluster_is_when_the_count_settles():
    t = np.arange(6.0)
    assert time_to_cluster(t, np.array([8, 6, 3, 2, 2, 2]), 8) == 3.0
    assert time_to_cluster(t, np.array([8, 6, 2, 3, 2, 2]), 8) == 4.0
    assert time_to_cluster(t, np.array([1, 1, 1, 1, 1, 1]), 8) == 0.0
    assert math.isnan(time_to_cluster(t, np.array([8, 8, 8, 8, 8, 8]), 8))


def test_record_matches_a_direct_simulation_and_is_written_atomically(tmp_path):
    (p,) = sweep_points(parse_sweep({**TINY, "seeds": [3]}))
    (tmp_path / POINTS).mkdir()
    rec = run_point(
        {"id": p.id, "index": p.index, "params": p.params, "seed": p.seed, "config": p.config}, str(tmp_path)
    )
    assert rec["status"] == "ok" and rec["error"] is None
    assert finished_ids(tmp_path) == {p.id}
    assert [f.name for f in (tmp_path / POINTS).iterdir()] == [f"{p.id}.json"]  # no temp file left behind
    assert read_record(tmp_path, p.id)["diagnostics"] == rec["diagnostics"]
    # An independent run of the same config, in this process, gives the same numbers.
    traj = run_config(parse_config(p.config))
    np.testing.assert_allclose(rec["t"], traj.t, rtol=0, atol=0)
    for k, v in traj.diagnostics.items():
        np.testing.assert_allclose(rec["diagnostics"][k], v, rtol=1e-12, atol=0)
    s = summarise(rec, window=0.5)
    assert s["energy_end"] == traj.diagnostics["energy"][-1]
    assert s["clusters_end"] == traj.diagnostics["clusters"][-1]
    late = traj.t >= 0.5
    np.testing.assert_allclose(
        s["slope_floor"], np.trapezoid(traj.diagnostics["slope"][late] ** 2, traj.t[late]) / 0.5, rtol=1e-12
    )


def test_a_failing_point_is_recorded_with_its_error_and_the_batch_goes_on(tmp_path):
    skip_without_sweep_extra()
    spec = parse_sweep(
        {
            **TINY,
            "set": {**TINY["set"], "tokens.path": "no_such_tokens.npy"},
            "grid": {"product": {"tokens.init": ["file", "uniform"]}},
        }
    )
    pts = sweep_points(spec)
    (tmp_path / POINTS).mkdir()
    recs = run_batch(
        [{"id": p.id, "index": p.index, "params": p.params, "seed": p.seed, "config": p.config} for p in pts],
        str(tmp_path),
    )
    assert [r["status"] for r in recs] == ["failed", "ok"]
    assert "no_such_tokens.npy" in recs[0]["error"]
    table, ts = assemble(tmp_path, pts)
    assert list(table["status"]) == ["failed", "ok"]
    assert "no_such_tokens.npy" in table["error"][0] and np.isnan(table["energy_end"][0])
    assert set(ts["point"]) == {pts[1].id}


def test_a_retried_batch_skips_points_already_written(tmp_path):
    pts = sweep_points(parse_sweep({**TINY, "seeds": 2}))
    payload = [{"id": p.id, "index": p.index, "params": p.params, "seed": p.seed, "config": p.config} for p in pts]
    (tmp_path / POINTS).mkdir()
    first = run_point(payload[0], str(tmp_path))
    before = (tmp_path / POINTS / f"{pts[0].id}.json").stat().st_mtime_ns
    recs = run_batch(payload, str(tmp_path))
    assert recs[0] == first
    assert (tmp_path / POINTS / f"{pts[0].id}.json").stat().st_mtime_ns == before
    assert finished_ids(tmp_path) == {p.id for p in pts}


def test_assemble_marks_missing_points_pending(tmp_path):
    skip_without_sweep_extra()
    pts = sweep_points(parse_sweep({**TINY, "seeds": 2}))
    (tmp_path / POINTS).mkdir()
    table, _ = assemble(tmp_path, pts)
    assert list(table["status"]) == ["pending", "pending"]
    assert (tmp_path / "results.parquet").is_file()


def test_auto_batch_size_aims_at_four_tasks_per_worker():
    assert batch_size("auto", 100, 2) == 13
    assert batch_size("auto", 3, 8) == 1
    assert batch_size(5, 3, 8) == 5


def test_keep_trajectories_writes_a_loadable_run_folder(tmp_path):
    from attnflow import load

    (p,) = sweep_points(parse_sweep({**TINY, "keep_trajectories": True}))
    (tmp_path / POINTS).mkdir()
    rec = run_point(
        {"id": p.id, "index": p.index, "params": p.params, "seed": p.seed, "config": p.config}, str(tmp_path), True
    )
    traj = load(tmp_path / rec["trajectory"])
    np.testing.assert_allclose(traj.diagnostics["energy"], rec["diagnostics"]["energy"], rtol=0, atol=0)
    assert traj.config == p.config
