"""Batched ensembles: every member equals its own single `simulate` run."""

import numpy as np
import pytest

from attnflow import simulate, tokens
from attnflow.analysis.diagnostics import energy_and_slope
from attnflow.core.heads import Heads, goe_heads, identity_heads
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
        assert np.allclose(np.exp(ens.diagnostics["log_slope"][:, b]), single.diagnostics["slope"], rtol=1e-12)
        F, s = energy_and_slope(ens.diagnostics["log_abs_energy"][:, b], ens.diagnostics["log_slope"][:, b])
        assert np.allclose(F, single.diagnostics["energy"], rtol=1e-12) and np.all(F < 0)
        assert np.allclose(s, single.diagnostics["slope"], rtol=1e-12)
    # Past the float range: -inf and inf, not an overflow; a critical point's log slope -inf is a slope of 0.
    F, s = energy_and_slope(np.array([[800.0, 0.0]]), np.array([[-np.inf, 800.0]]))
    assert F.shape == (1, 2) and F[0, 0] == -np.inf and F[0, 1] == -1.0 and s[0, 0] == 0.0 and s[0, 1] == np.inf


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


def test_member_slope_is_the_gradient_flows_whatever_the_values():
    """``log_slope`` is ``log |dF|``, the gradient flow's slope (outputs of ``A_h x_j``), also for heads with their
    own values ``V_h`` run as ``mha``: each member's equals its single run's ``slope`` (which reads ``A``), and the
    slope decays to 0 along ``gf`` (a critical point). Control: the same pass with the values ``V_h`` (what the
    field of ``mha`` reads) gives a different number, so the check can tell the two apart."""
    import torch

    N, d, H = 12, 3, 2
    x0 = np.stack([tokens.uniform(N, d, seed=s) for s in range(2)])
    A = goe_heads(H, d, 1.0, seed=1)
    heads = Heads.from_matrices(A, V=goe_heads(H, d, 1.0, seed=2))
    ens = simulate_ensemble(x0, heads, model="mha", t_end=0.3, dt=0.05, method="rk4", save_every=2)
    for b in range(2):
        single = simulate(x0[b], heads, model="mha", t_end=0.3, dt=0.05, method="rk4", save_every=2)
        assert np.allclose(np.exp(ens.diagnostics["log_slope"][:, b]), single.diagnostics["slope"], rtol=1e-12)
    from attnflow.dynamics.fields import masses
    from attnflow.solve.ensemble import EnsembleField
    from attnflow.weights.processes import Constant

    X = torch.from_numpy(ens.x[-1])
    a = masses(None, N, "token_weights", X)
    f = EnsembleField("mha", [Constant(heads).sampler()] * 2, np.ones(2), a, masses(None, H, "head_weights", X),
                      X.dtype, X.device)  # fmt: skip
    with_v = f.stats(0.0, X).log_slope(X, a).numpy()
    assert np.allclose(f.stats(0.0, X, of_A=True).log_slope(X, a).numpy(), ens.diagnostics["log_slope"][-1])
    assert np.abs(with_v - ens.diagnostics["log_slope"][-1]).min() > 1e-3
    caps = np.stack([tokens.cap(N, d, 1.0, seed=s) for s in range(2)])  # one cluster forms: F's critical point
    gf = simulate_ensemble(caps, identity_heads(H, d, 2.0), model="gf", t_end=8.0, dt=0.05, method="rk4", save_every=40)
    assert np.all(gf.diagnostics["log_slope"][-1] < gf.diagnostics["log_slope"][0] - 5.0)
