"""Fast summation (d <= 4) against the numpy reference, its error bound and its pieces."""

import dataclasses
import math

import numpy as np
import pytest
import torch
from numpy.polynomial import chebyshev

from attnflow import simulate, tokens
from attnflow.core.heads import Heads, gaussian_heads, goe_heads, identity_heads
from attnflow.kernels.dense import attention_stats_reference
from attnflow.kernels.dispatch import AUTO_FAST_TOL, choose_fast, head_stats
from attnflow.kernels.fastsum import (
    chebyshev_tail_bound,
    fast_attention_stats,
    features,
    kernel_coefficients,
    plan,
    power_coefficients,
)


def _rel_errors(out, logZ, out_ref, lz_ref, V):
    z_err = float(np.abs(np.expm1(logZ.numpy() - lz_ref)).max())
    normV = np.linalg.norm(V, ord=2, axis=(1, 2))[:, None]
    o_err = float((np.linalg.norm(out.numpy() - out_ref, axis=-1) / normV).max())
    return z_err, o_err


@pytest.mark.parametrize("d,beta,tol", [(2, 4.0, 1e-10), (3, 1.0, 1e-6), (3, 2.0, 1e-10), (4, 1.0, 1e-7)])
def test_fast_summation_within_tolerance_of_reference(d, beta, tol):
    N, H = 120, 3
    rng = np.random.default_rng(d)
    x = tokens.uniform(N, d, seed=d)
    A = gaussian_heads(H, d, beta, seed=1)
    V = rng.standard_normal((H, d, d))
    a = rng.uniform(0.5, 2.0, N)
    a /= a.sum()
    res = fast_attention_stats(
        torch.as_tensor(x), torch.as_tensor(A), torch.as_tensor(V), torch.as_tensor(a), tol=tol, check=N
    )
    out_ref, lz_ref = attention_stats_reference(x, A, V, a)
    z_err, o_err = _rel_errors(res.out, res.logZ, out_ref, lz_ref, V)
    assert max(z_err, o_err) <= tol
    assert res.plan.relative_bound <= tol
    # The reported achieved error is the same measurement, done inside the module on every token.
    assert res.achieved_error == pytest.approx(max(z_err, o_err), rel=1e-3, abs=1e-15)


def test_tail_bound_dominates_the_true_error():
    s = np.linspace(-1.0, 1.0, 4001)
    for beta in (0.5, 2.0, 4.0, 8.0):
        for P in (3, 8, 15):
            p = np.polynomial.polynomial.polyval(beta * s, power_coefficients(beta, P))
            true = np.abs(np.exp(beta * s) - p).max()
            bound = chebyshev_tail_bound(beta, P)
            assert true <= bound * (1 + 1e-9) + 1e-14
            if P >= beta:  # the regime the planner uses: the bound is not vacuous there
                assert bound < 50 * true + 1e-13


def test_power_coefficients_are_the_chebyshev_series():
    beta, P = 3.0, 12
    t = np.linspace(-1, 1, 7)
    from scipy.special import iv

    cheb = 2 * iv(np.arange(P + 1), beta)
    cheb[0] /= 2
    assert np.allclose(
        np.polynomial.polynomial.polyval(beta * t, power_coefficients(beta, P)), chebyshev.chebval(t, cheb), rtol=1e-13
    )


def test_bilinear_form_reproduces_polynomial_of_x_A_y():
    d, H, P = 3, 2, 9
    A = torch.as_tensor(goe_heads(H, d, 2.0, seed=0))
    fp = plan(A, 1e-3)
    fp = type(fp)(P, fp.beta, fp.tol, fp.kernel_error, fp.relative_bound, (P + 1) ** 2)
    CP, CQ = kernel_coefficients(A.numpy(), fp)
    x = torch.as_tensor(tokens.uniform(5, d, seed=1))
    y = torch.as_tensor(tokens.uniform(6, d, seed=2))
    fx, fy = features(x, P).numpy(), features(y, P).numpy()
    M = CP.shape[-1]
    assert fx.shape[1] == (P + 1) ** 2  # the dimension of polynomials of degree <= P on S^2
    bil = np.einsum("im,hmn,jn->hij", fx[:, :M], CP, fy[:, :M]) + np.einsum("im,hmn,jn->hij", fx[:, M:], CQ, fy[:, M:])
    s = np.einsum("id,hde,je->hij", x.numpy(), A.numpy(), y.numpy())
    direct = np.polynomial.polynomial.polyval(s, power_coefficients(fp.beta, P))
    assert np.abs(bil - direct).max() < 1e-12 * np.abs(direct).max()


def test_fast_backend_through_fields_matches_flash():
    N, d, H = 300, 3, 4
    x = torch.as_tensor(tokens.uniform(N, d, seed=5))
    heads = Heads.from_matrices(identity_heads(H, d, 4.0))
    a = torch.full((N,), 1.0 / N, dtype=torch.float64)
    out_f, lz_f = head_stats(x, heads, a, backend="fast")
    out_d, lz_d = head_stats(x, heads, a, backend="flash")
    assert float((lz_f - lz_d).abs().max()) < 1e-11
    assert float((out_f - out_d).abs().max()) < 1e-11 * 4.0


def test_auto_selects_fast_only_when_it_pays():
    d, H = 3, 8
    heads = Heads.from_matrices(identity_heads(H, d, 4.0))
    small = torch.as_tensor(tokens.uniform(512, d, seed=0))
    big = torch.as_tensor(tokens.uniform(200_000, d, seed=0))
    assert choose_fast(small, heads, torch.full((512,), 1 / 512, dtype=torch.float64), None) is None
    fp = choose_fast(big, heads, torch.full((200_000,), 1 / 200_000, dtype=torch.float64), None)
    assert fp is not None and fp.relative_bound <= AUTO_FAST_TOL[torch.float64]
    # Large beta: no expansion within the feature budget, so auto stays dense.
    hot = Heads.from_matrices(identity_heads(H, d, 60.0))
    with pytest.warns(UserWarning, match="dense kernel"):
        assert choose_fast(big, hot, torch.full((200_000,), 1 / 200_000, dtype=torch.float64), None) is None


def test_fast_backend_errors_are_clear():
    a = torch.full((10,), 0.1, dtype=torch.float64)
    x5 = torch.as_tensor(tokens.uniform(10, 5, seed=0))
    with pytest.raises(ValueError, match="d <= 4"):
        head_stats(x5, Heads.from_matrices(identity_heads(2, 5)), a, backend="fast")
    x3 = torch.as_tensor(tokens.uniform(10, 3, seed=0))
    with pytest.raises(ValueError, match="cannot reach tol"):
        head_stats(x3, Heads.from_matrices(identity_heads(2, 3, 80.0)), a, backend="fast")
    with pytest.raises(ValueError, match="unknown backend"):
        head_stats(x3, Heads.from_matrices(identity_heads(2, 3)), a, backend="gpu")


def test_simulate_fast_equals_dense_with_euler():
    # Euler evaluates the field on the sphere only, where both backends compute the same sums.
    x0 = tokens.uniform(80, 3, seed=2)
    A = goe_heads(4, 3, 1.5, seed=3)
    kw = dict(model="gf", t_end=0.2, dt=0.05, method="euler")
    fast = simulate(x0, A, backend="fast", **kw)
    dense = simulate(x0, A, backend="flash", **kw)
    assert np.abs(fast.x - dense.x).max() < 1e-9


def test_large_beta_rounding_guard():
    # At beta = 12 the monomial sums cancel from ~e^12: 1e-12 is refused, 1e-6 is met.
    x = torch.as_tensor(tokens.uniform(200, 3, seed=4))
    a = torch.full((200,), 1 / 200, dtype=torch.float64)
    A = torch.as_tensor(goe_heads(2, 3, 1.0, seed=5))
    A = 12.0 * A / torch.linalg.matrix_norm(A, ord=2).max()
    assert plan(A, 1e-12, 0.1) is None
    res = fast_attention_stats(x, A, A, a, tol=1e-6, check=200)
    assert res.achieved_error <= 1e-6


@pytest.mark.parametrize("d,P", [(2, 12), (4, 7)])
def test_bilinear_form_in_other_dimensions(d, P):
    H = 3
    A = torch.as_tensor(gaussian_heads(H, d, 1.5, seed=d))
    fp = plan(A, 1e-3)
    fp = type(fp)(
        P,
        fp.beta,
        fp.tol,
        fp.kernel_error,
        fp.relative_bound,
        math.comb(P + d - 1, d - 1) + math.comb(P + d - 2, d - 1),
    )
    CP, CQ = kernel_coefficients(A, fp)  # torch in, torch out
    assert isinstance(CP, torch.Tensor)
    np.testing.assert_array_equal(CP.numpy(), kernel_coefficients(A.numpy(), fp)[0])
    x = torch.as_tensor(tokens.uniform(7, d, seed=1))
    y = torch.as_tensor(tokens.uniform(5, d, seed=2))
    fx, fy = features(x, P), features(y, P)
    M = CP.shape[-1]
    bil = torch.einsum("im,hmn,jn->hij", fx[:, :M], CP, fy[:, :M]) + torch.einsum(
        "im,hmn,jn->hij", fx[:, M:], CQ, fy[:, M:]
    )
    s = torch.einsum("id,hde,je->hij", x, A, y).numpy()
    direct = np.polynomial.polynomial.polyval(s, power_coefficients(fp.beta, P))
    assert np.abs(bil.numpy() - direct).max() < 1e-12 * np.abs(direct).max()


def test_extra_values_come_from_the_same_pass():
    N, d, H = 300, 3, 4
    x = torch.as_tensor(tokens.uniform(N, d, seed=8))
    heads = Heads.from_matrices(goe_heads(H, d, 2.0, seed=9))
    E = torch.as_tensor(np.random.default_rng(1).standard_normal((H, d, d)))
    a = torch.full((N,), 1 / N, dtype=torch.float64)
    _, lz_ref = attention_stats_reference(x.numpy(), heads.A.numpy(), E.numpy(), a.numpy())
    ref_E, _ = attention_stats_reference(x.numpy(), heads.A.numpy(), E.numpy(), a.numpy())
    ref_V, _ = attention_stats_reference(x.numpy(), heads.A.numpy(), heads.A.numpy(), a.numpy())
    for backend, tol in (("flash", 1e-10), ("fast", 1e-9)):
        out, lz = head_stats(x, heads, a, backend=backend, extra_values=E, tol=1e-11)
        assert out.shape == (H, N, 2 * d)
        assert float((out[..., :d] - torch.as_tensor(ref_V)).abs().max()) < tol * 2.0
        assert float((out[..., d:] - torch.as_tensor(ref_E)).abs().max()) < tol * float(
            torch.linalg.matrix_norm(E, ord=2).max()
        )
        assert float((lz - torch.as_tensor(lz_ref)).abs().max()) < tol


def test_key_moments_are_recomputed_after_an_in_place_change():
    N, d = 400, 3
    x = torch.as_tensor(tokens.uniform(N, d, seed=3))
    A = torch.as_tensor(goe_heads(2, d, 2.0, seed=4))
    a = torch.full((N,), 1 / N, dtype=torch.float64)
    first = fast_attention_stats(x, A, A, a, tol=1e-10)
    again = fast_attention_stats(x, 0.5 * A, A, a, tol=1e-10)  # cached moments, other heads: still exact
    _, lz_half = attention_stats_reference(x.numpy(), 0.5 * A.numpy(), A.numpy(), a.numpy())
    assert float((again.logZ - torch.as_tensor(lz_half)).abs().max()) < 1e-10
    x[:, 0] *= -1.0  # same tensor object, new contents
    after = fast_attention_stats(x, A, A, a, tol=1e-10)
    _, lz_ref = attention_stats_reference(x.numpy(), A.numpy(), A.numpy(), a.numpy())
    assert float((after.logZ - torch.as_tensor(lz_ref)).abs().max()) < 1e-10
    assert float((after.logZ - first.logZ).abs().max()) > 1e-3


def test_kernel_options_hold_for_every_call_of_a_run(monkeypatch):
    import attnflow.kernels.dispatch as backends
    import attnflow.kernels.fastsum as fs

    tols = []
    real = fs.fast_attention_stats
    monkeypatch.setattr(fs, "fast_attention_stats", lambda *a, **k: tols.append(k["fast_plan"].tol) or real(*a, **k))
    monkeypatch.setattr(backends, "AUTO_FAST_MIN_TOKENS", 16)
    monkeypatch.setattr(backends, "PAIR_COST_IN_FLOPS", 1e9)  # make fast summation "pay" at this size
    x0 = tokens.uniform(200, 3, seed=2)
    A = goe_heads(4, 3, 1.5, seed=3)
    # Euler: every evaluation is on the sphere, where fast and dense sum the same kernel.
    traj = simulate(x0, A, model="gf", t_end=0.1, dt=0.05, method="euler", fast_tol=1e-9)
    # field, energies and diagnostics alike (4 passes: the diagnostics reuse the step's own pass)
    assert len(tols) >= 4 and set(tols) == {1e-9}
    assert backends.current_options() == ("auto", None)  # the run's choice does not leak out
    dense = simulate(x0, A, model="gf", t_end=0.1, dt=0.05, method="euler", backend="flash")
    assert np.abs(traj.x - dense.x).max() < 1e-8
    np.testing.assert_allclose(traj.diagnostics["energy"], dense.diagnostics["energy"], rtol=1e-8)
    with pytest.raises(ValueError, match="tolerance must be positive"):
        simulate(x0, A, model="gf", t_end=0.1, dt=0.05, fast_tol=-1.0)


def test_auto_warns_when_a_large_cloud_falls_back_to_dense(monkeypatch):
    import attnflow.kernels.dispatch as backends

    monkeypatch.setattr(backends, "SLOW_DENSE_TOKENS", 100)
    x = torch.as_tensor(tokens.uniform(5000, 3, seed=0))
    a = torch.full((5000,), 1 / 5000, dtype=torch.float64)
    hot = Heads.from_matrices(identity_heads(2, 3, 60.0))
    with pytest.warns(backends.SlowKernelWarning, match="dense"):
        assert choose_fast(x, hot, a, None) is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_fast_summation_matches_reference():
    N, d, H = 5000, 3, 4
    x = tokens.uniform(N, d, seed=11)
    A = goe_heads(H, d, 3.0, seed=12)
    a = np.full(N, 1.0 / N)
    res = fast_attention_stats(
        torch.as_tensor(x, device="cuda"),
        torch.as_tensor(A, device="cuda"),
        torch.as_tensor(A, device="cuda"),
        torch.as_tensor(a, device="cuda"),
        tol=1e-10,
    )
    assert res.logZ.device.type == "cuda"
    out_ref, lz_ref = attention_stats_reference(x, A, A, a)
    z_err, o_err = _rel_errors(res.out.cpu(), res.logZ.cpu(), out_ref, lz_ref, A)
    assert max(z_err, o_err) <= 1e-10


def test_threads_do_not_share_the_feature_buffers():
    # The feature buffers are written in place: each thread has its own (Dask threads, servers).
    from concurrent.futures import ThreadPoolExecutor

    jobs = []
    for seed in range(4):
        x = torch.as_tensor(tokens.uniform(3000, 3, seed=seed))
        A = torch.as_tensor(goe_heads(2, 3, 1.0 + seed, seed=seed))
        jobs.append((x, A, torch.full((3000,), 1 / 3000, dtype=torch.float64)))
    with ThreadPoolExecutor(4) as pool:
        results = list(
            pool.map(lambda j: [fast_attention_stats(*j[:2], j[1], j[2], tol=1e-10).logZ for _ in range(8)], jobs)
        )
    for (x, A, a), lz in zip(jobs, results):
        # the fused dense kernel as reference (itself checked against numpy above; numpy is slow at this N)
        _, ref = head_stats(x, Heads.from_matrices(A), a, backend="flash")
        assert max(float((z - ref).abs().max()) for z in lz) < 1e-9


def test_monomial_features_are_the_monomials():
    from attnflow.kernels.fastsum import monomial_features
    from attnflow.kernels.fastsum import monomials as _monomials

    x = torch.as_tensor(tokens.uniform(6, 3, seed=0))
    for degree in (0, 1, 4):
        e = _monomials(degree, 3)
        direct = np.prod(x.numpy()[:, None, :] ** e[None, :, :], axis=-1)
        np.testing.assert_allclose(monomial_features(x, degree).numpy(), direct, rtol=1e-14, atol=1e-16)


def _compiled_and_torch(monkeypatch, *args, **kw):
    """The same fast_stats call through the compiled CPU loops and through the torch builder."""
    from attnflow.kernels import fastsum as fs
    from attnflow.kernels.fastsum import cpu as _fastsum_cpu

    fast = fs.fast_stats(*args, **kw)
    with monkeypatch.context() as m:
        m.setattr(_fastsum_cpu, "AVAILABLE", False)
        fs._LOCAL.__dict__.clear()  # the key moments are cached per cloud: recompute them the torch way
        slow = fs.fast_stats(*args, **kw)
    fs._LOCAL.__dict__.clear()
    return fast, slow


@pytest.mark.parametrize(
    "d,H,dv,N",
    [(2, 3, 2, 5037), (3, 8, 3, 5037), (3, 4, 6, 5037), (4, 2, 4, 5037), (3, 2, 0, 5037), (3, 2, 3, 150_001)],
)
def test_compiled_loops_equal_the_torch_builder(monkeypatch, d, H, dv, N):
    # dv = 6: V stacks extra value rows ([V | A], the diagnostics' shared pass); dv = 0: only log Z.
    # N is not a multiple of the block sizes (the last, partial block is exercised); at 150,001 tokens
    # (74 blocks) the per-core threads run side by side for long enough to corrupt a shared buffer.
    from attnflow.kernels.fastsum import cpu as _fastsum_cpu

    assert _fastsum_cpu.AVAILABLE, "numba is a dependency: the compiled path must be the one CI tests"
    x = torch.as_tensor(tokens.uniform(N, d, seed=d))
    A = torch.as_tensor(goe_heads(H, d, 2.0, seed=1))
    V = None if dv == 0 else torch.as_tensor(np.random.default_rng(2).normal(size=(H, dv, d)))
    a = torch.as_tensor(np.random.default_rng(3).dirichlet(np.ones(N)))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)  # the tests run on one thread (conftest): the per-core shares need two
        fast, slow = _compiled_and_torch(monkeypatch, x, A, V, a, tol=1e-10, check=64)
    finally:
        torch.set_num_threads(before)
    assert float((fast.logZ - slow.logZ).abs().max()) < 1e-13
    if dv:
        assert fast.out.shape == (H, N, dv)
        assert float((fast.out - slow.out).abs().max()) < 1e-13
    else:
        assert fast.out is None
    # both meet the proved bound against the exact sums
    assert fast.achieved_error <= fast.plan.relative_bound + fast.plan.rounding
    # negative control: a different token set moves logZ far beyond the comparison's tolerance
    other = _compiled_and_torch(monkeypatch, x.flip(0), A, V, a, tol=1e-10)[0]
    assert float((other.logZ - slow.logZ).abs().max()) > 1e-6


def test_compiled_features_are_the_monomials():
    from attnflow.kernels.fastsum import cpu as _fastsum_cpu
    from attnflow.kernels.fastsum import feature_exponents as _exponents

    x = tokens.uniform(300, 3, seed=5)
    e = _exponents(9, 3)
    out = np.empty((len(e), 300))
    _fastsum_cpu.build_features(x, e, 9, out)
    direct = np.prod(x[None, :, :] ** e[:, None, :], axis=-1)
    np.testing.assert_allclose(out, direct, rtol=1e-13, atol=1e-300)


def test_key_side_from_the_moments_of_two_degrees():
    # G = sum_j a_j [phi_P; phi_{P-1}](x_j) [1, x_j] assembled from the moments of degrees P + 1 and P
    # equals the direct sums; control: without the sphere (|x| != 1) the phi_{P-1} column is wrong.
    from attnflow.kernels.fastsum import feature_exponents as _exponents
    from attnflow.kernels.fastsum import moment_exponents as _moment_exponents
    from attnflow.kernels.fastsum import moments_to_keys as _moments_to_keys

    for d, P in ((2, 5), (3, 1), (3, 14), (4, 6)):
        x = tokens.uniform(500, d, seed=d + P)
        w = np.random.default_rng(P).dirichlet(np.ones(500))
        direct = np.prod(x[None] ** _exponents(P, d)[:, None, :], axis=-1) @ (
            w[:, None] * np.hstack([np.ones((500, 1)), x])
        )
        mu = np.prod(x[None] ** _moment_exponents(P, d)[:, None, :], axis=-1) @ w
        np.testing.assert_allclose(_moments_to_keys(mu, P, d), direct, rtol=1e-12, atol=1e-15)
    y = 1.1 * x
    mu = np.prod(y[None] ** _moment_exponents(P, d)[:, None, :], axis=-1) @ w
    direct = np.prod(y[None] ** _exponents(P, d)[:, None, :], axis=-1) @ (
        w[:, None] * np.hstack([np.ones((500, 1)), y])
    )
    assert np.abs(_moments_to_keys(mu, P, d) - direct).max() > 1e-3 * np.abs(direct).max()


def test_key_moments_do_not_depend_on_the_thread_count():
    # Fixed groups of chunks: the same bits on one thread or two (a resumed run must repeat itself).
    from attnflow.kernels.fastsum import cpu as _fastsum_cpu
    from attnflow.kernels.fastsum import moment_exponents as _moment_exponents

    x = tokens.uniform(40_000, 3, seed=7)
    w = np.random.default_rng(1).dirichlet(np.ones(40_000))
    e = _moment_exponents(12, 3)
    G = _fastsum_cpu.GROUPS
    one = np.zeros((G, len(e)))
    _fastsum_cpu.weighted_moments(x, w, e, 13, 0, G, one)
    split = np.zeros((G, len(e)))
    for lo, hi in ((0, 5), (5, 40), (40, G)):  # any shares, any order
        _fastsum_cpu.weighted_moments(x, w, e, 13, lo, hi, split)
    assert np.array_equal(one.sum(0), split.sum(0))
    # the test can see a difference in the last bits: the same sums in another order differ
    F = np.prod(x[None, :, :] ** e[:, None, :], axis=-1)
    reordered = F[:, ::-1] @ w[::-1]
    assert not np.array_equal(one.sum(0), reordered)
    np.testing.assert_allclose(one.sum(0), reordered, rtol=1e-10, atol=1e-14)
    # the d = 3 walk (what fast_stats runs): the same sums to rounding, the same bits in any shares
    from attnflow.kernels.fastsum import moment_pairs as _moment_pairs

    k_hi, k_lo = _moment_pairs(12)
    three = np.zeros((G, len(e)))
    _fastsum_cpu.weighted_moments3(x, w, 13, k_hi, k_lo, 0, G, three)
    split3 = np.zeros((G, len(e)))
    for lo, hi in ((0, 33), (33, G)):
        _fastsum_cpu.weighted_moments3(x, w, 13, k_hi, k_lo, lo, hi, split3)
    assert np.array_equal(three.sum(0), split3.sum(0))
    np.testing.assert_allclose(three.sum(0), reordered, rtol=1e-12, atol=1e-16)
    # control: the pairs' second index one place off puts the sums in the wrong entries
    wrong = np.zeros((G, len(e)))
    _fastsum_cpu.weighted_moments3(x, w, 13, k_hi, np.where(k_lo >= 0, k_lo[::-1].clip(0), -1), 0, G, wrong)
    assert np.abs(wrong.sum(0) - reordered).max() > 1e-3 * np.abs(reordered).max()
    # and through fast_stats: one torch thread or two give the same bits
    from attnflow.kernels import fastsum as fs

    xt, A = torch.as_tensor(x), torch.as_tensor(goe_heads(3, 3, 2.0, seed=2))
    wt = torch.as_tensor(w)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        r1 = fs.fast_stats(xt.clone(), A, A, wt, tol=1e-8)
        torch.set_num_threads(2)
        r2 = fs.fast_stats(xt.clone(), A, A, wt, tol=1e-8)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(r1.logZ, r2.logZ) and torch.equal(r1.out, r2.out)


def test_profile_splits_the_time_of_an_evaluation():
    from attnflow.kernels import fastsum as fs

    x = torch.as_tensor(tokens.uniform(20_000, 3, seed=0))
    A = torch.as_tensor(goe_heads(4, 3, 2.0, seed=0))
    a = torch.full((20_000,), 1 / 20_000, dtype=torch.float64)
    with fs.profile() as split:
        fs.fast_stats(x, A, A, a, tol=1e-8)
    parts = {"moments", "coefficients", "features", "evaluation", "division"}
    assert parts <= split.keys()
    assert all(split[k] > 0 for k in parts)
    assert sum(split[k] for k in parts) <= split["total"]
    # outside a profile block nothing is recorded
    fs.fast_stats(x, A, A, a, tol=1e-8)
    assert getattr(fs._LOCAL, "split", None) is None


def test_float32_query_side_only_where_its_proved_bound_fits(monkeypatch):
    from attnflow.kernels import fastsum as fs

    N = 20_000
    x = torch.as_tensor(tokens.uniform(N, 3, seed=11))
    a = torch.full((N,), 1 / N, dtype=torch.float64)
    A1 = torch.as_tensor(goe_heads(4, 3, 1.0, seed=1))
    A1 = A1 / torch.linalg.matrix_norm(A1, ord=2).max()  # beta = 1
    loose = fs.fast_stats(x, A1, A1, a, tol=1e-3, check=200)
    assert loose.precision == "float32"
    assert loose.plan.relative_bound + loose.float32_bound <= 1e-3
    assert loose.achieved_error <= 1e-3
    # the float32 rounding actually made stays within its proved bound (against the float64 evaluation)
    monkeypatch.setattr(fs.evaluator, "float32_rounding_bound", lambda *args: math.inf)
    exact64 = fs.fast_stats(x.clone(), A1, A1, a, fast_plan=loose.plan)
    monkeypatch.undo()
    assert exact64.precision == "float64"
    dz = float(torch.expm1((loose.logZ - exact64.logZ).abs()).max())
    assert 0 < dz <= loose.float32_bound
    # at beta = 8, tol = 1e-6 the monomial sums cancel from ~1e7 down to Z ~ 1: float64 is kept ...
    A8 = 8 * A1
    tight = fs.fast_stats(x, A8, A8, a, tol=1e-6, check=200)
    assert tight.precision == "float64" and tight.float32_bound > 1e-6
    assert tight.achieved_error <= 1e-6
    # ... and rightly: forced to float32 there (the bound silenced), the error exceeds the tolerance
    monkeypatch.setattr(fs.evaluator, "float32_rounding_bound", lambda *args: 0.0)
    forced = fs.fast_stats(x.clone(), A8, A8, a, fast_plan=tight.plan, check=200)
    assert forced.precision == "float32"
    assert forced.achieved_error > 1e-6


def test_torch_threads_are_restored_after_concurrent_evaluations():
    # The query side runs torch on one thread per worker; concurrent calls must leave the setting as found.

    outer = torch.get_num_threads()
    torch.set_num_threads(2)  # the tests run on one thread (conftest): a restore to 1 must show
    try:
        _threads_restored()
    finally:
        torch.set_num_threads(outer)


def _threads_restored():
    from concurrent.futures import ThreadPoolExecutor

    before = torch.get_num_threads()
    x = torch.as_tensor(tokens.uniform(9000, 3, seed=1))
    A = torch.as_tensor(goe_heads(2, 3, 2.0, seed=1))
    a = torch.full((9000,), 1 / 9000, dtype=torch.float64)
    with ThreadPoolExecutor(3) as pool:
        res = list(pool.map(lambda k: fast_attention_stats(x, A * (1 + 0.1 * k), A, a, tol=1e-8, check=16), range(6)))
    assert torch.get_num_threads() == before
    assert max(r.achieved_error for r in res) < 1e-8
    # control: the setting is really lowered inside an evaluation (what the restore undoes), for torch
    # and for the BLAS that the compiled loop calls
    from threadpoolctl import threadpool_info

    from attnflow.kernels import fastsum as fs
    from attnflow.kernels.fastsum import cpu as _fastsum_cpu

    seen = []
    blas_before = {i["filepath"]: i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"}
    real = _fastsum_cpu.evaluate_blocks

    def spy(*args):
        seen.append(torch.get_num_threads())
        seen.extend(i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas")
        return real(*args)

    try:
        _fastsum_cpu.evaluate_blocks = spy
        fs.fast_stats(x.clone(), A, A, a, tol=1e-8)
    finally:
        _fastsum_cpu.evaluate_blocks = real
    assert {i["filepath"]: i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"} == blas_before
    assert seen and set(seen) == {1}
    assert torch.get_num_threads() == before


def test_heads_mixed_inside_the_loop_equal_the_mixed_outputs():
    # fast_stats(mix=...) mixes the heads as their sums are made (no (H, N, d) outputs); the field
    # before P_x must be FieldStats.mixed_output of the per-head outputs, for mha and gf, V != A.
    from attnflow.dynamics.fields import FieldStats, field_stats, mixed_field
    from attnflow.kernels import fastsum as fs
    from attnflow.kernels.dispatch import KernelOptions

    N, H = 20_000, 4
    x = torch.as_tensor(tokens.uniform(N, 3, seed=3))
    A = torch.as_tensor(goe_heads(H, 3, 3.0, seed=4))
    V = torch.as_tensor(np.random.default_rng(5).normal(size=(H, 3, 3)))
    a = torch.as_tensor(np.random.default_rng(6).dirichlet(np.ones(N)))
    w = torch.as_tensor(np.random.default_rng(7).dirichlet(np.ones(H)))
    full = fs.fast_stats(x, A, V, a, tol=1e-10)
    got = {}
    for model in ("mha", "gf"):
        res = fs.fast_stats(x.clone(), A, V, a, fast_plan=full.plan, mix=(model, w))
        assert res.out is None and res.mixed.shape == (N, 3)
        assert torch.equal(res.logZ, full.logZ)
        ref = FieldStats(out=full.out, logZ=full.logZ, log_w=torch.log(w)).mixed_output(model)
        assert float((res.mixed - ref).abs().max()) < 1e-13 * float(ref.abs().max())
        got[model] = res.mixed
        # the same through the fields' entry point, which a run's steps use
        heads = Heads(K=A, V=V)
        opts = KernelOptions("fast", 1e-10)
        via = mixed_field(x, heads, a, w, model, options=opts)
        ref2 = field_stats(x, heads, a, w, options=opts).mixed_output(model)
        assert float((via - ref2).abs().max()) < 1e-13 * float(ref2.abs().max())
    # model gf sums the heads' rows before the products: one "head" S = sum_h w_h Z_h, whose statistics
    # are the per-head ones' (energy, mobility, speed, slope)
    from attnflow.dynamics.fields import mixed_stats

    heads, opts = Heads(K=A, V=V), KernelOptions("fast", 1e-10)
    one, per_head = mixed_stats(x, heads, a, w, "gf", options=opts), field_stats(x, heads, a, w, options=opts)
    assert one.out is None and one.logZ.shape == (1, N)
    assert float((one.log_S - per_head.log_S).abs().max()) < 1e-12
    v = one.velocity(x, "gf")
    for f in (lambda st: st.energy(a), lambda st: st.speed_sq(v, a), lambda st: st.log_slope(x, a)):
        assert abs(float(f(one)) / float(f(per_head)) - 1) < 1e-12
    with pytest.raises(ValueError, match="model 'gf' only"):
        one.mixed_output("mha")
    # control: the two models' mixes differ far beyond the comparison's tolerance
    assert float((got["mha"] - got["gf"]).abs().max()) > 1e-3


@pytest.mark.parametrize("tol", [1e-6, 1e-10])
def test_energy_from_the_key_moments_alone(tol):
    # T_h = sum_ij a_i a_j exp(x_i^T A_h x_j) as g^T C^h g (no query pass): within the plan's proved
    # bound of the exact double sum; state_energy's fast path equals its dense one to that bound.
    from attnflow.dynamics.fields import state_energy
    from attnflow.kernels import fastsum as fs
    from attnflow.kernels.dispatch import KernelOptions

    N, H = 5000, 4
    x = torch.as_tensor(tokens.uniform(N, 3, seed=11))
    A = torch.as_tensor(goe_heads(H, 3, 4.0, seed=12))
    a = torch.as_tensor(np.random.default_rng(13).dirichlet(np.ones(N)))
    w = torch.as_tensor(np.random.default_rng(14).dirichlet(np.ones(H)))
    exact = torch.stack([(a[:, None] * a[None, :] * torch.exp(x @ A[h] @ x.T)).sum() for h in range(H)])
    fp = plan(A, tol, float(torch.linalg.vector_norm(a @ x)))
    T = fs.fast_head_means(x, A, a, fast_plan=fp)
    err = float((T / exact - 1).abs().max())
    assert err <= fp.relative_bound <= tol
    F_exact = -0.5 * float((w * exact).sum())
    heads = Heads(K=A)
    F_fast = state_energy(x, heads, a, w, options=KernelOptions("fast", tol))
    F_dense = state_energy(x, heads, a, w, options=KernelOptions("stream", tol))
    assert abs(F_fast / F_exact - 1) <= tol and abs(F_dense / F_exact - 1) < 1e-13
    # control: four degrees fewer than the plan leaves an error the bound would not allow
    low = dataclasses.replace(fp, degree=fp.degree - 4, features=(fp.degree - 3) ** 2)
    assert float((fs.fast_head_means(x, A, a, fast_plan=low) / exact - 1).abs().max()) > tol


@pytest.mark.parametrize("d, P", [(2, 9), (3, 1), (3, 2), (3, 14), (4, 7)])
def test_compiled_coefficients_equal_the_torch_recursion(d, P):
    # The compiled builder (per head, in the caches) against the whole-array torch one: the same
    # recursion, summed in another order, so equal to rounding. Non-symmetric heads, so that the
    # roles of x and y (rows and columns) are told apart.
    from attnflow.kernels import fastsum as fs

    A = torch.as_tensor(np.random.default_rng(P + 10 * d).normal(size=(3, d, d)))
    fp = dataclasses.replace(plan(A, 1e-6), degree=P, features=fs.n_monomials(P, d) + fs.n_monomials(P - 1, d))
    got = fs.kernel_coefficients_cpu(A, fp)
    ref = fs.kernel_coefficients_torch(A, fp)
    for g, r in zip(got, ref, strict=True):
        assert g.shape == r.shape
        assert float((g - r).abs().max()) <= 1e-13 * float(r.abs().max())
    # control: the transposed heads give other coefficients, far beyond that tolerance
    other = fs.kernel_coefficients_cpu(A.transpose(1, 2).contiguous(), fp)
    if P >= 1:
        assert float((other[0] - ref[0]).abs().max()) > 1e-3 * float(ref[0].abs().max())
