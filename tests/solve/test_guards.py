"""Numerical guards: NaN/inf stop with the last good state, the dt * L stability warning, float32 drift."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from attnflow import simulate, tokens
from attnflow.cli.main import app
from attnflow.core.heads import Heads, goe_heads, identity_heads
from attnflow.io.checkpoint import CHECKPOINT, load_checkpoint
from attnflow.io.store import is_complete
from attnflow.solve.guards import (
    STABLE_DT_L,
    NumericalInstability,
    PrecisionWarning,
    StabilityWarning,
    stability_estimate,
    state_problem,
    step_warning,
    suggested_step,
)
from attnflow.weights.processes import FromCallable

torch.set_num_threads(1)


def test_nan_weights_stop_the_run_with_the_last_good_state():
    A = identity_heads(2, 3, 2.0)
    bad = FromCallable(lambda t: A if t < 0.3 else np.full_like(A, np.nan))
    x0 = tokens.uniform(16, 3, 0)
    with pytest.raises(NumericalInstability) as info:
        simulate(x0, bad, model="mha", t_end=1.0, dt=0.05, method="euler", save_every=4)
    e = info.value
    assert e.step == 7 and e.t == pytest.approx(0.35)  # the step from t=0.30 queries A(0.30) = NaN
    assert "NaN/inf" in str(e) and "jko" in str(e)
    ck, tr = e.checkpoint, e.trajectory
    assert ck.step == 6 and np.isfinite(ck.x).all()
    assert tr.t[-1] == pytest.approx(0.3) and np.array_equal(tr.x[-1], ck.x)  # last good state recorded
    assert np.allclose(np.linalg.norm(tr.x, axis=-1), 1.0)
    # it is the state an undisturbed run reaches at t = 0.3 (the same weights' path: a callable)
    ok = simulate(x0, FromCallable(lambda t: A), model="mha", t_end=0.3, dt=0.05, method="euler", save_every=1)
    assert np.array_equal(ok.x[-1], ck.x)
    # constant weights step through the compiled small-cloud path: the same state to rounding
    compiled = simulate(x0, A, model="mha", t_end=0.3, dt=0.05, method="euler", save_every=1)
    assert compiled.provenance["compiled_steps"] and np.abs(compiled.x[-1] - ck.x).max() < 1e-14


@pytest.mark.integration
def test_cli_overflow_stops_with_last_good_state_saved(tmp_path):
    """``usa`` with wild OU weights: Z = sum_j a_j exp(x^T A x_j) grows so fast that an Euler step's
    |x + dt v| overflows and the retraction returns a zero row at t = 0.22; the state guard stops the
    run there (before it, the run went on with garbage until the field itself overflowed at t = 1.14)."""
    cfg = tmp_path / "wild.yaml"
    cfg.write_text(
        "model: usa\ntokens: {n: 16, d: 3}\nheads: {count: 1, preset: identity, beta: 1}\n"
        "weights: {process: ou, rate: 0, sigma: 300, init_spread: 0}\n"
        "integration: {t_end: 4.0, dt: 0.01, method: euler, save_every: 1}\n"
    )
    out = tmp_path / "run"
    res = CliRunner().invoke(app, ["run", str(cfg), "--out", str(out), "--no-figures"])
    text = " ".join(res.output.split())
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert "collapsed to the zero vector" in text and "at t=0.22 (step 22 of 400)" in text
    assert "last good state is saved" in text
    assert not is_complete(out)
    ck = load_checkpoint(out / CHECKPOINT)
    assert ck.stopped and ck.step == 21 and np.isfinite(ck.x).all()
    import xarray as xr

    ds = xr.open_zarr(out / "dataset.zarr")
    assert float(ds.time[-1]) == pytest.approx(ck.step * 0.01)
    shown = CliRunner().invoke(app, ["show", str(out)])
    assert shown.exit_code == 2 and "numerical guard" in " ".join(shown.output.split())
    again = CliRunner().invoke(app, ["run", "--resume", str(out)])
    assert again.exit_code == 2 and "same blow-up" in " ".join(again.output.split())


def _energy_monotone(A, dt, method, n_steps=120):
    x0 = tokens.uniform(32, 3, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", StabilityWarning)
        tr = simulate(x0, A, model="gf", t_end=n_steps * dt, dt=dt, method=method, save_every=1)
    E = tr.diagnostics["energy"]
    return bool(np.all(np.diff(E) <= 1e-12 * np.abs(E).max()))


@pytest.mark.parametrize(
    "kind,beta,method", [("identity", 16, "euler"), ("identity", 16, "rk4"), ("goe", 16, "euler"), ("goe", 16, "rk4")]
)
def test_stability_estimate_separates_stable_from_unstable_steps(kind, beta, method):
    """Below the warning threshold the gf energy decreases at every step; at 3x it does not."""
    A = identity_heads(2, 3, beta) if kind == "identity" else goe_heads(2, 3, beta, 1)
    L = stability_estimate(Heads(K=torch.from_numpy(A)), "gf")
    assert L == pytest.approx(np.linalg.norm(A, 2, axis=(1, 2)).max())
    limit = STABLE_DT_L[method]
    good = suggested_step(L, method, 10.0)
    assert good * L <= 0.5 * limit + 1e-12 and abs(round(10.0 / good) * good - 10.0) < 1e-9
    assert step_warning(good, method, Heads(K=torch.from_numpy(A)), "gf", 10.0) is None
    assert _energy_monotone(A, good, method)
    bad = 3 * limit / L
    msg = step_warning(bad, method, Heads(K=torch.from_numpy(A)), "gf", 10.0)
    assert msg is not None and "jko" in msg and f"dt <= {good:.3g}" in msg
    assert not _energy_monotone(A, bad, method)


def test_simulate_warns_once_for_a_stiff_step_and_presets_do_not_warn():
    A = identity_heads(2, 3, 16.0)
    x0 = tokens.uniform(8, 3, 0)
    with pytest.warns(StabilityWarning, match="dt \\* L = 4"):
        simulate(x0, A, t_end=0.5, dt=0.25, method="rk4")
    from attnflow.config import PRESETS, build, preset_config

    for name in PRESETS:
        cfg = preset_config(name)
        x0, proc, kw = build(cfg)
        heads = proc.sampler(kw["seed"])(0.0)
        assert step_warning(kw["dt"], kw["method"], heads, kw["model"], kw["t_end"]) is None, name


def test_float32_drift_flagged_only_when_rounding_beats_the_step_error():
    """rk4 at dt = 0.01: truncation ~ dt^5 is far below float32 rounding -> flagged.
    euler at dt = 0.05: truncation ~ dt^2 dominates -> not flagged. float64 is never checked."""
    A = goe_heads(2, 3, 4.0, 3)
    x0 = tokens.uniform(32, 3, 2)
    with pytest.warns(PrecisionWarning, match="float64"):
        tr = simulate(x0, A, t_end=1.0, dt=0.01, method="rk4", save_every=10, dtype=torch.float32)
    s = tr.provenance["float32_check"]
    assert s["flagged"] and s["rounding_drift"] > 10 * s["step_error"]
    with warnings.catch_warnings():
        warnings.simplefilter("error", PrecisionWarning)
        tr = simulate(x0, A, t_end=1.0, dt=0.05, method="euler", save_every=5, dtype=torch.float32)
        s = tr.provenance["float32_check"]
        assert not s["flagged"] and s["step_error"] > 10 * s["rounding_drift"] > 0
        tr = simulate(x0, A, t_end=1.0, dt=0.01, method="rk4", save_every=10)
    assert "float32_check" not in tr.provenance


def test_float32_check_on_a_subset_of_rows_estimates_the_full_sums():
    """N = 300 tokens: the check's float64 steps at 64 random rows estimate the sums over all tokens
    (the same check with every row) to within a factor 1.5, for both a rounding-dominated (rk4, dt
    0.01) and a truncation-dominated (euler, dt 0.05) step; the decision agrees. Control: the two
    cases give opposite decisions."""
    from attnflow.schemes.integrators import get_integrator
    from attnflow.solve.guards import PRECISION_ROWS, Float32Monitor

    A = torch.as_tensor(goe_heads(2, 3, 4.0, 3))
    x = torch.as_tensor(tokens.uniform(300, 3, 2), dtype=torch.float32)
    a, w = torch.full((300,), 1 / 300), torch.full((2,), 0.5)
    flags = []
    for method, dt in (("rk4", 0.01), ("euler", 0.05)):
        step = get_integrator(method).step
        runs = {}
        for rows in (PRECISION_ROWS, 300):
            m = Float32Monitor()
            m.check(step, "gf", Heads(K=A), a, w, 0.0, x, dt, one_stage=method == "euler", seed=7, rows=rows)
            runs[rows] = m
        sub, full = runs[PRECISION_ROWS], runs[300]
        assert 1 / 1.5 < sub.rounding / full.rounding < 1.5, method
        assert 1 / 1.5 < sub.budget / full.budget < 1.5, method
        assert sub.flagged == full.flagged
        flags.append(full.flagged)
    assert flags == [True, False]


def test_float32_check_of_an_euler_run_takes_only_row_passes(monkeypatch):
    """Euler, N = 300: the check makes two float64 passes, each of 64 query rows, and no float32
    pass of its own (its float32 step is the run's, from the saved state's field); still flagged or
    not as the step demands. Control: rk4 needs float32 passes for its stages."""
    import attnflow.solve.guards as guards

    queries, full32 = [], []
    real_att, real_fs, real_mix = guards.attention_stats, guards.field_stats, guards.mixed_field
    monkeypatch.setattr(
        guards, "attention_stats", lambda q, *r, **k: queries.append(q.shape[-2]) or real_att(q, *r, **k)
    )
    # a full pass is either entry point (statistics, or the mixed field of a step)
    monkeypatch.setattr(guards, "field_stats", lambda *r, **k: full32.append(1) or real_fs(*r, **k))
    monkeypatch.setattr(guards, "mixed_field", lambda *r, **k: full32.append(1) or real_mix(*r, **k))
    A = goe_heads(2, 3, 4.0, 3)
    x0 = tokens.uniform(300, 3, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PrecisionWarning)
        tr = simulate(x0, A, t_end=0.4, dt=0.02, method="euler", save_every=10, dtype=torch.float32)
    s = tr.provenance["float32_check"]
    assert s["checks"] == 1 and not s["flagged"] and s["step_error"] > 10 * s["rounding_drift"] > 0
    # one pass at x gives v (shared by both steps) and g (identity values), one at the half step
    assert queries == [64, 64] and full32 == []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PrecisionWarning)
        tr = simulate(x0, A, t_end=0.4, dt=0.02, method="rk4", save_every=10, dtype=torch.float32)
    assert tr.provenance["float32_check"]["flagged"] and len(full32) == 13  # 4 s - 3 for s = 4


def test_unit_rows_is_the_guards_fast_verdict() -> None:
    """A compiled step asks ``unit_rows`` instead of the guard (issue 43): it passes exactly the float64
    states the guard passes at once; off the sphere by more than the fast bound, or NaN, it does not
    (negative controls) and the guard then names the problem."""
    from attnflow.solve.guards import unit_rows

    x = np.random.default_rng(0).standard_normal((16, 3))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    assert unit_rows(x) and state_problem(torch.from_numpy(x)) is None
    off = x.copy()
    off[3] *= 1.0 + 2e-6  # outside the fast bound (half of the tolerance 1e-6) and the tolerance itself
    assert not unit_rows(off) and "token 3 left the unit sphere" in (state_problem(torch.from_numpy(off)) or "")
    nan = x.copy()
    nan[5, 1] = np.nan
    assert not unit_rows(nan) and "NaN" in (state_problem(torch.from_numpy(nan)) or "")
    assert not unit_rows(np.empty((0, 3)))


def test_the_loop_checks_a_state_the_stepper_did_not() -> None:
    """``Trial.on_sphere`` skips the default guard only: a trial off the sphere that claims it is checked
    is still refused by a caller's own guard (the negative control: without the claim the default
    guard refuses it)."""
    from attnflow.solve.controllers import ConstantStep
    from attnflow.solve.loop import StepFailed, Trial, integrate
    from attnflow.solve.saveat import SaveAt

    x = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]], dtype=torch.float64)
    bad = 2.0 * x

    def run(on_sphere: bool, guard: Any = None) -> str | None:
        def attempt(t: float, y: torch.Tensor, h: float, first: Any) -> Trial:
            return Trial(bad, 0.0, on_sphere=on_sphere)

        try:
            kw = {} if guard is None else {"guard": guard}
            integrate(
                attempt, x, t=0.0, control=ConstantStep(0.1).start(0.0, 0.1), saves=SaveAt(every=1).start(0.0), **kw
            )
        except StepFailed as e:
            return e.why
        return None

    assert "left the unit sphere" in (run(False) or "")
    assert run(True) is None  # the stepper's word is taken (what the compiled step gives)
    assert run(True, guard=lambda y: "own guard") == "own guard"
