"""Issue 26: one loop for every mode, options that check themselves, a typed run record.

* the same problem through fixed-step, adaptive, ensemble and resumed runs: each offers every state
  to the state guard and to the float32 check (control: a guard that is never called fails the check);
* options that do not apply to the method are refused with one sentence naming the parameter;
* entry validation (grad, meta, int/complex, zero heads, infinite t_end, save_every 2.5, cluster_eps);
* ``cluster_eps`` round-trips through the trajectory, its folder and ``load`` (the confirmed bug).
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

import attnflow as af
from attnflow.config import build, preset_config
from attnflow.config.spec import RunSpec
from attnflow.core import tokens
from attnflow.core.errors import InputError
from attnflow.core.heads import goe_heads
from attnflow.core.tokens import TokenWarning
from attnflow.io.checkpoint import Checkpointer
from attnflow.schemes.integrators import ADAPTIVE, METHODS, get_integrator
from attnflow.solve import loop as loop_mod
from attnflow.solve.controllers import ConstantStep, FixedState, PIController
from attnflow.solve.loop import Trial, integrate
from attnflow.solve.observers import PrecisionCheck
from attnflow.solve.problem import Problem
from attnflow.solve.saveat import SaveAt
from attnflow.solve.solver import solve, stepper
from attnflow.viz.views import cluster_eps_of
from attnflow.weights.processes import OrnsteinUhlenbeck

torch.set_num_threads(1)

X0 = tokens.uniform(12, 3, seed=1)
A = goe_heads(2, 3, 1.5, 3)
OU = OrnsteinUhlenbeck(A, 1.0, 0.3, A0=A, seed=5)
KW = dict(t_end=0.4, dt=0.02, seed=7, dtype=torch.float32)


class Interrupt(Exception):
    pass


@pytest.fixture
def seen(monkeypatch):
    """Counts what the loop hands the state guard and what the float32 check is offered."""
    calls: dict[str, list] = {"guard": [], "float32": []}
    real_guard, real_check = loop_mod.state_problem, PrecisionCheck.on_step

    def guard(x, *a, **k):
        calls["guard"].append(x.detach().clone())
        return real_guard(x, *a, **k)

    def check(self, state):
        calls["float32"].append(state.k)
        return real_check(self, state)

    monkeypatch.setattr(loop_mod, "state_problem", guard)
    monkeypatch.setattr(PrecisionCheck, "on_step", check)
    return calls


def every_state(calls: dict[str, list], trials: int, accepted: range, members: int = 1) -> None:
    """The guard saw every trial state, the float32 check was offered every accepted one (per member)."""
    assert len(calls["guard"]) == trials, f"guard saw {len(calls['guard'])} states of {trials}"
    assert calls["float32"] == [k for k in accepted for _ in range(members)], "float32 check not offered every state"


def test_every_mode_guards_every_state(seen, tmp_path):
    n = 20
    # fixed steps
    traj = af.simulate(X0, OU, method="rk4", **KW)
    every_state(seen, n, range(1, n + 1))
    assert traj.provenance["float32_check"]["checks"] >= 1
    assert all(
        torch.equal(seen["guard"][k - 1].to(torch.float64), torch.from_numpy(traj.x[k])) for k in range(1, n + 1)
    )
    # adaptive steps
    for v in seen.values():
        v.clear()
    traj = af.simulate(X0, OU, method="bosh3", rtol=1e-5, **KW)
    ad = traj.provenance["adaptive"]
    every_state(seen, ad["accepted_steps"] + ad["rejected_steps"], range(1, ad["accepted_steps"] + 1))
    assert traj.provenance["float32_check"]["checks"] >= 1  # adaptive float32 runs are checked too (new)
    # an ensemble of two members
    for v in seen.values():
        v.clear()
    ens = af.simulate_ensemble(X0, OU, betas=[0.5, 1.0], seeds=[1, 2], t_end=0.4, dt=0.02, dtype="float32")
    every_state(seen, n, range(1, n + 1), members=2)
    assert [c["checks"] for c in ens.provenance["float32_check"]] == [1, 1]
    # a resumed run: the states after the checkpoint
    ck = Checkpointer(tmp_path / "c.npz", every_steps=5)

    def stop(k, total):
        if k == 13:
            raise Interrupt

    with pytest.raises(Interrupt):
        af.simulate(X0, OU, method="rk4", checkpoint=ck, progress=stop, **KW)
    for v in seen.values():
        v.clear()
    resumed = af.simulate(X0, OU, method="rk4", resume=tmp_path / "c.npz", **KW)
    assert resumed.provenance["resumed_from_step"] == 10
    every_state(seen, n - 10, range(11, n + 1))


def test_a_guard_that_is_not_called_fails_the_check(seen):
    """Control: a loop given its own guard never calls the state guard, and the check says so."""
    x = torch.from_numpy(X0)
    integrate(
        lambda t, y, h, first: Trial(y, 0.0), x, t=0.0, control=FixedState(0.0, 0.1, 5),
        saves=SaveAt(every=1).start(0.0), guard=lambda y: None,
    )  # fmt: skip
    with pytest.raises(AssertionError, match="guard saw 0 states of 5"):
        every_state(seen, 5, range(1, 6))


def test_the_adaptive_loop_rejects_a_state_off_the_sphere():
    """The state guard, not a NaN test alone: an adaptive trial that leaves the sphere is rejected and retried."""
    x = torch.from_numpy(X0)
    tried = []

    def attempt(t, y, h, first):
        tried.append(h)
        return Trial(y * (2.0 if h > 0.05 else 1.0), 0.0)  # large steps leave the sphere

    control = PIController(rtol=1e-6, atol=1e-9, dt0=0.2).start(1.0, 3, 1.0)
    out = integrate(attempt, x, t=0.0, control=control, saves=SaveAt(times=(1.0,)).start(0.0))
    assert torch.equal(out, x) and tried[0] == 0.2 and min(tried) <= 0.05


@pytest.mark.parametrize("name,value", [("rtol", 1e-3), ("atol", 1e-6), ("dt_min", 1e-4), ("dt_max", 0.1)])
def test_adaptive_options_are_refused_for_fixed_steps(name, value):
    with pytest.raises(InputError) as e:
        af.simulate(X0, A, t_end=0.2, dt=0.02, method="rk4", **{name: value})
    msg = str(e.value)
    assert name in msg and "rk4" in msg and "\n" not in msg and msg.count(". ") == 0, msg
    assert e.value.hint.param == name
    af.simulate(X0, A, t_end=0.2, dt=0.02, method="bosh3", **{name: value})  # the same option is fine there


def test_pi_controller_needs_an_embedded_pair():
    p = Problem.create(X0, A, t_end=0.2)
    with pytest.raises(InputError, match="no error estimate"):
        solve(p, stepper("rk4"), PIController(dt0=0.02), SaveAt(every=1))
    # the pair steps fixed too, under a ConstantStep
    traj = solve(p, stepper("dopri5"), ConstantStep(0.02), SaveAt(every=5))
    assert traj.method == "dopri5" and len(traj.t) == 3


@pytest.mark.parametrize("dtype", ["float32", np.float32, torch.float32, np.dtype("float32")])
def test_dtype_by_name_numpy_or_torch(dtype):
    traj = af.simulate(X0, A, t_end=0.04, dt=0.02, dtype=dtype)
    assert traj.provenance["dtype"] == "float32" and traj.spec.dtype == "float32"


def test_bad_dtype_is_one_sentence():
    with pytest.raises(InputError, match="dtype must be float32 or float64"):
        af.simulate(X0, A, t_end=0.04, dt=0.02, dtype="float16")


def test_tokens_off_the_sphere_warn_once():
    with pytest.warns(TokenWarning, match="projected onto the unit sphere") as rec:
        traj = af.simulate(3.0 * X0, A, t_end=0.04, dt=0.02)
    assert len([w for w in rec if issubclass(w.category, TokenWarning)]) == 1
    np.testing.assert_allclose(traj.x[0], X0, atol=1e-15)
    with warnings.catch_warnings():
        warnings.simplefilter("error", TokenWarning)  # control: unit tokens pass silently
        af.simulate(X0, A, t_end=0.04, dt=0.02)


def _bad_inputs():
    x = torch.from_numpy(X0)
    return [
        ("x0", dict(x0=x.clone().requires_grad_(True)), "requires grad"),
        ("x0", dict(x0=torch.empty(12, 3, device="meta")), "meta device"),
        ("x0", dict(x0=torch.ones(12, 3, dtype=torch.int64)), "floating-point"),
        ("x0", dict(x0=X0.astype(np.complex128)), "must be real"),
        ("weights", dict(weights=np.zeros((0, 3, 3))), "zero heads"),
        ("t_end", dict(t_end=math.inf), "t_end"),
        ("save_every", dict(save_every=2.5), "whole number"),
        ("cluster_eps", dict(cluster_eps=-1.0), "cluster_eps"),
        ("cluster_eps", dict(cluster_eps=math.nan), "cluster_eps"),
        ("weights", dict(weights=torch.from_numpy(A).requires_grad_(True)), "requires grad"),
    ]


@pytest.mark.parametrize("param,change,words", _bad_inputs())
def test_entry_validation_is_one_sentence(param, change, words):
    kw = dict(x0=X0, weights=A, t_end=0.2, dt=0.02)
    kw.update(change)
    with pytest.raises(InputError) as e:
        af.simulate(kw.pop("x0"), kw.pop("weights"), **kw)
    msg = str(e.value)
    assert words in msg and "\n" not in msg, msg
    assert e.value.hint is not None and e.value.hint.param == param


def test_ensemble_entry_validation():
    with pytest.raises(InputError, match="requires grad"):
        af.simulate_ensemble(torch.from_numpy(X0).requires_grad_(True), A, t_end=0.2, dt=0.02)
    with pytest.raises(InputError, match="whole number"):
        af.simulate_ensemble(X0, A, t_end=0.2, dt=0.02, save_every=2.5)


def test_cluster_eps_round_trips_through_the_folder(tmp_path):
    traj = af.simulate(X0, A, t_end=0.2, dt=0.02, cluster_eps=0.3)
    assert traj.spec.cluster_eps == 0.3 and cluster_eps_of(traj) == 0.3
    traj.save(tmp_path / "run", figures=False)
    back = af.load(tmp_path / "run")
    assert back.spec == traj.spec and cluster_eps_of(back) == 0.3
    import xarray as xr

    assert xr.open_zarr(tmp_path / "run" / "dataset.zarr").attrs["cluster_eps"] == 0.3
    # control: the default is what a run without it reports
    plain = af.simulate(X0, A, t_end=0.2, dt=0.02)
    assert cluster_eps_of(plain) == 1e-3
    # and the counts used it: a coarser threshold never counts more clusters
    assert (traj.diagnostics["clusters"] <= plain.diagnostics["clusters"]).all()


def test_build_gives_typed_inputs_that_reproduce_the_run():
    cfg = preset_config("ou")
    inputs = build(cfg)
    assert isinstance(inputs.spec, RunSpec) and inputs.spec.cluster_eps == cfg.diagnostics.cluster_eps
    assert inputs.spec.method == cfg.integration.method and inputs.x0.shape == (cfg.tokens.n, cfg.tokens.d)
    x0, process, kwargs = inputs  # the old triple still unpacks
    assert kwargs["cluster_eps"] == cfg.diagnostics.cluster_eps and x0 is inputs.x0 and process is inputs.process


def test_spec_from_a_folder_is_checked():
    good = af.simulate(X0, A, t_end=0.04, dt=0.02).spec.as_dict()
    assert RunSpec.from_dict(good).as_dict() == good
    for bad in ({**good, "cluster_eps": "0.3"}, {**good, "method": "<script>" * 20}, {**good, "save_every": 2.5}):
        with pytest.raises(InputError, match="invalid"):
            RunSpec.from_dict(bad)


def test_method_names_come_from_the_registry():
    from attnflow.config.schema import IntegrationConfig

    assert set(METHODS) == {"euler", "heun", "rk4", "jko", *ADAPTIVE}
    for m in METHODS:
        assert IntegrationConfig(method=m, t_end=1.0, dt=0.5).method == m
        assert stepper(m).name == m
    with pytest.raises(InputError, match="unknown method"):
        get_integrator("rk5")


def test_threads_argument():
    traj = af.simulate(X0, A, t_end=0.04, dt=0.02, threads=1)
    assert traj.spec.threads == 1
    with pytest.raises(InputError, match="threads"):
        af.simulate(X0, A, t_end=0.04, dt=0.02, threads=0)


def test_default_threads_follow_the_size_and_never_exceed_torch_setting():
    from attnflow.core.threads import available_cores
    from attnflow.solve.problem import thread_policy

    before = torch.get_num_threads()
    try:
        assert thread_policy(None, 10.0).threads == 1  # small: one thread
        torch.set_num_threads(1)  # a process that asked for one thread keeps it, large problem or not
        assert thread_policy(None, 1e12).threads == 1
        assert thread_policy(3, 10.0).threads == 3  # an explicit count wins
        if available_cores() > 1:
            torch.set_num_threads(available_cores())
            assert thread_policy(None, 1e12).threads == available_cores()  # large: the cores
        torch.set_num_threads(1)
        af.simulate(X0, A, t_end=0.04, dt=0.02, threads=2)
        assert torch.get_num_threads() == 1  # restored after the run
    finally:
        torch.set_num_threads(before)
