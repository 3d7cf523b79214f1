"""Property-based tests (hypothesis) of the simulator's invariants over random configurations:
tokens stay on the sphere, the gf energy decreases with constant weights, permutation equivariance
of tokens and of heads, rotation equivariance when the weights rotate with the tokens."""

from __future__ import annotations

import warnings

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import special_ortho_group

from attnflow import simulate
from attnflow.solve.guards import StabilityWarning

torch.set_num_threads(1)
SETTINGS = settings(max_examples=20, deadline=None)


@st.composite
def setups(draw, symmetric=False):
    n = draw(st.integers(2, 12))
    d = draw(st.integers(2, 5))
    H = draw(st.integers(1, 3))
    seed = draw(st.integers(0, 2**31 - 1))
    beta = draw(st.floats(0.1, 6.0))
    rng = np.random.default_rng(seed)
    x0 = rng.standard_normal((n, d))
    G = rng.standard_normal((H, d, d))
    A = beta * ((G + G.transpose(0, 2, 1)) / 2 if symmetric else G) / np.sqrt(d)
    a = rng.uniform(0.2, 1.0, n)
    w = rng.uniform(0.2, 1.0, H)
    return {
        "x0": x0,
        "A": A,
        "a": a / a.sum(),
        "w": w / w.sum(),
        "model": "gf" if symmetric else draw(st.sampled_from(["mha", "usa"])),
        "method": draw(st.sampled_from(["euler", "heun", "rk4"])),
        "seed": seed,
    }


def run(s, x0=None, A=None, a=None, w=None, n_steps=8):
    A = s["A"] if A is None else A
    L = float(np.linalg.norm(A, 2, axis=(1, 2)).max())
    dt = 0.2 / max(L, 1.0) if s["model"] != "usa" else 0.1 / max(L * np.exp(L), 1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", StabilityWarning)
        return simulate(
            s["x0"] if x0 is None else x0,
            A,
            model=s["model"],
            t_end=n_steps * dt,
            dt=dt,
            method=s["method"],
            save_every=1,
            token_weights=s["a"] if a is None else a,
            head_weights=s["w"] if w is None else w,
        )


@SETTINGS
@given(setups())
def test_tokens_stay_on_the_sphere(s):
    tr = run(s)
    assert np.abs(np.linalg.norm(tr.x, axis=-1) - 1.0).max() < 1e-13


@SETTINGS
@given(setups(symmetric=True))
def test_gf_energy_decreases_with_constant_weights(s):
    E = run(s, n_steps=12).diagnostics["energy"]
    assert np.all(np.diff(E) <= 1e-12 * np.abs(E).max())


@SETTINGS
@given(setups(), st.data())
def test_permuting_tokens_permutes_the_trajectory(s, data):
    perm = np.array(data.draw(st.permutations(range(len(s["a"])))))
    base, moved = run(s), run(s, x0=s["x0"][perm], a=s["a"][perm])
    np.testing.assert_allclose(moved.x, base.x[:, perm], rtol=0, atol=1e-12)
    np.testing.assert_allclose(moved.diagnostics["energy"], base.diagnostics["energy"], rtol=1e-12)


@SETTINGS
@given(setups(), st.data())
def test_permuting_heads_changes_nothing(s, data):
    perm = np.array(data.draw(st.permutations(range(len(s["w"])))))
    base, moved = run(s), run(s, A=s["A"][perm], w=s["w"][perm])
    np.testing.assert_allclose(moved.x, base.x, rtol=0, atol=1e-12)


@SETTINGS
@given(setups(), st.integers(0, 2**31 - 1))
def test_rotating_tokens_and_weights_rotates_the_trajectory(s, rseed):
    d = s["x0"].shape[1]
    R = special_ortho_group.rvs(d, random_state=rseed) if d > 1 else np.eye(1)
    base = run(s)
    rot = run(s, x0=s["x0"] @ R.T, A=R @ s["A"] @ R.T)  # x -> R x, A_h -> R A_h R^T (V = A rotates too)
    np.testing.assert_allclose(rot.x, base.x @ R.T, rtol=0, atol=1e-11)
    np.testing.assert_allclose(rot.diagnostics["energy"], base.diagnostics["energy"], rtol=1e-11)
