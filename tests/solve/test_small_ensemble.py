"""Adaptive ensembles: every member with its own step control, stepping exactly as its single run."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnflow import simulate, simulate_ensemble
from attnflow.core.heads import Heads
from attnflow.kernels import small

pytestmark = pytest.mark.skipif(not small.AVAILABLE, reason="numba is not installed")


def clouds(B: int, N: int, seed: int = 0) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((B, N, 3))
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


@pytest.mark.parametrize("method", ["dopri5", "dop853"])
def test_member_equals_its_single_run(method):
    B, N = 4, 12
    X = clouds(B, N)
    betas = np.array([1.0, 3.0, 6.0, 9.0])
    heads = Heads(K=torch.tensor(np.eye(3)[None]), V=torch.tensor(np.eye(3)[None]))
    ens = simulate_ensemble(X, heads, model="mha", t_end=6.0, dt=0.05, save_every=20, betas=betas, method=method,
                            rtol=1e-8, atol=1e-10)  # fmt: skip
    for b in range(B):
        hb = Heads(K=torch.tensor(betas[b] * np.eye(3)[None]), V=torch.tensor(np.eye(3)[None]))
        tr = simulate(X[b], hb, model="mha", t_end=6.0, dt=0.05, save_every=20, method=method, rtol=1e-8, atol=1e-10)
        assert np.array_equal(ens.t, tr.t)
        assert np.abs(ens.x[:, b] - tr.x).max() < 1e-12, b
        assert ens.provenance["adaptive"]["accepted_steps"][b] == tr.provenance["adaptive"]["accepted_steps"]
        # dop853 saves through its dense output in both (steps pass the 6 save times), dopri5 stops at them.
        assert tr.provenance["adaptive"]["dense_saves"] == (method == "dop853")
        # A single run counts the saver's pass at each saved state as the next step's first stage.
        n_saves = len(tr.t) - 1
        assert (
            0
            <= tr.provenance["adaptive"]["field_evaluations"] - ens.provenance["adaptive"]["field_evaluations"][b]
            <= n_saves
        )


def test_members_are_not_interchangeable():
    """Control: the comparison above sees a member paired with the wrong temperature."""
    X = clouds(2, 12)
    heads = Heads(K=torch.tensor(np.eye(3)[None]), V=torch.tensor(np.eye(3)[None]))
    ens = simulate_ensemble(X, heads, model="mha", t_end=6.0, dt=0.05, save_every=20, betas=[1.0, 9.0],
                            method="dop853", rtol=1e-8, atol=1e-10)  # fmt: skip
    wrong = Heads(K=torch.tensor(9.0 * np.eye(3)[None]), V=torch.tensor(np.eye(3)[None]))
    tr = simulate(X[0], wrong, model="mha", t_end=6.0, dt=0.05, save_every=20, method="dop853", rtol=1e-8, atol=1e-10)
    assert np.abs(ens.x[-1, 0] - tr.x[-1]).max() > 1e-3


def test_adaptive_ensemble_refuses_time_dependent_weights():
    from attnflow.core.errors import InputError
    from attnflow.weights import OrnsteinUhlenbeck

    A = np.eye(3)[None] * 2.0
    with pytest.raises(InputError, match="constant weights"):
        simulate_ensemble(clouds(2, 8), OrnsteinUhlenbeck(A, rate=1.0, sigma=0.1), model="gf", t_end=1.0, dt=0.1,
                          method="dopri5", seeds=[0, 1])  # fmt: skip


def test_threads_share_members_without_changing_them():
    """Members shared out to two threads step exactly as on one (the compiled loop releases the GIL)."""
    X = clouds(5, 10, seed=2)
    heads = Heads(K=torch.tensor(4.0 * np.eye(3)[None]))
    kw = dict(model="gf", t_end=3.0, dt=0.05, save_every=20, method="dop853", rtol=1e-8, atol=1e-10)
    one = simulate_ensemble(X, heads, threads=1, **kw)
    two = simulate_ensemble(X, heads, threads=2, **kw)
    assert one.provenance["adaptive"]["threads"] == 1 and two.provenance["adaptive"]["threads"] == 2
    assert np.array_equal(one.x, two.x)
    assert one.provenance["adaptive"]["field_evaluations"] == two.provenance["adaptive"]["field_evaluations"]


def test_automatic_threads_follow_the_work(monkeypatch):
    from attnflow.core import threads as th
    from attnflow.core.errors import InputError

    monkeypatch.setattr(th, "load_average", lambda: 64.0)  # busy cores: mid-sized work on one thread
    from attnflow.core.threads import SMALL_WORK_PAIRS, available_cores
    from attnflow.solve.ensemble import ensemble_threads

    assert ensemble_threads(None, 100, 32, 1, 13) == 1  # 1.3e6 values a round: one thread
    B = SMALL_WORK_PAIRS // (13 * 64 * 64) + 1  # a round above the policy's threshold: the cores
    assert ensemble_threads(None, B, 64, 1, 13) == min(B, available_cores())
    assert ensemble_threads(3, 4, 8, 1, 13) == 3
    assert ensemble_threads(8, 2, 8, 1, 13) == 2  # never more threads than members
    with pytest.raises(InputError):
        ensemble_threads(0, 4, 8, 1, 13)
