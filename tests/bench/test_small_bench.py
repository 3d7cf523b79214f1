"""The small-cloud benchmark's rows: every solver reaches SciPy's final state, the counts are real."""

from __future__ import annotations

import pytest

from attnflow.bench.small import compare_ensemble, compare_small, ensemble_rows, small_markdown, small_rows
from attnflow.kernels import small

pytestmark = pytest.mark.skipif(not small.AVAILABLE, reason="numba is not installed")


def test_small_rows_agree_with_scipy():
    rows = compare_small(8, t_end=2.0)
    names = [r["solver"] for r in rows]
    assert names[0].startswith("scipy") and names[-1] == "attnflow dop853 (compiled)"
    for r in rows:
        assert r["evaluations"] > 50 and r["wall_s"] > 0
        assert r["diff"] < 1e-8, r  # the same final state (rtol 1e-10)
    assert rows[0]["evals_ratio"] == 1.0


def test_small_rows_see_a_different_problem(monkeypatch):
    """Control: when SciPy integrates another problem (beta 4 instead of 9) the diff column shows it."""
    from attnflow.bench import small as sb

    real = sb._numpy_field
    monkeypatch.setattr(sb, "_numpy_field", lambda N, beta: real(N, 4.0))
    rows = compare_small(8, t_end=2.0)
    assert rows[-1]["diff"] > 1e-3, rows[-1]


def test_ensemble_rows_and_markdown():
    ens = compare_ensemble(B=3, N=8, t_end=2.0, torch_runs=1)
    # Automatic threads, then every core (when that differs), single runs, torch single runs, the floor.
    assert len(ens) in (4, 5) and all(r["runs"] == 3 for r in ens)
    assert "(automatic)" in ens[0]["how"]
    singles = next(r for r in ens if r["how"].startswith("loop of single runs (compiled)"))
    assert ens[0]["evaluations"] == singles["evaluations"]  # every member steps as its single run
    floor = ens[-1]
    assert floor["how"].startswith("floor") and 0 < floor["per_eval_s"] < 1e-3
    assert floor["wall_s"] == floor["evaluations"] * floor["per_eval_s"]
    for r in ens:
        r["x_ensemble"] = r["wall_s"] / ens[0]["wall_s"]
    result = {"small": compare_small(8, t_end=1.0), "ensemble": ens, "beta": 9.0, "rtol": 1e-10, "atol": 1e-12}
    assert len(small_rows(result)) == 2 and len(ensemble_rows(result)) == len(ens)
    assert "scipy DOP853" in small_markdown(result)
