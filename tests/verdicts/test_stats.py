"""The shared statistics: one home (imported back where the experiments used them), and the local-slope
detector of an asymptotic range on synthetic series."""

from __future__ import annotations

import numpy as np
import pytest

from attnflow.verdicts import stats


def test_moved_statistics_are_the_same_objects_where_experiments_import_them():
    from attnflow.experiments import common, floors, runs

    assert floors.integrated_time is stats.integrated_time and floors.correlated_means is stats.correlated_means
    assert floors.time_average is stats.time_average and floors.MIN_TAUS == stats.MIN_TAUS
    assert common.loglog_fit is stats.loglog_fit and common.local_slopes is stats.local_slopes
    assert runs.late_mean is stats.late_mean


def test_integrated_time_of_ar1_is_its_closed_form():
    rng = np.random.default_rng(0)
    phi, n = 0.8, 200_000
    e = rng.standard_normal(n)
    y = np.empty(n)
    y[0] = e[0]
    for i in range(1, n):
        y[i] = phi * y[i - 1] + e[i]
    tau, closed = stats.integrated_time(y)
    assert closed and tau == pytest.approx((1 + phi) / (1 - phi), rel=0.05)
    assert stats.integrated_time(rng.standard_normal(50_000))[0] == pytest.approx(1.0, abs=0.1)


def test_bootstrap_intervals_cover_the_mean():
    rng = np.random.default_rng(1)
    v = rng.normal(2.0, 1.0, 400)
    lo, hi = stats.bootstrap_ci(v, rng=np.random.default_rng(2))
    assert lo < 2.0 < hi and hi - lo == pytest.approx(2 * 1.96 / 20, rel=0.15)
    groups = [rng.normal(m, 0.1, 8) for m in (1.0, 2.0, 3.0)]
    b = stats.hierarchical_bootstrap(groups, lambda g: float(np.mean(g[2]) - np.mean(g[0])), n_boot=500, rng=rng)
    lo, hi = stats.percentile_ci(b)
    assert lo < 2.0 < hi and hi - lo < 0.3


def _series(drift: float, seed: int, seeds: int = 16, p: float = -0.5):
    """Seed values of ``N^p exp(drift log^2 N)`` times 5% noise over N = 10..1e4, their local slopes
    and bootstrap replicates of them."""
    rng = np.random.default_rng(seed)
    Ns = np.array([10.0, 100, 1000, 10_000])
    law = Ns**p * np.exp(drift * np.log(Ns) ** 2)
    vals = law[:, None] * np.exp(0.05 * rng.standard_normal((len(Ns), seeds)))
    fn = lambda g: stats.local_slopes(Ns, np.array([x.mean() for x in g]))
    groups = list(vals)
    boots = np.array([fn([x[rng.integers(0, len(x), len(x))] for x in groups]) for _ in range(400)])
    return fn(groups), boots


def test_asymptotic_start_finds_a_clean_law_and_rejects_a_drifting_one():
    local, boots = _series(0.0, 0)
    assert np.allclose(local, -0.5, atol=0.05)
    assert stats.asymptotic_start(local, boots) == 0
    # The meanfield series: local slopes -0.23, -0.47, -0.68 per decade (a curving log-log line).
    local, boots = _series(-0.05, 0, p=0.115)
    assert np.allclose(local, [-0.23, -0.46, -0.69], atol=0.03)
    assert stats.asymptotic_start(local, boots) is None


def test_batches_needed_projects_the_width_only():
    """B (w / w*)^2: a half-width 0.3 after 2 batches, decisive at 0.1, needs 18 batches; no interval: nan."""
    assert stats.batches_needed((-0.1, 0.5), 0.1, 2) == pytest.approx(18.0, rel=1e-14)
    assert stats.batches_needed((0.2, 0.3), 0.1, 4) == pytest.approx(1.0, rel=1e-14)  # already decisive
    assert np.isnan(stats.batches_needed((float("nan"), float("nan")), 0.1, 1))
    assert np.isnan(stats.batches_needed((float("-inf"), float("inf")), 0.1, 1))
    assert stats.batches_needed((0.0, 0.6), 0.0, 1) == float("inf")
    # the design's step: open, budget left, decision within the budget
    assert stats.more_batches(True, 2, 12, 9.0, 3)
    assert not stats.more_batches(True, 2, 12, 18.0, 3)  # beyond the budget: stop undecided
    assert not stats.more_batches(False, 2, 12, 9.0, 3)  # decided
    assert not stats.more_batches(True, 12, 12, 11.0, 3)  # budget spent
    assert stats.more_batches(True, 2, 12, float("nan"), 3) and not stats.more_batches(True, 3, 12, float("nan"), 3)


def _sequential(sd: float, budget: int, seed: int) -> tuple[str, int, float]:
    """A synthetic sequential design: batches of 8 draws of N(0, sd); the claim "the mean is 0" against the
    competitor "the mean is 1" is decided once the 95% interval lies inside (-1/2, 1/2) (PASS) or outside it."""
    rng = np.random.default_rng(seed)
    draws: list[float] = []
    batches, need = 0, float("nan")
    while True:
        draws.extend(rng.normal(0.0, sd, 8))
        batches += 1
        m, hw = float(np.mean(draws)), 1.96 * float(np.std(draws, ddof=1)) / np.sqrt(len(draws))
        verdict = "PASS" if abs(m) + hw < 0.5 else ("FAIL" if abs(m) - hw > 0.5 else "UNDECIDED")
        need = stats.batches_needed((m - hw, m + hw), 0.25, batches)  # decisive: half the distance to the boundary
        if not stats.more_batches(verdict == "UNDECIDED", batches, budget, need, 1):
            return verdict, batches, need


def test_a_sequential_design_decides_within_its_budget_or_stops_undecided():
    """sd 1: a batch's half-width ~0.7 projects ~8 batches to the decisive 0.25, within a budget of 12; at seed 0
    the design decides (PASS, the true mean 0) after 3 batches (projection then 5.8). sd 4: the projection (43.5
    batches) exceeds the budget, so it stops after the first batch, UNDECIDED, instead of spending the budget on
    a decision out of reach."""
    verdict, batches, need = _sequential(1.0, 12, 0)
    print(f"sd 1: {verdict} after {batches} batches (projection {need:.1f})")
    assert verdict == "PASS" and batches == 3 and need == pytest.approx(5.78, abs=0.01)
    verdict, batches, need = _sequential(4.0, 12, 0)
    print(f"sd 4: {verdict} after {batches} batches (projection {need:.1f})")
    assert verdict == "UNDECIDED" and batches == 1 and need == pytest.approx(43.5, abs=0.1)


def test_asymptotic_fit_reads_the_order_on_the_range_where_exact_local_orders_agree():
    """A deterministic convergence study (EDI of smooth weights): ``e(h) = h^4 + 30 h^6`` is pre-asymptotic at
    coarse ``h``; the fit keeps the finest steps whose local orders lie within ``tol`` of each other."""
    h = np.array([0.4, 0.2, 0.1, 0.05, 0.025])
    e = h**4 + 30 * h**6
    local = stats.local_slopes(h, e)
    order, steps, got_local = stats.asymptotic_fit(h, e, tol=0.2)
    assert np.allclose(got_local, local)
    kept = len(steps) - 1  # pairs in the range
    # Every pair in the range agrees with every other within tol; adding the next coarser one would not.
    rng_local = local[-kept:]
    assert rng_local.max() - rng_local.min() <= 0.2 < local[-kept - 1 :].max() - local[-kept - 1 :].min()
    assert steps == [float(v) for v in h[-kept - 1 :]]
    assert abs(order - stats.loglog_fit(h[-kept - 1 :], e[-kept - 1 :])[0]) < 1e-12
    assert steps == [0.1, 0.05, 0.025] and abs(order - 4.176) < 1e-3  # local orders 4.27, 4.08
    # Negative control: fitted over every step, the coarse steps pull the order to 4.61, off 4 by 3x more.
    assert abs(stats.loglog_fit(h, e)[0] - 4.0) > 3 * abs(order - 4.0)
    # Rounding: a last residual at the floor drops its pair; a clean h^4 over the rest is exact.
    e2 = h**4
    e2[-1] = 1e-20
    o2, s2, _ = stats.asymptotic_fit(h, e2, tol=0.2, floor=1e-13)
    assert s2 == [float(v) for v in h[:-1]] and abs(o2 - 4.0) < 1e-12


def test_asymptotic_fit_is_pre_asymptotic_when_the_orders_drift_to_the_end():
    """Local orders 1, 2, 3, 4: no two successive pairs agree within 0.5; the range is the last pair alone."""
    h = np.array([1.0, 0.5, 0.25, 0.125, 0.0625])
    e = np.cumprod([1.0, 0.5**1, 0.5**2, 0.5**3, 0.5**4])
    order, steps, local = stats.asymptotic_fit(h, e, tol=0.5)
    assert np.allclose(local, [1, 2, 3, 4]) and len(steps) == 2 and abs(order - 4.0) < 1e-12
    # Positive control: the same steps at one order form one range.
    order, steps, _ = stats.asymptotic_fit(h, h**2.0, tol=0.5)
    assert len(steps) == 5 and abs(order - 2.0) < 1e-12


def test_asymptotic_fit_with_replicates_uses_their_spread_not_a_band():
    """With bootstrap replicates of the slopes, a drift counts only where its interval excludes ``[-tol, tol]``:
    slopes 1.0, 1.0, 1.6 with a spread of 0.05 drift (range: the last pair); with a spread of 1 they do not."""
    rng = np.random.default_rng(3)
    h = np.array([0.8, 0.4, 0.2, 0.1])
    e = h * np.array([1.0, 1.0, 1.0, 2.0 ** (-0.6)])
    local = stats.local_slopes(h, e)
    assert np.allclose(local, [1.0, 1.0, 1.6])
    tight = local + 0.05 * rng.standard_normal((2000, 3))
    wide = local + 1.0 * rng.standard_normal((2000, 3))
    assert len(stats.asymptotic_fit(h, e, tol=0.3, boots=tight)[1]) == 2
    assert len(stats.asymptotic_fit(h, e, tol=0.3, boots=wide)[1]) == 4


def test_an_alternating_series_has_no_correlation_time_and_no_error_bar():
    """Sokal's rule ``M >= c tau(M)`` holds trivially once the lag sum goes negative (``y = 3 +- 1``: ``rho_1 =
    -1``, ``tau(1) = -1``): that is not an estimate, so the window is not closed, the means carry no error and are
    not trusted (it raised ``math domain error`` in ``heads`` at ``t_end = 3``). Control: AR(1) with ``phi = 0.5``
    keeps its estimate, close to ``(1 + phi) / (1 - phi) = 3``."""
    import math

    from attnflow.verdicts.stats import correlated_means, integrated_time

    y = np.tile([1.0, -1.0], 50) + 3.0
    tau, closed = integrated_time([y], per_lag=True)
    assert tau <= 0 and not closed
    cm = correlated_means(np.arange(100.0), [y, y + 0.1], same_law=True)
    assert not cm.trusted and not cm.window_closed and np.isnan(cm.se).all() and math.isnan(cm.length_taus)
    rng = np.random.default_rng(3)
    e = rng.standard_normal(20000)
    ar = np.zeros_like(e)
    for i in range(1, len(e)):
        ar[i] = 0.5 * ar[i - 1] + e[i]
    tau, closed = integrated_time([ar + 5.0], per_lag=True)
    assert closed and 2.7 < tau < 3.3
    cm = correlated_means(np.arange(20000.0), [ar + 5.0])
    assert cm.trusted and np.isfinite(cm.se).all()
