"""Batched ensembles: every member equals its own single `simulate` run."""

import numpy as np
import pytest

from attnflow import simulate, tokens
from attnflow.core.heads import goe_heads, identity_heads
from attnflow.solve.ensemble import simulate_ensemble
from attnflow.weights.processes import OrnsteinUhlenbeck


def test_members_equal_single_runs_over_betas():
    N, d, H = 24, 3, 2
    x0 = np.stack([tokens.uniform(N, d, seed=s) for s in range(3)])
    A = goe_heads(H, d, 1.0, seed=0)
    betas = [0.5, 2.0, 4.0]
    ens = simulate_ensemble(x0, A, betas=betas, model="gf", t_end=0.4, dt=0.05, method="rk4", save_every=2)
    assert ens.x.shape == (len(ens.t), 3, N, d)
    for b, beta in enumerate(betas):
        single = simulate(x0[b], beta * A, model="gf", t_end=0.4, dt=0.05, method="rk4", save_every=2)
        assert np.abs(ens.x[:, b] - single.x).max() < 1e-12
        assert np.allclose(ens.diagnostics["order_parameter"][:, b], single.diagnostics["order_parameter"], rtol=1e-12)
        assert np.allclose(ens.diagnostics["log_abs_energy"][:, b], single.diagnostics["log_abs_energy"], rtol=1e-12)
        assert np.allclose(
            ens.diagnostics["mean_inner"][:, b], single.diagnostics["mean_inner"], rtol=1e-10, atol=1e-13
        )


def test_members_equal_single_runs_over_seeds_with_ou_weights():
    N, d, H = 16, 3, 3
    x0 = tokens.uniform(N, d, seed=7)  # one cloud shared by every member
    proc = OrnsteinUhlenbeck(identity_heads(H, d, 2.0), rate=1.0, sigma=0.5)
    seeds = [1, 2, 3, 4]
    ens = simulate_ensemble(x0, proc, seeds=seeds, model="mha", t_end=0.3, dt=0.1, method="heun")
    for b, s in enumerate(seeds):
        single = simulate(x0, proc, seed=s, model="mha", t_end=0.3, dt=0.1, method="heun")
        assert np.abs(ens.x[:, b] - single.x).max() < 1e-12
    # Different seeds really give different weight paths.
    assert np.abs(ens.x[-1, 0] - ens.x[-1, 1]).max() > 1e-6


def test_ensemble_to_xarray_and_size_errors():
    x0 = tokens.uniform(10, 3, seed=0)
    ens = simulate_ensemble(x0, identity_heads(2, 3), betas=[1.0, 2.0], t_end=0.1, dt=0.05, method="euler")
    ds = ens.to_xarray()
    assert ds["x"].shape == (3, 2, 10, 3) and list(ds["beta"].values) == [1.0, 2.0]
    with pytest.raises(ValueError, match="different ensemble sizes"):
        simulate_ensemble(np.stack([x0, x0]), identity_heads(2, 3), betas=[1.0, 2.0, 3.0], t_end=0.1, dt=0.05)
