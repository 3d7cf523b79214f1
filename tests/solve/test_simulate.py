"""Integrators, simulate, trajectories and run folders."""

import json

import numpy as np
import pytest
import torch
import xarray as xr
from scipy.integrate import solve_ivp

import attnflow as af
from attnflow.schemes.integrators import INTEGRATORS
from attnflow.weights.processes import Constant, OrnsteinUhlenbeck, Oscillating
from helpers import random_sym, random_tokens


def _reference(x0, process, model, t_end):
    """scipy's DOP853 at tight tolerance on the same field, flattened."""
    smp = process.sampler()
    N, d = x0.shape

    def rhs(t, y):
        h = smp(t)
        return af.velocity(y.reshape(N, d), h.A.numpy(), None if h.V is None else h.V.numpy(), model=model).ravel()

    sol = solve_ivp(rhs, (0.0, t_end), x0.ravel(), method="DOP853", rtol=1e-13, atol=1e-13)
    return sol.y[:, -1].reshape(N, d)


@pytest.mark.parametrize(
    "case",
    ["gf-oscillating", "mha-constant"],
)
def test_measured_orders(rng, case):
    N, d, H, t_end = 6, 3, 2, 1.0
    x0 = random_tokens(rng, N, d)
    if case == "gf-oscillating":
        process, model = (
            Oscillating(random_sym(rng, H, d) + np.eye(d), random_sym(rng, H, d), [1.3, 2.1], [0.2, 1.0]),
            "gf",
        )
    else:
        process, model = Constant(rng.standard_normal((H, d, d)), rng.standard_normal((H, d, d))), "mha"
    ref = _reference(x0, process, model, t_end)
    for name in ("euler", "heun", "rk4"):  # the explicit schemes; jko has its own convergence test
        integ = INTEGRATORS[name]
        dts = [0.1, 0.05, 0.025] if integ.order > 1 else [0.02, 0.01, 0.005]
        errs = []
        for dt in dts:
            traj = af.simulate(x0, process, model=model, t_end=t_end, dt=dt, method=name, save_every=10**6)
            errs.append(np.abs(traj.x[-1] - ref).max())
        orders = np.log2(np.array(errs[:-1]) / np.array(errs[1:]))
        assert np.all(np.abs(orders - integ.order) < 0.3), (name, errs, orders)


def test_tokens_stay_on_sphere_and_energy_decreases(rng):
    x0 = random_tokens(rng, 40, 3)
    A = random_sym(rng, 3, 3) + 2 * np.eye(3)
    traj = af.simulate(x0, A, model="gf", t_end=5.0, dt=0.01, method="rk4", save_every=1)
    assert np.abs(np.linalg.norm(traj.x, axis=-1) - 1).max() < 1e-12
    E = traj.diagnostics["energy"]
    assert np.all(np.diff(E) <= 1e-12 * np.abs(E[:-1]))
    assert E[-1] < E[0]
    # Along gf, the metric speed equals the slope at every saved time.
    np.testing.assert_allclose(traj.diagnostics["metric_speed"], traj.diagnostics["slope"], rtol=1e-10)
    for method in ("euler", "heun"):
        t2 = af.simulate(x0, A, model="gf", t_end=1.0, dt=0.01, method=method)
        assert np.abs(np.linalg.norm(t2.x, axis=-1) - 1).max() < 1e-12


def test_reproducible_with_seed(rng):
    x0 = random_tokens(rng, 20, 3)
    ou = OrnsteinUhlenbeck(np.stack([3 * np.eye(3)] * 4), rate=1.0, sigma=1.0)
    kw = dict(model="gf", t_end=1.0, dt=0.05, save_every=5)
    a, b, c = (af.simulate(x0, ou, seed=s, **kw) for s in (1, 1, 2))
    np.testing.assert_array_equal(a.x, b.x)
    np.testing.assert_array_equal(a.A, b.A)
    assert not np.allclose(a.x[-1], c.x[-1])


def test_diagnostics_values(rng):
    # Two antipodal clusters of 3 identical tokens each.
    p = np.array([0.0, 0.0, 1.0])
    x0 = np.array([p, p, p, -p, -p, -p])
    traj = af.simulate(x0, np.eye(3)[None], model="gf", t_end=0.1, dt=0.05)
    d = traj.diagnostics
    assert d["clusters"][0] == 2 and d["order_parameter"][0] == pytest.approx(0.0, abs=1e-15)
    assert d["min_inner"][0] == pytest.approx(-1.0) and d["mean_inner"][0] == pytest.approx(
        (12 * 1 + 18 * -1) / 30
    )  # ordered pairs i != j
    # The state is stationary: slope 0, and F = -1/2 (1/2 e + 1/2 e^{-1}).
    assert d["slope"][0] < 1e-14 and np.abs(traj.x[-1] - x0).max() < 1e-14
    assert d["energy"][0] == pytest.approx(-0.25 * (np.e + np.exp(-1)), rel=1e-13)


def test_simulate_rejects_bad_input(rng):
    x0 = random_tokens(rng, 5, 3)
    with pytest.raises(ValueError, match="whole number of steps"):
        af.simulate(x0, np.eye(3)[None], t_end=1.0, dt=0.3)
    with pytest.raises(ValueError, match="symmetric"):
        af.simulate(x0, rng.standard_normal((2, 3, 3)), model="gf", t_end=1.0, dt=0.5)
    with pytest.raises(ValueError, match="unknown method"):
        af.simulate(x0, np.eye(3)[None], t_end=1.0, dt=0.5, method="rk45")
    with pytest.raises(ValueError, match="dimension"):
        af.simulate(random_tokens(rng, 5, 4), np.eye(3)[None], t_end=1.0, dt=0.5)


def test_float32_runs(rng):
    x0 = random_tokens(rng, 30, 3)
    traj = af.simulate(x0, 2 * np.eye(3)[None], model="gf", t_end=1.0, dt=0.05, dtype=torch.float32)
    ref = af.simulate(x0, 2 * np.eye(3)[None], model="gf", t_end=1.0, dt=0.05)
    assert np.abs(traj.x[-1] - ref.x[-1]).max() < 1e-5


def test_save_load_roundtrip_and_xarray(rng, tmp_path):
    x0 = random_tokens(rng, 12, 3)
    A = random_sym(rng, 2, 3)
    traj = af.simulate(x0, Constant(A, -A), model="mha", t_end=0.5, dt=0.05, save_every=2, seed=3, config={"note": "x"})
    path = traj.save(tmp_path / "run", figures=True)
    assert (path / "figures" / "snapshots.png").is_file() and (path / "figures" / "diagnostics.png").is_file()
    prov = json.loads((path / "provenance.json").read_text())
    assert prov["complete"] is True and prov["seed"] == 3 and prov["attnflow_version"] == af.__version__
    ds = xr.open_zarr(path / "dataset.zarr")
    np.testing.assert_array_equal(ds["x"].values, traj.x)
    np.testing.assert_array_equal(ds["time"].values, traj.t)
    back = af.load(path)
    np.testing.assert_array_equal(back.x, traj.x)
    np.testing.assert_array_equal(back.V, traj.V)
    for k, v in traj.diagnostics.items():
        np.testing.assert_array_equal(back.diagnostics[k], v)
    assert back.config == {"note": "x"} and back.model == "mha" and back.seed == 3
    assert list(traj.t) == pytest.approx([0, 0.1, 0.2, 0.3, 0.4, 0.5])
    with pytest.raises(FileExistsError):
        traj.save(tmp_path / "run")


def test_save_is_atomic(rng, tmp_path, monkeypatch):
    traj = af.simulate(random_tokens(rng, 5, 3), np.eye(3)[None], t_end=0.1, dt=0.05)
    import attnflow.viz.plotting

    def boom(*a, **k):
        raise RuntimeError("disk full")

    monkeypatch.setattr(attnflow.viz.plotting, "plot_run", boom)
    with pytest.raises(RuntimeError):
        traj.save(tmp_path / "run")
    assert list(tmp_path.iterdir()) == []  # neither the folder nor a temporary is left behind


def test_config_kernel_section_reaches_simulate():
    from attnflow.config import ConfigError, build, parse_config

    cfg = parse_config({"kernel": {"backend": "stream", "tolerance": 1e-8}})
    _, _, kwargs = build(cfg)
    assert kwargs["backend"] == "stream" and kwargs["fast_tol"] == 1e-8
    with pytest.raises(ConfigError, match="d <= 4"):
        parse_config({"model": "mha", "tokens": {"d": 5}, "kernel": {"backend": "fast"}})
    with pytest.raises(ConfigError, match="kernel.tolerance"):
        parse_config({"kernel": {"tolerance": 0}})
