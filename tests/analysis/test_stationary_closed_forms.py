"""classify_stationary against closed forms (docs/model.md, "Stationary points"), the Hessian against
finite differences of an independent numpy energy, and the reduced (cluster) Hessian against the
token-level one. Parameters are drawn at random; each check has a control that it rejects."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import attnflow as af
from attnflow.analysis.stationary import check_index, riemannian_hessian, tangent_bases
from attnflow.core.errors import InputError
from attnflow.core.heads import Heads

RNG = np.random.default_rng(2029)


def _rotation(d: int, rng: np.random.Generator) -> np.ndarray:
    q, r = np.linalg.qr(rng.standard_normal((d, d)))
    return q * np.sign(np.diag(r))


def _polygon_index(beta: float, K: int) -> tuple[int, np.ndarray]:
    """Closed form: the circulant Hessian of K equal clusters on the circle (mass metric)."""
    f2 = lambda s: np.exp(beta * np.cos(s)) * (beta**2 * np.sin(s) ** 2 - beta * np.cos(s))  # (e^{b cos})''
    j = np.arange(1, K)
    lam = np.array([-np.sum(f2(2 * np.pi * j / K) * (1 - np.cos(2 * np.pi * j * p / K))) / K for p in range(1, K)])
    return int((lam < 0).sum()), np.sort(lam)


@pytest.mark.parametrize("d", [2, 3, 5])
def test_one_cluster_is_a_minimiser(d):
    beta = float(RNG.uniform(0.3, 6.0))
    c = _rotation(d, RNG)[0]
    x = np.repeat(c[None], 4, axis=0)
    p = af.classify_stationary(x, beta * np.eye(d)[None])
    assert (p.index, p.kind, p.escape) == (0, "minimiser", None)
    assert p.symmetry_directions == d - 1 and len(p.eigenvalues) == 0  # all rigid motions are rotations
    # Splitting block: Hess_S(-e^{beta <y, c>}) at c = beta e^beta I.
    np.testing.assert_allclose(p.split_eigenvalues[0], beta * math.exp(beta), rtol=1e-10)
    print(f"one cluster d={d} beta={beta:.3g}: split eigenvalue {p.split_eigenvalues[0][0]:.6g}")


@pytest.mark.parametrize("d", [2, 3, 4])
def test_antipodal_clusters_saddle_of_index_d_minus_1(d):
    beta = float(RNG.uniform(0.3, 5.0))
    m1 = float(RNG.uniform(0.3, 0.7))
    c = _rotation(d, RNG)[0]
    x = np.stack([c, c, -c, -c])
    a = np.array([m1 / 2, m1 / 2, (1 - m1) / 2, (1 - m1) / 2])
    p = af.classify_stationary(x, beta * np.eye(d)[None], token_weights=a)
    assert p.kind == "saddle" and p.index == d - 1 and p.rigid_index == d - 1 and p.split_index == 0
    assert p.symmetry_directions == d - 1
    np.testing.assert_allclose(p.eigenvalues, -beta * math.exp(-beta), rtol=1e-9)
    split = {0: beta * (m1 * math.exp(beta) - (1 - m1) * math.exp(-beta))}
    split[1] = beta * ((1 - m1) * math.exp(beta) - m1 * math.exp(-beta))
    for k in (0, 1):
        np.testing.assert_allclose(p.split_eigenvalues[k], split[k], rtol=1e-9)
    # Escape: both clusters move the same way, the lighter one further (m1 u1 = m2 u2: the eigenvector of
    # -k [[I, I], [I, I]] in the mass metric); tangent, unit norm.
    u = p.escape
    assert abs(np.linalg.norm(u) - 1) < 1e-12 and np.abs((u * x).sum(-1)).max() < 1e-12
    np.testing.assert_allclose(m1 * u[0], (1 - m1) * u[3], atol=1e-12)
    with pytest.raises(InputError, match="claimed index"):  # control: a wrong claimed index is rejected
        check_index(p, d - 2)
    check_index(p, d - 1)
    print(f"antipodal d={d} beta={beta:.3g}: index {p.index}, eigenvalue {p.eigenvalues[0]:.6g}")


@pytest.mark.parametrize("d", [2, 3, 4])
def test_regular_simplex_index(d):
    """d+1 equal clusters with <c_k, c_l> = -1/d: index (d-1)(d+2)/2 at every beta > 0."""
    beta = float(RNG.uniform(0.2, 8.0))
    E = np.eye(d + 1) - 1.0 / (d + 1)  # centred basis vectors of R^{d+1}: a regular simplex in a d-plane
    _, _, vt = np.linalg.svd(E)
    V = E @ vt[:d].T
    V = V / np.linalg.norm(V, axis=1, keepdims=True)
    V = V @ _rotation(d, RNG)
    np.testing.assert_allclose(V @ V.T, np.where(np.eye(d + 1) > 0, 1.0, -1.0 / d), atol=1e-12)
    p = af.classify_stationary(V, beta * np.eye(d)[None])
    expected = (d - 1) * (d + 2) // 2
    assert p.index == expected and p.symmetry_directions == d * (d - 1) // 2 and p.degenerate == 0
    with pytest.raises(InputError):
        check_index(p, expected + 1)
    print(f"simplex d={d} beta={beta:.3g}: index {p.index}, eigenvalues {np.round(p.eigenvalues, 5)}")


@pytest.mark.parametrize("K", [3, 6, 12])
def test_regular_polygon_matches_circulant(K):
    beta = float(RNG.uniform(0.5, 12.0))
    th = 2 * np.pi * np.arange(K) / K + RNG.uniform(0, 2 * np.pi)
    x = np.stack([np.cos(th), np.sin(th)], 1)
    p = af.classify_stationary(x, beta * np.eye(2)[None])
    idx, lam = _polygon_index(beta, K)
    assert p.index == idx
    np.testing.assert_allclose(np.sort(p.eigenvalues), lam, rtol=1e-8, atol=1e-10 * np.abs(lam).max())
    print(f"polygon K={K} beta={beta:.3g}: index {p.index} of {K - 1}")


def test_polygon_modes_below_resolution_are_reported_degenerate():
    """A fine polygon at small beta is near the uniform state: its high Fourier modes have eigenvalues
    ~ I_p(beta), below float64 resolution relative to the largest (closed form: 1e-16 at K = 32, beta = 0.5).
    The classifier counts them as zero modes (``degenerate``), not as a sign it cannot resolve."""
    K, beta = 32, 0.5
    _, lam = _polygon_index(beta, K)
    th = 2 * np.pi * np.arange(K) / K
    p = af.classify_stationary(np.stack([np.cos(th), np.sin(th)], 1), beta * np.eye(2)[None])
    resolved = int((lam < -p.zero_tol).sum())
    assert p.degenerate > 0 and p.index == resolved and p.index + p.degenerate == K - 1
    assert p.notes and "zero mode" in p.notes[0]
    print(f"polygon K={K} beta={beta}: index {p.index}, {p.degenerate} modes below {p.zero_tol:.2e}")


def test_anisotropic_single_cluster_index_counts_larger_eigenvalues():
    """One cluster at eigenvector e_j of A (eigenvalues l_1 > ... > l_d): Hess = e^{l_j}(l_j - l_i), index j - 1;
    no symmetry directions for distinct eigenvalues, one for a repeated pair.

    The cluster holds two coincident tokens, so it also has d - 1 splitting modes (the tokens moving apart
    along u): the energy ``-1/2 sum exp(x_i^T A x_k)`` changes by ``2 l_j e^{l_j} eps^2`` to second order (the two
    self terms give ``l_u - l_j`` each, the two cross terms ``-(l_j + l_u)``), unstable exactly when ``l_j < 0``; the index then adds ``d - 1``. The draws (their own generator: the module's shared one
    made this test's eigenvalues depend on which tests ran before it in the worker) cover both signs."""
    d = 4
    rng = np.random.default_rng(11)
    signs = set()
    for _ in range(5):
        lam = np.sort(rng.uniform(-1, 3, d))[::-1]
        R = _rotation(d, rng)
        A = (R * lam) @ R.T
        assert af.classify_stationary(R[:, 0][None], A[None]).symmetry_generators == 0
        for j in range(d):
            x = np.repeat(R[:, j][None], 2, axis=0)
            p = af.classify_stationary(x, A[None])
            assert p.index == j + (d - 1) * int(lam[j] < 0) and p.symmetry_directions == 0
            signs.add(bool(lam[j] < 0))
            want = np.sort(np.exp(lam[j]) * (lam[j] - np.delete(lam, j)))
            np.testing.assert_allclose(np.sort(p.eigenvalues), want, rtol=1e-9)
    assert signs == {True, False}
    # Repeated eigenvalue: rotations in its plane are a symmetry; at e_2 the orbit direction e_3 is removed.
    lam2 = np.array([3.0, 1.0, 1.0])
    R3 = _rotation(3, RNG)
    A2 = (R3 * lam2) @ R3.T
    p = af.classify_stationary(R3[:, 1][None], A2[None])
    assert p.symmetry_generators == 1 and p.symmetry_directions == 1 and p.index == 1 and p.degenerate == 0


def _np_energy(X: np.ndarray, A: np.ndarray, a: np.ndarray, w: np.ndarray) -> float:
    """Independent energy: -1/2 sum_h w_h a^T exp(X A_h X^T) a."""
    return float(-0.5 * sum(w[h] * a @ np.exp(X @ A[h] @ X.T) @ a for h in range(len(w))))


def test_riemannian_hessian_matches_finite_differences():
    """u^T Hess u = d^2/ds^2 F(R(x + s u)) (metric projection is a second-order retraction), with an
    independent numpy energy; control: without the curvature term it does not match."""
    N, d, H = 5, 3, 2
    X = RNG.standard_normal((N, d))
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    G = RNG.standard_normal((H, d, d))
    A = (G + G.transpose(0, 2, 1)) / 2
    a = RNG.dirichlet(np.ones(N))
    w = RNG.dirichlet(np.ones(H))
    xt = torch.from_numpy(X)
    Gr, R, B, F = riemannian_hessian(xt, Heads(K=torch.from_numpy(A)), torch.from_numpy(a), torch.from_numpy(w))
    assert abs(F - _np_energy(X, A, a, w)) < 1e-12
    retract = lambda Y: Y / np.linalg.norm(Y, axis=1, keepdims=True)
    Bn = B.numpy()
    curv = (Gr.numpy() * X).sum(-1)
    worst, worst_ctrl = 0.0, 0.0
    for _ in range(5):
        coords = RNG.standard_normal((N, d - 1))
        U = np.einsum("nij,nj->ni", Bn, coords)
        s = 1e-4
        fd = (_np_energy(retract(X + s * U), A, a, w) - 2 * F + _np_energy(retract(X - s * U), A, a, w)) / s**2
        q = coords.ravel() @ R.numpy() @ coords.ravel()
        q_ctrl = q + (curv * (U * U).sum(-1)).sum()  # the Hessian without -<G_i, x_i> I
        worst = max(worst, abs(q - fd) / abs(fd))
        worst_ctrl = max(worst_ctrl, abs(q_ctrl - fd) / abs(fd))
    print(f"Hessian vs finite differences: worst relative error {worst:.2e}; without curvature term {worst_ctrl:.2e}")
    assert worst < 1e-5
    assert worst_ctrl > 1e3 * worst


def test_reduced_hessian_agrees_with_token_level():
    """Tokens merged into clusters: the token-level Hessian's negative eigenvalues are the rigid ones plus each
    cluster's splitting ones repeated n_k - 1 times. A small cluster opposite a heavy one is unstable to
    splitting when m_small / m_big < e^{-2 beta} (closed form beta (m e^beta - M e^-beta) < 0)."""
    beta = 1.0
    d = 3
    c = _rotation(d, RNG)[0]
    x = np.stack([c, c, -c, -c, -c])
    a = np.array([0.45, 0.45, 0.1 / 3, 0.1 / 3, 0.1 / 3])
    p = af.classify_stationary(x, beta * np.eye(d)[None], token_weights=a)
    np.testing.assert_allclose(p.split_eigenvalues[1], beta * (0.1 * math.e - 0.9 / math.e), rtol=1e-9)
    assert p.split_index == d - 1 and p.rigid_index == d - 1 and p.index == 2 * (d - 1)
    # Token level, no clustering: one Hessian over all five tokens (mass metric).
    xt = torch.from_numpy(x)
    _, R, _, _ = riemannian_hessian(
        xt, Heads(K=torch.from_numpy(beta * np.eye(d)[None])), torch.from_numpy(a), torch.ones(1, dtype=torch.float64)
    )
    sa = np.sqrt(np.repeat(a, d - 1))
    ev = np.linalg.eigvalsh(R.numpy() / sa[:, None] / sa[None, :])
    tol = 1e-8 * np.abs(ev).max()
    negative = int((ev < -tol).sum())
    assert negative == p.rigid_index + (d - 1) * (3 - 1)
    # The escape is rigid (-beta e^-beta is below the split eigenvalue): tokens of a cluster share it.
    u = p.escape
    assert np.abs(u[1] - u[0]).max() < 1e-12 and np.abs(u[2:] - u[2]).max() < 1e-12
    # The most stable direction splits the heavy cluster (beta (0.9 e - 0.1/e)) and keeps its centre.
    s_ = p.stable
    assert np.abs(a[:2] @ s_[:2]).max() < 1e-12 and np.abs(s_[2:]).max() == 0.0 and np.abs(s_[0]).max() > 0.1


def test_usa_equals_gf_and_mha_refused():
    d = 2
    x = np.array([[1.0, 0.0], [-1.0, 0.0]])
    A = 1.5 * np.eye(d)[None]
    p_gf, p_usa, p_mha1 = (af.classify_stationary(x, A, model=m) for m in ("gf", "usa", "mha"))
    assert p_gf.index == p_usa.index == p_mha1.index == 1
    with pytest.raises(InputError, match="not a gradient flow"):
        af.classify_stationary(x, np.concatenate([A, 2 * A]), model="mha")
    with pytest.raises(InputError, match="not a gradient flow"):
        af.classify_stationary(x, Heads.from_matrices(A, np.eye(d)[None]), model="mha")
    with pytest.raises(InputError, match="symmetric"):
        af.classify_stationary(x, np.array([[[1.0, 2.0], [0.0, 1.0]]]), model="gf")
    with pytest.raises(InputError, match="unit vectors"):
        af.classify_stationary(2 * x, A)
    with pytest.raises(InputError, match="shape"):
        af.classify_stationary(x[:, :1], A)


def test_tangent_bases_orthonormal():
    X = RNG.standard_normal((6, 4))
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    B = tangent_bases(torch.from_numpy(X)).numpy()
    np.testing.assert_allclose(np.einsum("nij,nik->njk", B, B), np.broadcast_to(np.eye(3), (6, 3, 3)), atol=1e-12)
    assert np.abs(np.einsum("ni,nij->nj", X, B)).max() < 1e-12


def test_time_dependent_weights_are_evaluated_at_t():
    """Oscillating weights A(t) = beta I + C I sin(omega t): the antipodal eigenvalue is -b e^{-b} with
    b = beta + C sin(omega t), at each t asked for (control: the t = 0 value differs)."""
    beta, C, omega = 2.0, 1.0, 1.3
    proc = af.weights.Oscillating(beta * np.eye(3)[None], C, omega)
    x = np.array([[0.0, 0.0, 1.0], [0.0, 0.0, -1.0]])
    for t in (0.0, 0.7, 2.0):
        b = beta + C * math.sin(omega * t)
        p = af.classify_stationary(x, proc, t=t)
        np.testing.assert_allclose(p.eigenvalues, -b * math.exp(-b), rtol=1e-10)
        assert p.t == t
    p0 = af.classify_stationary(x, proc, t=0.0)
    assert abs(p0.eigenvalues[0] - p.eigenvalues[0]) > 1e-3


def test_the_hessian_is_made_in_batches_within_the_memory_budget(monkeypatch):
    """256 unclustered tokens: the Hessian whole took 17.7 GB; in batches of rows it stays within the
    budget and equals the whole one (control: a tiny budget gives the same matrix one row at a time)."""
    import attnflow.analysis.stationary as st

    rng = np.random.default_rng(5)
    x = rng.standard_normal((12, 3))
    x = torch.from_numpy(x / np.linalg.norm(x, axis=1, keepdims=True))
    from attnflow.core.heads import identity_heads

    heads = Heads(K=torch.from_numpy(identity_heads(2, 3, 1.5)))
    a = torch.full((12,), 1 / 12, dtype=torch.float64)
    w = torch.full((2,), 0.5, dtype=torch.float64)
    _, R_big, _, _ = st.riemannian_hessian(x, heads, a, w)
    calls = []
    real = torch.autograd.grad

    def counting(*args, **kwargs):
        if kwargs.get("is_grads_batched"):
            calls.append(kwargs["grad_outputs"].shape[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(st, "HESSIAN_BATCH_BYTES", 1)
    monkeypatch.setattr(torch.autograd, "grad", counting)
    _, R_rows, _, _ = st.riemannian_hessian(x, heads, a, w)
    assert calls and max(calls) == 1 and sum(calls) == 12 * 3  # one row per pass
    assert torch.allclose(R_rows, R_big, rtol=1e-12, atol=1e-12)


def test_a_summary_does_not_classify_an_unclustered_cloud_but_a_clustered_one(monkeypatch):
    # The summary of every run classifies its end; an unclustered cloud of 128 tokens and 8 heads cost
    # 58 s there (a Hessian of 744 coordinates). Above ENDED_AT_MAX_WORK the sentence says where to go.
    from attnflow.analysis import stationary as st

    heads = np.stack([4.0 * np.eye(3)] * 8)
    loose = af.simulate(af.tokens.uniform(128, 3, seed=0), heads, t_end=0.05, dt=0.025, model="gf")
    summary, text = st.ended_at(loose)
    assert summary is None and "attnflow stationary" in text and "8 heads" in text
    # control: the same cloud, the bound raised, is classified (the guard, not the cloud, refused it)
    monkeypatch.setattr(st, "ENDED_AT_MAX_WORK", 1 << 40)
    calls = []
    monkeypatch.setattr(
        st, "classify_stationary", lambda *a, **k: calls.append(1) or (_ for _ in ()).throw(InputError("x"))
    )
    assert st.ended_at(loose)[1].startswith("not classified: x") and calls == [1]
