"""Small runs at native speed (issue 43): compiled fixed steps and deferred, bulk diagnostics of the
saved states give the torch path's trajectory and diagnostics to rounding, and resume bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import attnflow as af
from attnflow.analysis.diagnostics import DIAGNOSTICS
from attnflow.core.heads import goe_heads
from attnflow.io.checkpoint import Checkpointer

torch.set_num_threads(1)


def _x0(N: int, d: int, seed: int = 0) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((N, d))
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _close(new: af.Trajectory, old: af.Trajectory, tol: float) -> float:
    """The largest relative difference of the saved states and every diagnostic."""
    assert np.array_equal(new.t, old.t)
    worst = float(np.abs(new.x - old.x).max())
    for k in DIAGNOSTICS:
        a, b = new.diagnostics[k], old.diagnostics[k]
        if k == "clusters":
            assert np.array_equal(a, b)
            continue
        worst = max(worst, float((np.abs(a - b) / np.maximum(1.0, np.abs(b))).max()))
    assert worst < tol, worst
    return worst


@pytest.mark.parametrize(
    "model,method,kw",
    [
        ("mha", "rk4", {}),
        ("gf", "heun", {"record_steps": False}),
        ("mha", "euler", {}),
        ("mha", "dop853", {}),  # a pair's fixed-step form
        ("gf", "dopri5", {"rtol": 1e-8, "record_steps": False}),  # adaptive: compiled steps, deferred saves
        ("mha", "dop853", {"rtol": 1e-9}),  # dense saves
    ],
)
def test_compiled_path_equals_the_torch_path(model: str, method: str, kw: dict) -> None:
    x0 = _x0(12, 3)
    A = goe_heads(2, 3, 1.5, seed=1)
    base = dict(model=model, t_end=1.0, dt=0.05, method=method, save_every=2, **kw)
    new = af.simulate(x0, A, **base)
    old = af.simulate(x0, A, backend="flash", **base)  # the torch kernel, diagnostics at each save
    assert new.provenance["deferred_diagnostics"] and not old.provenance["deferred_diagnostics"]
    if method in ("rk4", "heun", "euler") or "rtol" not in kw and method == "dop853":
        assert new.provenance["compiled_steps"] and not old.provenance["compiled_steps"]
    worst = _close(new, old, 1e-11)
    print(f"{model} {method}: compiled vs torch, largest relative difference {worst:.1e} (bound 1e-11)")


def test_negative_control_another_run_is_told_apart() -> None:
    x0 = _x0(12, 3)
    A = goe_heads(2, 3, 1.5, seed=1)
    new = af.simulate(x0, A, model="mha", t_end=1.0, dt=0.05, method="rk4", save_every=2)
    other = af.simulate(x0, 1.001 * A, model="mha", t_end=1.0, dt=0.05, method="rk4", save_every=2, backend="flash")
    with pytest.raises(AssertionError):
        _close(new, other, 1e-11)


def test_resume_is_bit_identical_on_the_compiled_path(tmp_path) -> None:
    x0 = _x0(10, 3, seed=3)
    A = goe_heads(1, 3, 2.0, seed=4)
    kw = dict(model="mha", t_end=0.6, dt=0.02, method="rk4", save_every=3)
    full = af.simulate(x0, A, **kw)
    ck = Checkpointer(tmp_path / "c.npz", every_steps=9)
    af.simulate(x0, A, checkpoint=ck, **kw)
    from attnflow.io.checkpoint import load_checkpoint

    part = load_checkpoint(tmp_path / "c.npz")
    assert 0 < part.step < 30
    resumed = af.simulate(x0, A, resume=part, **kw)
    assert np.array_equal(resumed.x, full.x) and np.array_equal(resumed.t, full.t)
    for k in DIAGNOSTICS:
        np.testing.assert_array_equal(resumed.diagnostics[k], full.diagnostics[k])


def test_degenerate_inputs_keep_the_torch_path() -> None:
    x0 = _x0(12, 3)
    A = goe_heads(2, 3, 1.5, seed=1)
    usa = af.simulate(x0, A, model="usa", t_end=0.1, dt=0.05, method="rk4")
    assert not usa.provenance["compiled_steps"] and not usa.provenance["deferred_diagnostics"]
    f32 = af.simulate(x0, A, model="mha", t_end=0.1, dt=0.05, method="rk4", dtype="float32")
    assert not f32.provenance["compiled_steps"] and not f32.provenance["deferred_diagnostics"]
    gf = af.simulate(x0, A, model="gf", t_end=0.1, dt=0.05, method="rk4")  # the EDI recorder runs
    assert not gf.provenance["compiled_steps"] and not gf.provenance["deferred_diagnostics"]


def test_default_save_cadence_of_adaptive_runs() -> None:
    from attnflow.solve.saveat import DEFAULT_ADAPTIVE_SAVES, default_save_every

    assert default_save_every(False, 1000.0, 0.01) == 1  # fixed steps: every step
    assert default_save_every(True, 30.0, 0.1) == 1  # 300 saves: every dt
    assert default_save_every(True, 10.0, 0.01) == 1  # exactly 1,000: every dt
    assert default_save_every(True, 1000.0, 0.01) == 100  # long: 1,000 saves
    assert default_save_every(True, 10.5, 0.01) == 2
    x0 = _x0(6, 3)
    A = goe_heads(1, 3, 1.0, seed=2)
    tr = af.simulate(x0, A, model="mha", t_end=30.0, dt=0.01, method="dop853")
    assert len(tr.t) == DEFAULT_ADAPTIVE_SAVES + 1 and tr.t[1] == pytest.approx(0.03)
    fixed = af.simulate(x0, A, model="mha", t_end=0.5, dt=0.01, method="rk4")
    assert len(fixed.t) == 51  # negative control: fixed steps keep every step


def test_deferred_diagnostics_are_made_on_first_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """A run with deferred diagnostics hands its trajectory the recipe (issue 43: a caller that reads only
    the states does not pay for them): the bulk pass runs once, when ``traj.diagnostics`` is first
    read, with the numbers of the table made at once; a pickled or copied trajectory carries them.
    Control: a run through the torch kernel (no deferred diagnostics) makes them during the run."""
    import copy
    import pickle

    from attnflow.solve import observers

    calls: list[int] = []
    real = observers.bulk_state_table

    def counted(*args: object, **kw: object) -> dict[str, np.ndarray]:
        calls.append(1)
        return real(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(observers, "bulk_state_table", counted)
    x0, A = _x0(12, 3), goe_heads(2, 3, 1.5, seed=1)
    base = dict(model="mha", t_end=2.0, dt=0.05, method="dop853", rtol=1e-9)
    traj = af.simulate(x0, A, **base)
    assert traj.provenance["deferred_diagnostics"] and calls == [] and len(traj.t) == 41
    table = traj.diagnostics
    assert calls == [1] and traj.diagnostics is table and table["clusters"].dtype == np.int64
    again = af.simulate(x0, A, **base)
    assert calls == [1]
    for other in (pickle.loads(pickle.dumps(again)), copy.deepcopy(af.simulate(x0, A, **base))):
        assert set(other.diagnostics) == set(table)
        for k in table:
            assert np.array_equal(other.diagnostics[k], table[k]), k
    assert calls == [1, 1, 1]
    flash = af.simulate(x0, A, backend="flash", **base)
    assert not flash.provenance["deferred_diagnostics"] and calls == [1, 1, 1]
    assert "_deferred_diagnostics" not in vars(flash) and "diagnostics" in vars(flash)
    with pytest.raises(AttributeError, match="no attribute 'diagnostic'"):
        traj.diagnostic  # noqa: B018 - a misspelt attribute still fails as usual
