"""The Transformer PDE solver: basis, mass, energy, EDI budget, resolution guard, agreement with particles."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import attnflow as af
from attnflow.core.errors import InputError, NumericalError
from attnflow.pde.basis import make_basis
from attnflow.pde.solver import perturbed_uniform, solve_pde


def test_sphere_basis_matches_scipy_and_is_orthonormal():
    from scipy.special import sph_harm_y

    b = make_basis(6, 3)
    gram = b.Y.T @ (b.q[:, None] * b.Y)
    assert float((gram - torch.eye(b.n_coef)).abs().max()) < 1e-13
    p = b.points.numpy()
    th, ph = np.arccos(p[:, 2]), np.arctan2(p[:, 1], p[:, 0])
    for l in range(7):
        for m in range(l + 1):
            ref = sph_harm_y(l, m, th, ph)
            ours_c = b.Y[:, l * l + max(2 * m - 1, 0)].numpy()
            want = np.real(ref) * (math.sqrt(2) if m else 1.0)
            # the Condon-Shortley phase is a sign per (l, m): compare up to it
            assert min(np.abs(ours_c - want).max(), np.abs(ours_c + want).max()) < 1e-12, (l, m)
    # sphere gradients: int grad Y_k . grad Y_j = l (l + 1) delta_kj (integration by parts)
    gg = torch.einsum("mdk,mdj,m->kj", b.G, b.G, b.q)
    lap = (b.degree * (b.degree + 1)).double()
    assert float((gg - torch.diag(lap)).abs().max()) < 1e-11
    # negative control: a wrong degree labelling fails the same identity
    assert float((gg - torch.diag(lap.roll(1))).abs().max()) > 1


def test_mass_conserved_energy_decreases_and_edi_closes_at_order_two():
    b = make_basis(24, 2)
    c0 = perturbed_uniform(b, 0.2, degrees=(1, 4), seed=1)
    heads = np.stack([2.0 * np.eye(2), 4.0 * np.eye(2)])
    res = {}
    for dt in (0.04, 0.02):
        s = solve_pde(c0, heads, t_end=0.4, dt=dt, basis=b, head_weights=[0.4, 0.6])
        assert s.mass_error <= 1e-12
        assert np.all(np.diff(s.energy) < 0), "the gf energy must decrease"
        res[dt] = abs(s.edi_residual()[-1])
        scale = s.edi_scale()
    ratio = res[0.04] / res[0.02]
    print(
        f"EDI residual {res[0.04]:.3e} -> {res[0.02]:.3e} (ratio {ratio:.2f}, order {math.log2(ratio):.2f}); scale {scale:.3g}"
    )
    assert 3.2 < ratio < 4.8  # order 2 (trapezoid actions)
    assert res[0.02] < 1e-3 * scale
    # negative control: a budget without the slope action does not close
    bad = s.steps["energy_change"] + 0.5 * s.steps["speed_action"]
    assert abs(bad.sum()) > 100 * res[0.02]


def test_time_dependent_weights_budget_closes_with_the_weight_work():
    b = make_basis(24, 2)
    c0 = perturbed_uniform(b, 0.2, degrees=(1, 4), seed=2)
    proc = af.weights.Oscillating(2.0 * np.eye(2)[None], 1.0, 3.0)
    out = {}
    for dt in (0.04, 0.02):
        s = solve_pde(c0, proc, t_end=0.4, dt=dt, basis=b)
        out[dt] = (abs(s.edi_residual()[-1]), abs(s.steps["weight_work"].sum()))
    assert out[0.02][1] > 100 * out[0.02][0], "the weights do work that the budget must carry"
    assert out[0.04][0] / out[0.02][0] > 3.0
    # negative control: dropping the weight work leaves a residual of the work's size
    assert abs((s.edi_residual() + np.cumsum(s.steps["weight_work"]))[-1]) > 100 * out[0.02][0]


def test_resolution_guard_refuses_with_one_sentence():
    b = make_basis(12, 2)
    c0 = perturbed_uniform(b, 0.3, degrees=(1, 3), seed=0)
    with pytest.raises(NumericalError) as e:
        solve_pde(c0, 8.0 * np.eye(2)[None], t_end=3.0, dt=0.02, basis=b)
    msg = str(e.value)
    assert "no longer resolved" in msg and "\n" not in msg and msg.count(". ") == 0
    part = e.value.partial
    assert part is not None and 0 < part.t[-1] < 3.0 and part.tail[-1] <= 1e-8
    # the same run at a resolution it keeps goes to the end (the guard is not always on)
    s = solve_pde(c0, 8.0 * np.eye(2)[None], t_end=0.06, dt=0.02, basis=b)
    assert s.t[-1] == pytest.approx(0.06)


def test_bad_inputs_are_refused():
    with pytest.raises(InputError):
        make_basis(8, 4)
    b = make_basis(8, 2)
    with pytest.raises(InputError):
        solve_pde(-np.ones(b.points.shape[0]), np.eye(2)[None], t_end=1, dt=0.1, basis=b)
    with pytest.raises(InputError):
        solve_pde("uniform", np.eye(2)[None], t_end=1, dt=-0.1, basis=b)
    with pytest.raises(ValueError):  # gf needs symmetric A
        solve_pde("uniform", np.array([[[0.0, 1.0], [0.0, 0.0]]]), t_end=1, dt=0.1, basis=b)


def test_sphere_solver_conserves_mass_and_agrees_with_its_own_refinement():
    c = {}
    for L in (10, 14):
        b = make_basis(L, 3)
        c0 = perturbed_uniform(make_basis(10, 3), 0.1, degrees=(1, 3), seed=3)
        coef = torch.zeros(b.n_coef, dtype=torch.float64)
        coef[: c0.shape[0]] = c0
        s = solve_pde(coef, 2.0 * np.eye(3)[None], t_end=0.3, dt=0.05, basis=b, tail_tol=1e-6)
        assert s.mass_error <= 1e-12
        c[L] = s.coef[-1][:49]
    err = np.abs(c[10] - c[14]).max() / np.abs(c[14]).max()
    print(f"S^2: lmax 10 vs 14 differ by {err:.2e} (relative) in degrees <= 6")
    assert err < 1e-5


def test_pde_agrees_with_particles_better_than_a_wrong_beta():
    """N = 3000 tokens from the same initial density track the PDE; the PDE of another beta is farther."""
    from attnflow.pde.meanfield import mmd_sphere, sample_density

    b = make_basis(24, 2)
    c0 = perturbed_uniform(b, 0.5, degrees=(1, 3), seed=4)
    A = 3.0 * np.eye(2)[None]
    right = solve_pde(c0, A, t_end=0.5, dt=0.05, basis=b)
    wrong = solve_pde(c0, 0.5 * A, t_end=0.5, dt=0.05, basis=b)
    x0 = sample_density(b, c0, 3000, seed=1)
    tr = af.simulate(x0, A, model="gf", t_end=0.5, dt=0.05, record_steps=False)
    x = np.asarray(tr.x[-1])
    pts = b.points.numpy()
    d_right = mmd_sphere(x, pts, b=(b.q * b.values(torch.from_numpy(right.coef[-1]))).numpy())
    d_wrong = mmd_sphere(x, pts, b=(b.q * b.values(torch.from_numpy(wrong.coef[-1]))).numpy())
    d_start = mmd_sphere(x, pts, b=(b.q * b.values(c0)).numpy())
    print(f"MMD to the PDE {d_right:.4f}, to the wrong-beta PDE {d_wrong:.4f}, to rho_0 {d_start:.4f}")
    assert d_right < 0.5 * d_wrong and d_right < 0.5 * d_start
    assert d_right < 3 / math.sqrt(3000)  # the sampling scale N^{-1/2}
