"""The discrete energy-dissipation identity: its residual vanishes at the integrator's order."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from attnflow import edi_budget, energy, load, simulate, tokens
from attnflow.analysis.edi import StepRecorder
from attnflow.cli.main import app
from attnflow.core.heads import goe_heads, identity_heads
from attnflow.schemes.integrators import INTEGRATORS
from attnflow.solve.simulation import TimeField
from attnflow.weights.processes import Constant, OrnsteinUhlenbeck, Oscillating

torch.set_num_threads(1)

X0 = tokens.uniform(12, 3, 0)
PROCESSES = {
    "constant": Constant(goe_heads(2, 3, 3.0, 1)),
    "oscillating": Oscillating(identity_heads(2, 3, 3.0), 2.0 * identity_heads(2, 3, 3.0), [1.0, 1.7], [0.3, 1.1]),
}


def residual(process, method, dt, t_end=1.0, seed=None):
    traj = simulate(X0, process, t_end=t_end, dt=dt, method=method, save_every=10_000, seed=seed)
    return edi_budget(traj)


@pytest.mark.parametrize("name", sorted(PROCESSES))
@pytest.mark.parametrize("method", ["euler", "heun", "rk4"])
def test_residual_order_smooth_weights(name, method):
    r = np.abs([residual(PROCESSES[name], method, dt, 0.5).total_residual for dt in (0.05, 0.025, 0.0125)])
    orders = np.log2(r[:-1] / r[1:])
    p = INTEGRATORS[method].order
    assert np.all(orders > p - 0.35) and np.all(orders < p + 0.6), (r, orders)


@pytest.mark.parametrize("method", ["euler", "heun", "rk4"])
def test_residual_order_ou_weights_is_one(method):
    # OU paths are Hoelder-1/2 in t: per step O(dt^{3/2}) zero-mean errors, so O(dt) in RMS for every scheme.
    A = identity_heads(2, 3, 2.0)
    P = OrnsteinUhlenbeck(A, 1.0, 1.0, A0=A + goe_heads(2, 3, 1.0, 3))
    dts = np.array([0.1, 0.05, 0.025])
    rms = [np.sqrt(np.mean([residual(P, method, dt, 0.5, s).total_residual ** 2 for s in range(16)])) for dt in dts]
    order = np.polyfit(np.log(dts), np.log(rms), 1)[0]
    assert 0.7 < order < 1.4, (rms, order)


def test_budget_terms_against_independent_values():
    P = PROCESSES["oscillating"]
    traj = simulate(X0, P, t_end=0.5, dt=0.01, method="rk4", save_every=10)
    b = edi_budget(traj)
    # energy path: recorded increments reproduce F at the saved states (computed by fields.energy)
    for k, t in enumerate(traj.t):
        j = int(round((t - b.t[0]) / traj.dt))
        assert b.energy[j] == pytest.approx(energy(traj.x[k], P.A_at(t)), rel=1e-10)
    # along gf the metric speed equals the slope
    np.testing.assert_allclose(b.speed_action, b.slope_action, rtol=1e-12)
    assert b.relative_residual < 1e-5


def _oscillating_rk4_recorder() -> StepRecorder:
    """The EDI recorder of an rk4 gf run of 12 tokens along the oscillating weights (two heads)."""
    P = PROCESSES["oscillating"]
    w = (torch.full((12,), 1 / 12, dtype=torch.float64), torch.full((2,), 0.5, dtype=torch.float64))
    return StepRecorder(TimeField("gf", P.sampler(), *w, torch.float64, "cpu"), P.derivative, INTEGRATORS["rk4"])


def test_weight_derivative_term_matches_finite_differences():
    P = PROCESSES["oscillating"]
    rec = _oscillating_rk4_recorder()
    x = torch.from_numpy(X0)
    t, h = 0.7, 1e-5
    _, speed2, slope2, dFdt, F = rec._evaluate(t, x)
    fd = (energy(X0, P.A_at(t + h)) - energy(X0, P.A_at(t - h))) / (2 * h)
    assert dFdt == pytest.approx(fd, rel=1e-7)
    assert speed2 == pytest.approx(slope2, rel=1e-12)
    assert F == pytest.approx(energy(X0, P.A_at(t)), rel=1e-13)


def test_recorder_reuses_the_end_of_each_step(monkeypatch):
    # rk4 visits 4 stages; the first is the previous step's end, which also gives F(mu_{k+1}): so a
    # step costs 4 kernel passes (it cost 5-6 when the energies were separate calls).
    import attnflow.analysis.edi as edi

    calls = []
    real = edi.head_stats
    monkeypatch.setattr(edi, "head_stats", lambda *a, **k: calls.append(1) or real(*a, **k))
    P = PROCESSES["oscillating"]
    rec = _oscillating_rk4_recorder()
    x = torch.from_numpy(X0)
    start = None  # the solver passes each step's end evaluation on as the next step's start, explicitly
    for k in range(5):
        x = rec.step(0.1 * k, x, 0.1, start=start)
        start = rec.end[1]
    assert len(calls) == 1 + 4 * 5
    # and the budget is that of fresh evaluations: F at each end equals the energy at that state
    assert rec.rows[-1][0] == pytest.approx(0.5)
    F_end = rec._end[2][4]
    assert F_end == pytest.approx(energy(x.numpy(), P.A_at(0.5)), rel=1e-13)

    calls.clear()
    rec.step(0.5, x, 0.1)  # control: not told where the step starts, the recorder evaluates it again
    assert len(calls) == 5


def test_increment_rule_for_weights_without_derivative():
    P = PROCESSES["oscillating"]
    from attnflow.weights.processes import FromCallable

    Q = FromCallable(P.A_at, derivative="increment")  # same weights, no derivative: exact increments
    b = residual(Q, "rk4", 0.05)
    assert b.weights_rule == "increment" and b.weights_derivative == "none"
    bq = residual(P, "rk4", 0.05)
    assert bq.weights_rule == "quadrature"
    np.testing.assert_allclose(b.energy_change, bq.energy_change, rtol=1e-12)
    # The increment splits a step into "weights move, tokens frozen" and "tokens move, weights
    # frozen": exact bookkeeping, but a first-order splitting, so the residual is O(dt) even for rk4.
    r = [abs(residual(Q, "rk4", dt).total_residual) for dt in (0.05, 0.025)]
    assert 1.7 < r[0] / r[1] < 2.4


@pytest.mark.integration
def test_budget_survives_save_and_load_and_cli(tmp_path):
    traj = simulate(X0, PROCESSES["oscillating"], t_end=0.4, dt=0.02, method="heun", save_every=5)
    traj.save(tmp_path / "run", figures=False)
    b0, b1 = edi_budget(traj), edi_budget(load(tmp_path / "run"))
    np.testing.assert_array_equal(b0.residual, b1.residual)
    assert b1.quadrature == "heun stages" and b1.weights_rule == "quadrature"
    assert b1.weights_derivative == b0.weights_derivative == "closed form"
    res = CliRunner().invoke(app, ["edi", str(tmp_path / "run"), "--rows", "3"])
    assert res.exit_code == 0, res.output
    assert "dA/dt: closed form" in res.output
    assert "relative residual" in res.output and f"{b0.relative_residual:.3e}" in res.output
    assert (tmp_path / "run" / "figures" / "edi.png").stat().st_size > 1000


@pytest.mark.integration
def test_edi_errors_are_one_paragraph(tmp_path):
    traj = simulate(X0, goe_heads(2, 3, 1.0, 0), model="mha", t_end=0.1, dt=0.05)
    traj.save(tmp_path / "mha", figures=False)
    res = CliRunner().invoke(app, ["edi", str(tmp_path / "mha")])
    assert res.exit_code == 2 and "model 'gf' only" in res.output and "Traceback" not in res.output
    res = CliRunner().invoke(app, ["edi", str(tmp_path / "nothing")])
    assert res.exit_code == 2 and "no run folder" in res.output


@pytest.mark.integration
@pytest.mark.slow
def test_oscillating_preset_budget_and_its_order(tmp_path):
    # The acceptance bar on a lighter cloud (N = 64 instead of 256): rk4 at the preset's dt = 0.02.
    res = []
    for dt in (0.02, 0.01):
        out = tmp_path / f"osc{dt}"
        r = CliRunner().invoke(
            app,
            [
                "run",
                "--preset",
                "oscillating",
                "--out",
                str(out),
                "--no-figures",
                "--set",
                "tokens.n=64",
                "--set",
                f"integration.dt={dt}",
            ],
        )
        assert r.exit_code == 0, r.output
        res.append(edi_budget(load(out)))
    assert res[0].relative_residual < 1e-3
    assert 2**3.5 < abs(res[0].total_residual / res[1].total_residual) < 2**4.6


def test_fast_summation_budget_equals_the_dense_one(monkeypatch):
    # At N >= 4096 on S^2 the recorder's passes sum the heads' rows before the products, the
    # weights' increments come from the key moments alone, and the saver reads the recorder's
    # statistics: the budget and the diagnostics must be the dense kernel's to its tolerance. Euler,
    # because the stages of rk4 leave the sphere, where fast summation takes their directions (another
    # extension of the field, equal to it on the sphere).
    from attnflow.kernels import fastsum

    calls = {"means": 0, "mixed": 0}
    real_means, real_gf = fastsum.fast_head_means, fastsum.fast_gf_field

    def means(*args, **kw):
        calls["means"] += 1
        return real_means(*args, **kw)

    def gf(*args, **kw):
        calls["mixed"] += 1
        return real_gf(*args, **kw)

    monkeypatch.setattr(fastsum, "fast_head_means", means)
    monkeypatch.setattr(fastsum, "fast_gf_field", gf)
    N = 4096
    A = goe_heads(2, 3, 2.0, 4)
    P = OrnsteinUhlenbeck(A, 1.0, 1.0, A0=A + goe_heads(2, 3, 1.0, 5))
    x0 = tokens.uniform(N, 3, 6)
    runs = {
        b: simulate(
            x0,
            P,
            t_end=0.1,
            dt=0.025,
            method="euler",
            save_every=2,
            seed=7,
            backend=b,
            fast_tol=1e-10,
            head_weights=[0.3, 0.7],
        )
        for b in ("fast", "stream")
    }
    assert calls["means"] == 4 and calls["mixed"] >= 5  # one increment per step; every recorder pass mixed
    fast, dense = runs["fast"], runs["stream"]
    for name in fast.steps:
        np.testing.assert_allclose(fast.steps[name], dense.steps[name], rtol=1e-10, atol=1e-14)
    for name in ("energy", "slope", "metric_speed", "mobility_min", "mobility_max"):
        np.testing.assert_allclose(fast.diagnostics[name], dense.diagnostics[name], rtol=1e-10)
    # control: the weights' work is far above what the comparison resolves (not zero by construction)
    assert float(np.abs(dense.steps["step_weight_work"]).min()) > 1e-3
