"""Notebook views (issue 31, item 10) and the EDI's stated order (item 8)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import attnflow as af
from attnflow import heads, tokens, weights


@pytest.fixture(scope="module")
def ou_traj():
    A_bar = heads.identity_heads(2, 3, beta=2.0)
    ou = weights.OrnsteinUhlenbeck(A_bar, rate=1.0, sigma=0.5)
    return af.simulate(tokens.uniform(12, 3, seed=0), ou, model="gf", t_end=0.2, dt=0.02, method="rk4", seed=1)


@pytest.fixture(scope="module")
def const_traj():
    A = heads.goe_heads(2, 3, beta=2.0, seed=2)
    return af.simulate(tokens.uniform(12, 3, seed=0), A, model="gf", t_end=0.2, dt=0.02, method="rk4")


def test_trajectory_html(ou_traj) -> None:
    page = ou_traj._repr_html_()
    assert page.startswith("<div>") and "<table>" in page and "Trajectory" in page
    assert "12, 3, 2" in page and "clusters" in page and "energy" in page
    assert len(page) < 5000  # a summary, not the arrays


def test_edi_budget_repr_is_short_and_states_the_order(ou_traj, const_traj) -> None:
    b = af.edi_budget(ou_traj)
    text = repr(b)
    assert len(text) < 400 and "\n" not in text and "array(" not in text, text
    assert "residual_order=1" in text and "order=4" in text
    assert "Hoelder-1/2" in b.residual_order_reason and "first order" in b._repr_html_()
    # control: constant weights keep the scheme's order
    c = af.edi_budget(const_traj)
    assert c.residual_order == 4 and "first order" not in c.residual_order_reason
    # the default dataclass repr (what it was) dumps the arrays
    import dataclasses

    fields = ", ".join(f"{f.name}={getattr(b, f.name)!r}" for f in dataclasses.fields(b))
    assert "array(" in fields and len(fields) > 400


def test_edi_budget_html_escapes(ou_traj) -> None:
    b = af.edi_budget(ou_traj)
    b2 = type(b)(**{**b.__dict__, "method": "<script>x</script>"})
    page = b2._repr_html_()
    assert "<script>" not in page and "&lt;script&gt;" in page


def test_sweep_results_html() -> None:
    from attnflow.sweep.phase import PhaseDiagram
    from attnflow.sweep.runner import SweepReport

    rep = SweepReport(total=4, skipped=1, ran=3, ok=2, failed=1, results=Path("out/results.parquet"), wall_s=1.5)
    page = rep._repr_html_()
    assert "4: 1 already finished, 3 run now" in page and "2, 1" in page
    pd = PhaseDiagram(
        x="heads.beta",
        y="heads.count",
        color="clusters",
        xs=np.array([1.0, 2.0]),
        ys=np.array([1.0, 8.0]),
        values=np.array([[3.0, 2.0], [1.0, np.nan]]),
        counts=np.array([[2, 2], [2, 0]]),
        fixed={},
    )
    page = pd._repr_html_()
    assert page.count("<tr>") == 3 and "<td>-</td>" in page and "<th>8</th>" in page
    assert "values=" not in repr(pd) and "2x2" in repr(pd)


@pytest.mark.integration
def test_edi_command_says_why_the_order_is_one(tmp_path, ou_traj) -> None:
    from typer.testing import CliRunner

    from attnflow.cli import app

    ou_traj.save(tmp_path / "run", figures=False)
    res = CliRunner().invoke(app, ["edi", str(tmp_path / "run"), "--rows", "2"], terminal_width=200)
    assert res.exit_code == 0, res.output
    out = " ".join(res.output.split())
    assert "method rk4 (order 4)" in out and "residual order 1: first order whatever the scheme" in out
