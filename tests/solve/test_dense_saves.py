"""Saves through DOP853's dense output (compiled small-cloud runs): steps no longer stop at save
times, so a run with many saves needs far fewer evaluations, and its saved states are as accurate
as those of a run that stops at every save. The compiled interpolant equals the torch one."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnflow import simulate
from attnflow.core.heads import Heads
from attnflow.dynamics.fields import field_stats, prepare
from attnflow.kernels import small
from attnflow.schemes.integrators import DOP853
from attnflow.solve import saveat

pytestmark = pytest.mark.skipif(not small.AVAILABLE, reason="numba is not installed")


def cloud(N: int = 16, seed: int = 0) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((N, 3))
    return x / np.linalg.norm(x, axis=1, keepdims=True)


HEADS = Heads(K=torch.tensor(9.0 * np.eye(3)[None]), V=torch.tensor(np.eye(3)[None]))
KW = dict(model="mha", t_end=3.0, dt=0.01, save_every=1, method="dop853", rtol=1e-9, atol=1e-11)


def run(dense: bool, monkeypatch, **kw):
    monkeypatch.setattr(saveat, "DENSE_SAVES", dense)
    return simulate(cloud(), HEADS, **{**KW, **kw})


def reference(t: np.ndarray) -> np.ndarray:
    """SciPy's DOP853 at rtol 1e-13 on the plain NumPy field of the same problem, at the times ``t``."""
    from scipy.integrate import solve_ivp

    from attnflow.bench.small import _numpy_field

    x0 = cloud()
    sol = solve_ivp(_numpy_field(len(x0), 9.0), (0.0, 3.0), x0.ravel(), method="DOP853", rtol=1e-13, atol=1e-15,
                    t_eval=t)  # fmt: skip
    y = sol.y.T.reshape(len(t), len(x0), 3)
    return y / np.linalg.norm(y, axis=-1, keepdims=True)


def scipy_dense(t: np.ndarray) -> np.ndarray:
    from scipy.integrate import solve_ivp

    from attnflow.bench.small import _numpy_field

    x0 = cloud()
    sol = solve_ivp(_numpy_field(len(x0), 9.0), (0.0, 3.0), x0.ravel(), method="DOP853", rtol=KW["rtol"],
                    atol=KW["atol"], dense_output=True)  # fmt: skip
    y = sol.sol(t).T.reshape(len(t), len(x0), 3)
    return y / np.linalg.norm(y, axis=-1, keepdims=True)


def test_dense_saves_cut_evaluations_and_keep_accuracy(monkeypatch):
    stop = run(False, monkeypatch)
    dense = run(True, monkeypatch)
    assert dense.provenance["adaptive"]["dense_saves"] and not stop.provenance["adaptive"]["dense_saves"]
    assert np.array_equal(dense.t, stop.t) and len(dense.t) == 301
    ref = reference(dense.t)
    ev_dense, ev_stop = (r.provenance["adaptive"]["field_evaluations"] for r in (dense, stop))
    err_dense, err_stop = (float(np.abs(r.x - ref).max()) for r in (dense, stop))
    # The scale: SciPy's own DOP853 dense output at the same tolerances on the same problem (an
    # interpolant's error sits near the tolerance, above the steps' ends: SciPy's 5.7e-9 vs 7.9e-11 here).
    err_scipy = float(np.abs(scipy_dense(dense.t) - ref).max())
    print(f"301 saves: {ev_stop} evaluations stopping at saves, {ev_dense} with dense output; errors "
          f"{err_stop:.1e} and {err_dense:.1e} (SciPy's dense output: {err_scipy:.1e})")  # fmt: skip
    assert ev_dense * 5 < ev_stop
    assert 0 < err_dense <= err_scipy
    assert np.abs(np.linalg.norm(dense.x, axis=-1) - 1.0).max() < 1e-14  # retracted onto the sphere


def test_dense_saves_negative_control(monkeypatch):
    """A corrupted interpolant coefficient (one D entry off by 1e-3) moves the saved states between
    steps by far more than the correct interpolant's error: the comparison above can fail."""
    ref = reference(np.linspace(0.0, 3.0, 301))
    good = float(np.abs(run(True, monkeypatch).x - ref).max())
    cx, Ax, D = DOP853.dense_arrays()
    D = D.copy()
    D[1, 5] += 1e-3
    monkeypatch.setattr(type(DOP853), "dense_arrays", lambda self: (cx, Ax, D))
    dev = float(np.abs(run(True, monkeypatch).x - ref).max())
    print(f"corrupted D entry: saves {dev:.1e} from the reference (correct: {good:.1e})")
    assert dev > 100 * good


def test_compiled_dense_output_equals_torch():
    x = cloud(12, seed=4)
    A, V = 3.0 * np.eye(3)[None], np.eye(3)[None]
    a, w = np.full(12, 1 / 12), np.ones(1)
    step = small.SmallStep(A, V, w, a, "gf", DOP853.arrays(), 1e-8, 1e-10, DOP853.dense_arrays())
    h = 0.3
    y, err, ks, ok = step.attempt(x, h)
    F, ok2 = step.dense(x, y, ks, h)
    assert ok and ok2
    xt, heads, at, wt = prepare(torch.from_numpy(x), torch.from_numpy(A), torch.from_numpy(V), a, w)

    def f(t, z):
        return field_stats(z, heads, at, wt).velocity(z, "gf")

    Ft = DOP853.dense_coefficients(f, 0.0, xt, torch.from_numpy(y), [torch.from_numpy(k) for k in ks], h)
    for theta in (0.2, 0.5, 0.9):
        got = small.dense_value(x, F, theta)
        want = DOP853.dense_value(xt, Ft, theta).numpy()
        assert np.abs(got - want).max() < 1e-13, theta


def test_torch_path_saves_through_the_dense_output_too(monkeypatch):
    """The torch kernel's path (backend 'flash': not compiled) interpolates the same saves: its states
    equal the compiled run's, with the same evaluation count, far below stopping at every save."""
    kw = dict(t_end=1.0, backend="flash")
    compiled = run(True, monkeypatch, t_end=1.0)
    torch_dense = run(True, monkeypatch, **kw)
    torch_stop = run(False, monkeypatch, **kw)
    ad = torch_dense.provenance["adaptive"]
    assert ad["dense_saves"] and not ad["compiled"] and compiled.provenance["adaptive"]["compiled"]
    assert np.abs(torch_dense.x - compiled.x).max() < 1e-11
    assert ad["field_evaluations"] == compiled.provenance["adaptive"]["field_evaluations"]
    assert ad["field_evaluations"] * 3 < torch_stop.provenance["adaptive"]["field_evaluations"]
