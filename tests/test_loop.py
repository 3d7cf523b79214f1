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
from attnflow.solve.guards import NumericalInstability
from attnflow.solve.loop import Costs, StepFailed, StepState, run_loop


class Count:
    name = "count"

    def __init__(self):
        self.states: list[StepState] = []

    def on_step(self, state: StepState) -> None:
        self.states.append(state)


def test_loop_steps_saves_and_reports_costs():
    x = torch.ones(3, 2, dtype=torch.float64)
    obs, costs = Count(), Costs({})
    out = run_loop(
        lambda t, y, h: y + h, x, t0=1.0, dt=0.25, k0=0, n_steps=6, save_every=4, observers=[obs], costs=costs
    )
    assert torch.equal(out, x + 1.5)
    assert [s.k for s in obs.states] == [1, 2, 3, 4, 5, 6]
    assert [s.t for s in obs.states] == [1.25, 1.5, 1.75, 2.0, 2.25, 2.5]  # t0 + k dt exactly
    assert [s.save for s in obs.states] == [False, False, False, True, False, True]  # every 4 and the last
    assert set(costs.seconds) == {"step", "count"} and all(v >= 0 for v in costs.seconds.values())


def test_loop_stops_at_nan_and_rolls_back():
    undone = []
    step = lambda t, y, h: y * np.nan if t >= 0.5 else y + h
    with pytest.raises(StepFailed) as e:
        run_loop(step, torch.zeros(2), t0=0.0, dt=0.25, k0=0, n_steps=8, save_every=1,
                 rollback=lambda: lambda: undone.append(1))  # fmt: skip
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
        assert len(tols) >= 6 and set(tols) == {1e-9}
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
