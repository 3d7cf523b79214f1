"""The per-seed floor's error from the integrated autocorrelation time, against AR(1) closed forms.

For AR(1) ``y_k = phi y_{k-1} + e_k`` the integrated autocorrelation time is ``(1 + phi) / (1 - phi)``
and the variance of the mean of ``n`` samples is exactly
``gamma_0 / n (1 + 2 sum_{k<n} (1 - k/n) phi^k)``, ``gamma_0 = 1 / (1 - phi^2)``.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.signal import lfilter

from attnflow.experiments.floors import MIN_TAUS, correlated_means, integrated_time, time_average


def _ar1(rng: np.random.Generator, phi: float, n: int, m: int = 1) -> np.ndarray:
    e = rng.standard_normal((m, n + 2000))
    return lfilter([1.0], [1.0, -phi], e, axis=1)[:, 2000:]  # burn-in: start in the stationary law


def _var_of_mean(phi: float, n: int) -> float:
    k = np.arange(1, n)
    return 1.0 / (1.0 - phi**2) / n * (1.0 + 2.0 * float(np.sum((1.0 - k / n) * phi**k)))


@pytest.mark.parametrize("phi", [0.0, 0.5, 0.8, 0.95])
def test_integrated_time_recovers_the_ar1_closed_form(phi):
    """One long series (over 5000 tau_int): within 10% of (1 + phi) / (1 - phi); Sokal's window closes."""
    rng = np.random.default_rng(1)
    tau, closed = integrated_time(_ar1(rng, phi, 200_000)[0])
    assert closed and tau == pytest.approx((1 + phi) / (1 - phi), rel=0.10)


def test_pooled_short_windows_recover_tau_and_the_error_of_the_mean_where_batch_means_fail():
    """The heads' situation: 8 seeds with windows only 7 tau_int long (63 samples, phi = 0.8, tau_int = 9).

    The error from the pooled tau_int recovers the exact variance of a window's mean within 20% (over
    500 replicate ensembles); the control, batch means with 8 batches of 8 samples (shorter than tau_int),
    underestimates it by more than 30%.
    """
    rng = np.random.default_rng(2)
    phi, n, seeds, reps = 0.8, 63, 8, 500
    exact = _var_of_mean(phi, n)
    Y = _ar1(rng, phi, n, seeds * reps)
    t = np.arange(n, dtype=float)
    assert Y.mean(axis=1).var() == pytest.approx(exact, rel=0.1)  # the closed form is the scatter
    ens = [correlated_means(t, list(Y[i : i + seeds])) for i in range(0, len(Y), seeds)]
    iat = float(np.mean([np.mean(c.se**2) for c in ens]))
    batch = float(np.mean([time_average(t, y, 0.0)[1] ** 2 for y in Y]))
    assert iat == pytest.approx(exact, rel=0.2)
    assert batch < 0.7 * exact  # the negative control: too-short batches underestimate
    taus = np.array([c.tau_int for c in ens])
    assert np.median(taus) == pytest.approx(9.0, rel=0.25)
    # The pooled window is 8 x 7 = 56 tau_int: just above MIN_TAUS, so most ensembles are trusted.
    assert np.mean([c.trusted for c in ens]) > 0.5


def test_too_short_windows_and_differing_means_are_not_trusted():
    rng = np.random.default_rng(3)
    t = np.arange(63, dtype=float)
    short = correlated_means(t, list(_ar1(rng, 0.8, 63, 2)))  # 2 x 63 samples = 14 tau_int
    assert short.length_taus < MIN_TAUS and not short.trusted
    # Series of one law but with different means: the pooled autocovariance does not decay, no trust.
    Y = _ar1(rng, 0.5, 400, 8) + 5.0 * np.arange(8)[:, None]
    shifted = correlated_means(np.arange(400, dtype=float), list(Y))
    assert not shifted.trusted
    # A constant series: its mean is exact.
    const = correlated_means(t, [np.ones(63)] * 8)
    assert const.tau_int == pytest.approx(1.0) and np.all(const.se == 0.0)


def test_series_of_different_lengths_pool():
    """Seeds' windows start at their own relaxation times: series of different lengths pool (a regression:
    a list of unequal arrays once failed), and agree with the closed form."""
    rng = np.random.default_rng(4)
    ys = [y[: 3000 + 500 * i] for i, y in enumerate(_ar1(rng, 0.8, 6000, 8))]
    tau, closed = integrated_time(ys)
    assert closed and tau == pytest.approx(9.0, rel=0.2)
    assert len(correlated_means(np.arange(6000, dtype=float), ys).se) == 8
    assert integrated_time(np.vstack([y[:3000] for y in ys]))[0] == pytest.approx(tau, rel=0.2)  # a 2-D array


def test_heads_reports_seeds_too_short_for_their_correlation_time():
    """A run whose pooled window is a few tau_int long: its seeds are reported, not averaged in."""
    from attnflow.experiments import run_experiment

    sets = ["tokens.d=2", "heads.counts=[4, 8]", "seeds=3", "integration.t_end=4", "draws=16", "tail=2"]
    res = run_experiment("heads", quick=True, seed=0, sets=sets)
    short = [u for u in res.headline["unsettled"] if "too short for its correlation time" in u["why"]]
    assert short, res.headline["unsettled"]
    # results.json's entry, from the typed record (heads_params.UnsettledSeed.as_json)
    assert set(short[0]) == {"set", "H", "seed", "why", "floor", "predicted", "clusters", "state"}
    assert short[0]["set"] == "base" and short[0]["H"] in (4, 8) and isinstance(short[0]["clusters"], list)
    tau = res.headline["sets"]["base"]["tau_int"]
    assert all(t > 0 for t in tau) and not res.predictions[0].passed
    # The exponent's note says which H were left out and why.
    assert (
        "Left out of the fit" in res.predictions[1].explanation and "correlation time" in res.predictions[1].explanation
    )
    # Without a fit the sequential design adds seed batches up to NO_FIT_BATCHES (more seeds lengthen the
    # pooled window), and undecided there is a FAIL.
    from attnflow.experiments.heads import NO_FIT_BATCHES, SEED_BATCHES

    batches = res.headline["sets"]["base"]["seed_batches"]
    assert batches["used"] == NO_FIT_BATCHES and batches["cap"] == SEED_BATCHES and batches["size"] == 3
    assert not res.predictions[1].passed and "no fit" in res.predictions[1].explanation
    assert len(res.headline["seeds"]) == 9
