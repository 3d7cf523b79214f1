"""The stepping loop and its observers; kernel options carried in the open."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import attnflow as af
import attnflow.kernels.dispatch as dispatch
import attnflow.kernels.fastsum as fs
from attnflow.core import tokens
from attnflow.core.heads import goe_heads, identity_heads
from attnflow.kernels.dispatch import KernelOptions, kernel_options
from attnflow.solve.controllers import FixedState
from attnflow.solve.guards import NumericalInstability
from attnflow.solve.loop import Costs, StepFailed, StepState, Trial, integrate
from attnflow.solve.saveat import SaveAt

#: These states are not token clouds: the guard checks finiteness only.
FINITE = lambda y: None if bool(torch.isfinite(y).all()) else "the tokens became NaN/inf"


class Count:
    name = "count"

    def __init__(self):
        self.states: list[StepState] = []

    def on_step(self, state: StepState) -> None:
        self.states.append(state)


def test_loop_steps_saves_and_reports_costs():
    x = torch.ones(3, 2, dtype=torch.float64)
    obs, costs = Count(), Costs({})
    out = integrate(
        lambda t, y, h, first: Trial(y + h, 0.0), x, t=1.0, control=FixedState(1.0, 0.25, 6),
        saves=SaveAt(every=4).start(1.0), observers=[obs], costs=costs, guard=FINITE,
    )  # fmt: skip
    assert torch.equal(out, x + 1.5)
    assert [s.k for s in obs.states] == [1, 2, 3, 4, 5, 6]
    assert [s.t for s in obs.states] == [1.25, 1.5, 1.75, 2.0, 2.25, 2.5]  # t0 + k dt exactly
    assert [s.save for s in obs.states] == [False, False, False, True, False, True]  # every 4 and the last
    assert set(costs.seconds) == {"step", "count"} and all(v >= 0 for v in costs.seconds.values())


def test_loop_stops_at_nan_and_rolls_back():
    undone = []
    step = lambda t, y, h: y * np.nan if t >= 0.5 else y + h
    with pytest.raises(StepFailed) as e:
        integrate(lambda t, y, h, first: Trial(step(t, y, h), 0.0), torch.zeros(2), t=0.0,
                  control=FixedState(0.0, 0.25, 8), saves=SaveAt(every=1).start(0.0),
                  rollback=lambda t: lambda: undone.append(1), guard=FINITE)  # fmt: skip
    assert e.value.k == 3 and e.value.t == 0.5 and torch.equal(e.value.x, torch.full((2,), 0.5))
    assert undone == [1] and "NaN/inf" in e.value.why


def test_simulate_records_each_parts_cost():
    traj = af.simulate(tokens.uniform(8, 3, seed=0), identity_heads(2, 3, 2.0), t_end=0.2, dt=0.05, dtype=torch.float32)
    secs = traj.provenance["seconds"]
    assert {"step", "diagnostics", "float32 check"} <= set(secs)


def test_run_options_are_explicit_not_ambient(monkeypatch):
    """A run uses its own KernelOptions for every kernel call, whatever kernel_options block encloses it."""
    tols = []
    real = fs.fast_attention_stats
    monkeypatch.setattr(fs, "fast_attention_stats", lambda *a, **k: tols.append(k["fast_plan"].tol) or real(*a, **k))
    monkeypatch.setattr(dispatch, "AUTO_FAST_MIN_TOKENS", 16)
    monkeypatch.setattr(dispatch, "PAIR_COST_IN_FLOPS", 1e9)
    x0, A = tokens.uniform(200, 3, seed=2), goe_heads(4, 3, 1.5, seed=3)
    with kernel_options("auto", 1e-3):
        af.simulate(x0, A, model="gf", t_end=0.1, dt=0.05, method="euler", fast_tol=1e-9)
        assert len(tols) >= 4 and set(tols) == {1e-9}
        tols.clear()
        af.energy(x0, A)  # negative control: a call given no options takes the ambient ones
        assert tols == [1e-3]


@pytest.mark.parametrize("bad", ["nonsense", "FAST", ""])
def test_bad_backend_names_are_refused_everywhere(bad):
    x0, A = tokens.uniform(6, 3, seed=0), identity_heads(1, 3)
    with pytest.raises(ValueError, match="unknown backend"):
        KernelOptions(bad)
    with pytest.raises(ValueError, match="unknown backend"):
        af.simulate(x0, A, t_end=0.1, dt=0.05, backend=bad)
    with pytest.raises(ValueError, match="unknown backend"):
        af.simulate_ensemble(x0, A, t_end=0.1, dt=0.05, backend=bad)
    with pytest.raises(ValueError, match="unknown backend"):
        dispatch.head_stats(torch.as_tensor(x0), af.Heads(K=torch.as_tensor(A)), torch.full((6,), 1 / 6), backend=bad)


def test_ensemble_refuses_fast_and_raises_numerical_instability():
    x0, A = tokens.uniform(6, 3, seed=0), identity_heads(1, 3)
    with pytest.raises(ValueError, match="ensemble uses the dense kernel"):
        af.simulate_ensemble(x0, A, t_end=0.1, dt=0.05, backend="fast")
    with pytest.raises(NumericalInstability, match="overflows.*in at least one member"):
        af.simulate_ensemble(x0, identity_heads(1, 3, 1e3), model="usa", betas=[1.0, 1e3], t_end=1.0, dt=0.5)


def test_ensemble_member_equals_simulate():
    """The ensemble's loop is simulate's loop: member b equals simulate with beta_b A and its seed."""
    x0, A = tokens.uniform(10, 3, seed=1), goe_heads(2, 3, 1.0, seed=2)
    ens = af.simulate_ensemble(x0, A, betas=[0.5, 2.0], model="gf", t_end=0.3, dt=0.05, method="rk4", save_every=2)
    one = af.simulate(x0, 2.0 * A, model="gf", t_end=0.3, dt=0.05, method="rk4", save_every=2)
    np.testing.assert_allclose(ens.x[:, 1], one.x, atol=1e-12)


def _count_passes(monkeypatch, **kw) -> int:
    import attnflow.kernels.dispatch as dispatch_mod

    calls = []
    real = dispatch_mod.head_stats

    def counting(*a, **k):
        calls.append(1)
        return real(*a, **k)

    for mod in (
        "attnflow.kernels.dispatch",
        "attnflow.dynamics.fields",
        "attnflow.solve.simulation",
        "attnflow.analysis.edi",
    ):
        monkeypatch.setattr(f"{mod}.head_stats", counting, raising=False)
    x0, A = tokens.uniform(24, 4, seed=0), goe_heads(2, 4, 1.0, seed=1)
    # backend "flash": the torch kernel at every pass (the automatic one steps small clouds compiled)
    af.simulate(
        x0, af.weights.Constant(A, -A), t_end=0.4, dt=0.01, method="euler", save_every=10, backend="flash", **kw
    )
    return len(calls)


def test_a_step_costs_its_evaluations(monkeypatch):
    """Euler, 40 steps, 5 saved states: the diagnostics share the field's pass at each saved state, so
    the run makes 41 kernel passes (one per step and the start); without that reuse it made 50."""
    assert _count_passes(monkeypatch, model="mha") == 41
    from attnflow.solve.simulation import TimeField

    plain = TimeField.evaluate
    monkeypatch.setattr(TimeField, "evaluate", lambda self, t, x: (self(t, x), None))  # control: no shared pass
    # The diagnostics then make their own pass at each of the 5 saved states; the step after a saved
    # state still starts from the saver's field there (the solver's explicit last evaluation).
    assert _count_passes(monkeypatch, model="mha") == 41 + 5
    monkeypatch.setattr(TimeField, "evaluate", plain)


def test_shared_pass_gives_the_same_diagnostics(monkeypatch):
    """The diagnostics from the shared pass equal those of their own pass (mha with V != A, gf, usa).

    With ``V = A`` (gf, usa here) the pass is the same and so is every bit; with ``V != A`` the pass
    carries ``[V | A]`` value columns, and the field agrees to rounding (a few ulps)."""
    from attnflow.solve.simulation import TimeField

    x0, A = tokens.uniform(30, 3, seed=4), goe_heads(3, 3, 1.5, seed=5)
    runs = {}
    for reuse in (True, False):
        if not reuse:
            monkeypatch.setattr(TimeField, "evaluate", lambda self, t, x: (self(t, x), None))
        for model, proc in (("mha", af.weights.Constant(A, 0.5 * A.transpose(0, 2, 1))), ("gf", A), ("usa", A)):
            runs[reuse, model] = af.simulate(x0, proc, model=model, t_end=0.2, dt=0.02, method="rk4", save_every=2)
    for model in ("mha", "gf", "usa"):
        a, b = runs[True, model], runs[False, model]
        if model == "mha":
            np.testing.assert_allclose(a.x, b.x, rtol=0, atol=1e-14)
        else:
            np.testing.assert_array_equal(a.x, b.x)
        for k in a.diagnostics:
            np.testing.assert_allclose(
                a.diagnostics[k], b.diagnostics[k], rtol=1e-12, atol=1e-15, err_msg=f"{model} {k}"
            )


def test_plain_torch_reference_is_the_same_euler_step():
    """The bench's plain-torch row steps the same problem: equal to simulate's Euler step to rounding;
    control: transposed values give another step."""
    from attnflow.bench.loop import plain_torch_step

    x = torch.as_tensor(tokens.uniform(40, 5, seed=0))
    A = torch.as_tensor(goe_heads(3, 5, 2.0, seed=1))
    V = torch.as_tensor(np.random.default_rng(2).standard_normal((3, 5, 5)))
    ref = af.simulate(x, af.weights.Constant(A.numpy(), V.numpy()), model="mha", t_end=0.1, dt=0.1, method="euler")
    assert np.abs(plain_torch_step(x, A, V, 0.1).numpy() - ref.x[-1]).max() < 1e-14
    assert np.abs(plain_torch_step(x, A, V.transpose(1, 2), 0.1).numpy() - ref.x[-1]).max() > 1e-4


def test_bench_loop_rounds_are_bounded_by_time_and_count(monkeypatch):
    """A loop cell runs at least MIN_ROUNDS rounds, more while under ROUND_SECONDS, at most MAX_ROUNDS;
    repeats= fixes the count; the table's footer states the rounds. Control: a zero budget stops at
    the minimum, an endless one at the maximum."""
    import attnflow.bench.loop as bl

    small = lambda **k: bl.bench_loop(32, 3, 2, torch.float64, 5, steps=10, **k)
    assert small(repeats=2).rounds == 2
    monkeypatch.setattr(bl, "ROUND_SECONDS", 0.0)
    assert small().rounds == bl.MIN_ROUNDS
    monkeypatch.setattr(bl, "ROUND_SECONDS", 1e9)
    monkeypatch.setattr(bl, "MAX_ROUNDS", 5)
    row = small()
    assert row.rounds == 5 and row.evals_per_step > 0 and row.speedup > 0 and "step" in row.split
    text = bl.loop_markdown([row.__dict__, small(repeats=3).__dict__])
    assert "10 steps; each timing the best of 3 to 5 interleaved rounds" in text
