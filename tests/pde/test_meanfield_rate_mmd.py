"""Particles -> mean field: the MMD against closed forms, and the N^{-1/2} rate with its bootstrap CI."""

from __future__ import annotations

import math

import numpy as np
import pytest

import attnflow as af
from attnflow.core.errors import InputError
from attnflow.pde.meanfield import fit_rate, mmd_sphere


def test_mmd_matches_the_explicit_formula_and_is_a_metric():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((30, 3))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    y = rng.standard_normal((20, 3))
    y /= np.linalg.norm(y, axis=1, keepdims=True)
    b = rng.uniform(0.5, 1.5, 20)
    b /= b.sum()
    k = lambda u, v: np.exp(2.0 * (u @ v.T - 1))
    a = np.full(30, 1 / 30)
    ref = math.sqrt(a @ k(x, x) @ a - 2 * a @ k(x, y) @ b + b @ k(y, y) @ b)
    assert mmd_sphere(x, y, b=b, kappa=2.0) == pytest.approx(ref, rel=1e-12)
    assert mmd_sphere(x, x) == pytest.approx(0.0, abs=1e-7)
    with pytest.raises(InputError):
        mmd_sphere(x, y[:, :2])


def test_mmd_on_the_circle_sums_the_kernel_by_its_fourier_series():
    """d = 2: the O((N + M) K) Fourier path of mmd_sphere against the explicit O(N M) sums, at two kappa."""
    rng = np.random.default_rng(2)
    th, ph = rng.uniform(-2.0, 2.0, 300), rng.uniform(-np.pi, np.pi, 120)
    x, y = np.c_[np.cos(th), np.sin(th)], np.c_[np.cos(ph), np.sin(ph)]
    b = rng.uniform(0.5, 1.5, 120)
    b /= b.sum()
    a = np.full(300, 1 / 300)
    for kappa in (0.5, 4.0):
        kxx, kxy, kyy = (np.exp(kappa * (u @ v.T - 1)) for u, v in ((x, x), (x, y), (y, y)))
        sq = a @ kxx @ a - 2 * a @ kxy @ b + b @ kyy @ b
        assert mmd_sphere(x, y, b=b, kappa=kappa) ** 2 == pytest.approx(sq, rel=1e-12, abs=1e-15)


def test_mmd_of_uniform_samples_has_the_closed_form_mean():
    """E MMD^2(mu_N, sigma) = (1 - Z_0(kappa) e^{-kappa}) / N for i.i.d. uniform tokens on S^2."""
    from attnflow.pde.basis import make_basis
    from attnflow.pde.growth import uniform_partition

    b = make_basis(10, 3)  # Gauss-Legendre in z: exact to degree 25, where exp(4 <x, y>)'s coefficients are < 1e-20
    kappa, N = 4.0, 200
    vals = [
        mmd_sphere(af.tokens.uniform(N, 3, seed=s), b.points.numpy(), b=(b.q / b.q.sum()).numpy(), kappa=kappa) ** 2
        for s in range(40)
    ]
    want = (1 - uniform_partition(kappa, 3) * math.exp(-kappa)) / N
    se = np.std(vals) / math.sqrt(len(vals))
    print(f"E MMD^2 {np.mean(vals):.5f} +- {se:.5f}, closed form {want:.5f}")
    assert abs(np.mean(vals) - want) < 4 * se
    # negative control: the same formula with N/2 is rejected
    assert abs(np.mean(vals) - 2 * want) > 4 * se


def test_rate_fit_recovers_a_known_exponent_and_its_ci():
    rng = np.random.default_rng(1)
    Ns = np.array([10, 100, 1000, 10000])
    vals = Ns[:, None] ** -0.5 * np.exp(0.1 * rng.standard_normal((4, 6)))
    fit = fit_rate(Ns, vals, -0.5)
    assert fit.consistent and fit.ci[0] < fit.rate < fit.ci[1]
    flat = np.exp(0.1 * rng.standard_normal((4, 6)))  # control: no decay
    assert not fit_rate(Ns, flat, -0.5).consistent


def test_particles_converge_to_the_pde_at_the_stated_rate_and_a_wrong_pde_is_rejected():
    """Circle, beta = 3, N = 10..1000 (two decades; three in the slow test), 3 seeds, t = 0.5."""
    A = 3.0 * np.eye(2)[None]
    kw = dict(d=2, Ns=(10, 100, 1000), seeds=3, times=(0.5,), lmax=32, dt=0.05)
    r = af.meanfield_convergence(A, **kw)
    print("\n" + r.table())
    assert r.fits["mmd"][0].consistent
    ctl = af.meanfield_convergence(A, pde_weights=0.3 * A, **kw)
    print("control (PDE of another beta):\n" + ctl.table())
    assert not ctl.fits["mmd"][0].consistent and ctl.fits["mmd"][0].rate > -0.4


@pytest.mark.slow
@pytest.mark.parametrize(
    ("d", "lmax", "beta", "eps"),
    [
        (2, 32, 3.0, 0.5),
        pytest.param(
            3, 20, 2.0, 0.3,
            marks=pytest.mark.xfail(
                strict=False,
                reason="measured 2026-12-01: MMD rate -0.481 (CI [-0.503, -0.455]) at t = 0.25 but -0.466 "
                "(CI [-0.487, -0.440]) at t = 0.5; decade slopes -0.47, -0.44, -0.50: the middle decade is "
                "shallower and the 4-seed bootstrap CI is narrow. Reported as FAIL, not tuned. A rerun with 8 other "
                "seeds (seed=1) gave -0.503 [-0.530, -0.479] and -0.490 [-0.519, -0.465], both holding -1/2.",
            ),
        ),
    ],
)  # fmt: skip
def test_three_decades_of_n(d, lmax, beta, eps):
    """N = 10..10^4 (three decades), 4 seeds, times 0.25 and 0.5: the MMD rate's CI holds -1/2."""
    r = af.meanfield_convergence(
        beta * np.eye(d)[None],
        d=d,
        Ns=(10, 100, 1000, 10_000),
        seeds=4,
        times=(0.25, 0.5),
        lmax=lmax,
        dt=0.05,
        eps=eps,
        w2_max=10_000 if d == 2 else 1000,
        backend="auto",
    )
    print("\n" + r.table())
    assert all(f.consistent for f in r.fits["mmd"])


def test_a_drifting_series_is_reported_pre_asymptotic_not_as_a_rate():
    """The issue's beta 4.5, d = 2 series: local slopes -0.23, -0.47, -0.68 per decade fit to about -0.46 over
    N = 10..1e4, a CI holding nothing asymptotic; the local-slope detector says pre-asymptotic and claims no rate.
    Negative control: a clean N^-1/2 series of the same noise gives its rate over the whole range."""
    rng = np.random.default_rng(3)
    Ns = np.array([10, 100, 1000, 10000])
    law = Ns**0.115 * np.exp(-0.05 * np.log(Ns) ** 2)  # local slopes 0.115 - 0.05 (ln N_i + ln N_i+1)
    drift = fit_rate(Ns, law[:, None] * np.exp(0.03 * rng.standard_normal((4, 4))), -0.5)
    assert np.allclose(drift.local, [-0.23, -0.46, -0.69], atol=0.05)
    assert drift.pre_asymptotic and not drift.consistent and "pre-asymptotic" in drift.describe()
    assert drift.rate == pytest.approx(-0.46, abs=0.03)  # the fit over every N that used to be reported
    clean = fit_rate(Ns, Ns[:, None] ** -0.5 * np.exp(0.03 * rng.standard_normal((4, 4))), -0.5)
    assert not clean.pre_asymptotic and clean.asymptotic_from == 10 and clean.consistent
    assert "rate -0.5" in clean.describe()


def test_clean_series_are_rarely_called_pre_asymptotic():
    """The detector's false alarm on clean N^-1/2 series at 4 seeds and 10% noise stays near its 5% level
    (measured 4/100 with the sqrt(S/(S-1)) widening, 12/100 without); a drifting series is always caught."""
    rng = np.random.default_rng(1)
    Ns = np.array([10, 100, 1000, 10000])
    false = sum(
        fit_rate(Ns, Ns[:, None] ** -0.5 * np.exp(0.1 * rng.standard_normal((4, 4))), -0.5, n_boot=300).pre_asymptotic
        for _ in range(60)
    )
    assert false <= 8, false  # binomial(60, 0.05): P(> 8) < 2%
    law = Ns**0.115 * np.exp(-0.05 * np.log(Ns) ** 2)
    caught = sum(
        fit_rate(Ns, law[:, None] * np.exp(0.05 * rng.standard_normal((4, 4))), -0.5, n_boot=300).pre_asymptotic
        for _ in range(20)
    )
    assert caught == 20


def test_the_table_prints_n_times_the_mean_square_distance():
    """N mean(d^2) per N beside the fit: flat (1.00) for d = N^-1/2 exactly; a d = N^-0.45 series (control) grows
    by 10^0.1 per decade (1.26, 1.58), which the rate's table then shows."""
    from attnflow.pde.meanfield import MeanFieldConvergence

    Ns = np.array([10, 100, 1000])
    for p, want in ((-0.5, "N mean d^2: 1, 1, 1;"), (-0.45, "N mean d^2: 1.26, 1.58, 2;")):
        # (N, seeds, times), no noise: only the table's numbers are read here (the detector's verdict on an exact
        # series is not: its replicates all coincide and rounding-level slope differences count as drift)
        vals = np.repeat((Ns.astype(float) ** p)[:, None, None], 3, axis=1)
        fit = fit_rate(Ns, vals[:, :, 0], -0.5, n_boot=50)
        r = MeanFieldConvergence(Ns, np.array([0.5]), {"mmd": vals}, {"mmd": [fit]}, pde=None)  # type: ignore[arg-type]
        print(r.table())
        assert want in r.table()


def test_w2_max_below_two_token_counts_means_no_w2_and_a_bad_one_is_refused_before_any_run(monkeypatch):
    """``w2_max=0``: the MMD alone (before: every run made, then "a rate needs distances at two values of
    N" raised); a negative or fractional ``w2_max`` is refused before the PDE or any particle run."""
    A = 3.0 * np.eye(2)[None]
    kw = dict(d=2, Ns=(10, 20, 40), seeds=2, times=(0.1,), lmax=32, dt=0.05)
    r = af.meanfield_convergence(A, w2_max=0, **kw)
    assert set(r.values) == set(r.fits) == {"mmd"} and "w2" not in r.table()
    assert np.isfinite(r.values["mmd"]).all()
    both = af.meanfield_convergence(A, w2_max=20, **kw)  # control: two N at or below it, W2 at those
    assert set(both.fits) == {"mmd", "w2"}
    assert np.isfinite(both.values["w2"][:2]).all() and np.isnan(both.values["w2"][2]).all()
    np.testing.assert_array_equal(both.values["mmd"], r.values["mmd"])  # the same runs

    import attnflow.pde.meanfield as mf

    def no_pde(*a, **k):
        raise AssertionError("the PDE was solved before w2_max was checked")

    monkeypatch.setattr(mf, "solve_pde", no_pde)
    for bad in (-1, 2.5):
        with pytest.raises(InputError, match="w2_max"):
            af.meanfield_convergence(A, w2_max=bad, **kw)
