"""One home for the statistics that experiments share: window means, integrated autocorrelation times,
bootstrap and hierarchical bootstrap intervals, power-law fits, local slopes and their asymptotic range,
and the sequential design with a fixed budget (:func:`batches_needed`, :func:`more_batches`).

Errors of time averages come from the series' own **integrated autocorrelation time**
(:func:`integrated_time`, Sokal's automatic windowing, as emcee's ``integrated_time``;
:func:`correlated_means` pools the autocovariance over series of one law), not from batch means,
which underestimate the error when a batch is no longer than the correlation time. An estimate from
fewer than :data:`MIN_TAUS` ``tau_int`` is not trusted.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

#: Batches of the batch-means standard error of a time average (consecutive blocks of the window).
BATCHES = 8


def time_average(t: np.ndarray, y: np.ndarray, start: float) -> tuple[float, float]:
    """Time average of ``y`` over ``t >= start`` (trapezoid rule) and its batch-means standard error
    (:data:`BATCHES` consecutive blocks; ``nan`` when the window holds fewer saved times than blocks)."""
    m = np.asarray(t) >= start - 1e-12
    tt, yy = np.asarray(t)[m], np.asarray(y)[m]
    if len(tt) < 2:
        return float("nan"), float("nan")
    mean = float(np.trapezoid(yy, tt) / (tt[-1] - tt[0]))
    if len(yy) < 2 * BATCHES:
        return mean, float("nan")
    blocks = np.array_split(yy, BATCHES)
    bm = np.array([b.mean() for b in blocks])
    return mean, float(bm.std(ddof=1) / math.sqrt(BATCHES))


#: Sokal's automatic window: the autocorrelation sum is cut at the first lag ``M >= AUTO_WINDOW_C tau(M)``
#: (Sokal 1997; emcee's ``integrated_time`` uses the same c = 5). Beyond ``M`` the sum only adds noise.
AUTO_WINDOW_C = 5.0
#: A ``tau_int`` estimate is trusted only from a series at least this many ``tau_int`` long (emcee's
#: rule of thumb): the centring of a series of length ``n`` biases every autocorrelation by about
#: ``-tau / n``, so the windowed sum (``M ~ 5 tau`` lags, both sides) by about ``-10 tau / n``, 20% at 50.
MIN_TAUS = 50.0


@dataclass(frozen=True)
class CorrelatedMeans:
    """Time averages of series that share one law, with errors from their integrated autocorrelation time.

    ``tau_int`` (in units of ``t``) is estimated from the autocovariance pooled over the series about
    their pooled mean; ``means`` and ``se`` are each series' own average and standard error
    ``sqrt(var_b tau_int / L_b)``; ``length_taus`` is the pooled length in ``tau_int``; ``trusted`` when it
    is at least :data:`MIN_TAUS` and Sokal's window closed inside the series.
    """

    tau_int: float
    means: np.ndarray
    se: np.ndarray
    length_taus: float
    window_closed: bool

    @property
    def trusted(self) -> bool:
        return self.window_closed and self.length_taus >= MIN_TAUS


def integrated_time(
    series: list[np.ndarray] | np.ndarray, c: float = AUTO_WINDOW_C, per_lag: bool = False
) -> tuple[float, bool]:
    """``tau_int = 1 + 2 sum_{k=1}^{M} rho_k`` in samples, and whether Sokal's window closed.

    ``series``: one 1-D series or several (of any lengths) sampled at the same uniform step from one
    stationary law; the autocovariance ``gamma_k`` is pooled over them about their pooled mean
    (``sum_s sum_i y_i y_{i+k} / sum_s n_s``), ``rho_k = gamma_k / gamma_0``, and ``M`` is the first lag
    with ``M >= c tau(M)`` (Sokal's automatic windowing). ``tau_int`` is the factor by which correlation
    inflates the variance of a mean: ``var(mean) = gamma_0 tau_int / n``; for AR(1) with coefficient
    ``phi`` it is ``(1 + phi) / (1 - phi)``.

    ``per_lag``: divide each lag's sum by its own number of pairs (``sum_s max(n_s - k, 0)``) instead of by
    ``sum_s n_s``. The default (emcee's) shrinks lag ``k`` by about ``1 - k/n``, which is small for one long
    series but not for windows only a few ``tau_int`` long: for 8 windows of 6.6 ``tau_int`` each it gave
    ``tau_int`` 17% low (``per_lag`` 6%; tests/experiments/test_floor_calibration.py).
    """
    one = isinstance(series, np.ndarray) and series.ndim == 1
    ys = [np.asarray(series, float)] if one else [np.asarray(s, float) for s in series]
    ys = [y for y in ys if len(y) >= 2]
    if not ys:
        return math.nan, False
    mu = float(np.concatenate(ys).mean())
    n_max = max(len(y) for y in ys)
    acov, pairs = np.zeros(n_max), np.zeros(n_max)
    for y in ys:
        z = y - mu
        n = len(z)
        f = np.fft.rfft(z, 2 * n)
        acov[:n] += np.fft.irfft(f * np.conj(f))[:n]
        pairs[:n] += np.arange(n, 0, -1)
    acov /= pairs if per_lag else sum(len(y) for y in ys)
    if acov[0] <= 0.0:
        return 1.0, True  # a constant series: no correlation to speak of, its mean is exact
    taus = 2.0 * np.cumsum(acov / acov[0]) - 1.0
    ok = np.arange(n_max) >= c * taus
    if not ok.any():
        return float(taus[-1]), False
    tau = float(taus[int(np.argmax(ok))])
    # Sokal's rule M >= c tau(M) holds trivially once the noisy sum of lags goes negative (an alternating
    # series): that is no estimate (a variance of a mean cannot be negative), so the window did not close.
    return tau, tau > 0.0


def correlated_means(
    t: np.ndarray, series: list[np.ndarray], c: float = AUTO_WINDOW_C, same_law: bool = False
) -> CorrelatedMeans:
    """:class:`CorrelatedMeans` of ``series`` (each a window of one run, saved at the uniform step of ``t``).

    Each series' variance is its own, corrected for the centring on its own mean
    (``E s^2 = gamma_0 (1 - tau / n)``); the correlation time is the pooled one (:func:`integrated_time`).

    ``same_law``: the series are draws of one law up to its scale (the seeds of one run, whose ``|dF|^2``
    is a sum of squared Gaussian components: its variance is its mean squared times a constant). Each
    series' variance is then its mean squared times the pooled relative variance (``S`` times the degrees
    of freedom of one window's own variance, whose scatter made each error a Student ``t`` of few degrees
    of freedom), and ``tau_int`` is estimated ``per_lag``.
    """
    dt = float(np.median(np.diff(np.asarray(t, float))))
    tau, closed = integrated_time(series, c, per_lag=same_law)
    ys = [np.asarray(y, float) for y in series]
    means = np.array([float(y.mean()) if len(y) else math.nan for y in ys])
    shrinks = [1.0 - tau / len(y) if len(y) else math.nan for y in ys]
    rel = math.nan
    if same_law and math.isfinite(tau):
        w = [
            (len(y), float(y.var()) / (m * m * k))
            for y, m, k in zip(ys, means, shrinks)
            if len(y) >= 2 and k > 0 and m != 0
        ]
        rel = sum(n * v for n, v in w) / sum(n for n, _ in w) if w else math.nan
    se, n_tot = [], 0
    for y, m, k in zip(ys, means, shrinks):
        n = len(y)
        n_tot += n
        if n < 2 or not math.isfinite(tau) or tau <= 0.0:
            se.append(math.nan)
            continue
        var = m * m * rel if same_law else (float(y.var()) / k if k > 0 else math.inf)
        se.append(math.sqrt(var * tau / n))
    return CorrelatedMeans(tau * dt, means, np.array(se), n_tot / tau if tau > 0 else math.nan, closed)


def loglog_fit(xs: np.ndarray, ys: np.ndarray) -> tuple[float, float]:
    """Least-squares exponent ``p`` and prefactor ``c`` of ``y = c x^p``."""
    p, logc = np.polyfit(np.log(xs), np.log(ys), 1)
    return float(p), float(np.exp(logc))


def local_slopes(xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """Local log-log slopes ``log(y_{i+1} / y_i) / log(x_{i+1} / x_i)`` between successive points (local orders
    and exponents, read to find a fit's asymptotic range)."""
    x, y = np.asarray(xs, dtype=np.float64), np.asarray(ys, dtype=np.float64)
    return np.log(y[1:] / y[:-1]) / np.log(x[1:] / x[:-1])


def late_mean(t: np.ndarray, y: np.ndarray, fraction: float = 0.5) -> float:
    """Time average of ``y`` over the last ``fraction`` of the run (trapezoid rule)."""
    m = t >= t[-1] - fraction * (t[-1] - t[0])
    return float(np.trapezoid(y[m], t[m]) / (t[m][-1] - t[m][0]))


def early_mean(t: np.ndarray, y: np.ndarray, fraction: float = 0.1) -> float:
    m = t <= t[0] + fraction * (t[-1] - t[0])
    return float(np.trapezoid(y[m], t[m]) / (t[m][-1] - t[m][0]))


def percentile_ci(boots: Sequence[float] | np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """The percentile interval at ``level`` of bootstrap replicates ``boots`` (non-finite ones left out)."""
    b = np.asarray(boots, float)
    b = b[np.isfinite(b)]
    if len(b) == 0:
        return math.nan, math.nan
    a = 50.0 * (1.0 - level)
    lo, hi = np.percentile(b, [a, 100.0 - a])
    return float(lo), float(hi)


def bootstrap_ci(
    values: Sequence[float] | np.ndarray,
    stat: Callable[[np.ndarray], float] = np.mean,
    *,
    n_boot: int = 2000,
    rng: np.random.Generator | None = None,
    level: float = 0.95,
) -> tuple[float, float]:
    """Percentile bootstrap interval of ``stat(values)``: ``values`` resampled with replacement ``n_boot`` times."""
    v = np.asarray(values, float)
    rng = rng if rng is not None else np.random.default_rng(0)
    return percentile_ci([stat(v[rng.integers(0, len(v), len(v))]) for _ in range(n_boot)], level)


def hierarchical_bootstrap(
    groups: Sequence[np.ndarray], fn: Callable[[list[np.ndarray]], Any], *, n_boot: int, rng: np.random.Generator
) -> np.ndarray:
    """Replicates of ``fn(groups)`` with each group (e.g. the seeds at one ``N`` or one ``H``) resampled with
    replacement within itself, group by group in order (the levels stay fixed, the seeds vary): the
    bootstrap of a fit across levels whose points each average independent seeds. ``fn`` may return a
    number or an array: the result is ``(n_boot,)`` or ``(n_boot, ...)``."""
    return np.asarray([fn([g[rng.integers(0, len(g), len(g))] for g in groups]) for _ in range(n_boot)], float)


def asymptotic_start(
    local: np.ndarray, boots: np.ndarray | None, *, level: float = 0.95, min_points: int = 3, tol: float = 0.0
) -> int | None:
    """Where a power law's asymptotic range starts: the first index ``i`` from which the local slopes
    ``local[i:]`` (:func:`local_slopes`) no longer drift, i.e. for every pair ``j < k`` in the range the
    bootstrap interval of ``slope_k - slope_j`` (replicates ``boots`` ``(B, len(local))``) holds 0, each at
    Bonferroni's level ``1 - (1 - level) / pairs`` so that ``level`` holds for the range as a whole. The range
    must span at least ``min_points`` points (``min_points - 1`` slopes); ``None`` when no such range
    exists: the data are pre-asymptotic. The scale of a drift is the slopes' own bootstrap error, not a
    band chosen in advance. ``tol``: a drift counts only when its interval also excludes ``[-tol, tol]``, the
    resolution of the claim the slopes are read for (a caller deciding between two laws passes half their gap:
    a drift smaller than that cannot move the verdict, and at ``tol = 0`` a correct law's slopes are called
    drifting in ``1 - level`` of draws). ``boots=None``: exact slopes (a deterministic convergence study, as
    the EDI residuals of smooth weights): a drift is a difference of two slopes beyond ``tol``."""
    m = len(local)
    if boots is None:
        # One replicate, the slopes themselves: each interval is the point difference.
        boots = np.asarray(local, float).reshape(1, m)
    b = np.asarray(boots, float).reshape(-1, m) if m else np.zeros((0, 0))
    for i in range(0, m - (min_points - 1) + 1):
        steady = True
        pairs = (m - i) * (m - i - 1) // 2
        each = 1.0 - (1.0 - level) / max(pairs, 1)
        for j in range(i, m):
            for k in range(j + 1, m):
                lo, hi = percentile_ci(b[:, k] - b[:, j], each)
                if not (lo <= tol and -tol <= hi):
                    steady = False
                    break
            if not steady:
                break
        if steady:
            return i
    return None


def asymptotic_fit(
    xs: Sequence[float] | np.ndarray,
    ys: Sequence[float] | np.ndarray,
    *,
    tol: float,
    boots: np.ndarray | None = None,
    floor: float = 0.0,
    min_points: int = 3,
) -> tuple[float, list[float], list[float]]:
    """The exponent ``p`` of ``y ~ x^p`` fitted (:func:`loglog_fit`) over the asymptotic range of a convergence
    study (``xs`` ordered toward the limit, e.g. decreasing steps).

    Local slopes (:func:`local_slopes`) between successive points; pairs whose second ``y`` is at or below
    ``floor`` (rounding) are dropped; the range is the longest run of the last remaining pairs whose slopes do
    not drift (:func:`asymptotic_start` with ``tol`` and ``boots``, the slopes' replicates, or exact slopes).
    Without a range of ``min_points`` points, the last pair alone (its slope: a pre-asymptotic study, told by
    a range of two points). Returns the exponent (``nan`` without a usable pair), the range's ``xs`` and all
    local slopes."""
    x = np.asarray(xs, float)
    y = np.maximum(np.asarray(ys, float), 1e-300)
    local = [float(v) for v in local_slopes(x, y)]
    valid = [i for i in range(len(local)) if y[i + 1] > floor]
    if not valid:
        return math.nan, [], local
    last = first = valid[-1]
    while first - 1 in valid:
        first -= 1
    reps = None if boots is None else np.asarray(boots, float)[:, first : last + 1]
    start = asymptotic_start(np.array(local[first : last + 1]), reps, tol=tol, min_points=min_points)
    first = last if start is None else first + start
    return loglog_fit(x[first : last + 2], y[first : last + 2])[0], [float(v) for v in x[first : last + 2]], local


def batches_needed(ci: Sequence[float], decisive_half_width: float, batches: int | float) -> float:
    """The sequential design's projection: the number of batches at which the interval ``ci = (lo, hi)``, now
    after ``batches`` batches, would be narrow enough to decide, ``B (w / w*)^2`` with ``w = (hi - lo) / 2`` and
    ``w* = decisive_half_width`` (a mean over independent batches: ``w ~ 1 / sqrt(B)``).

    Only the width is projected, never the estimate's location (a draw: a projection that took it for the
    truth would stop exactly the runs whose first batch landed near a boundary). ``nan`` when an end of
    ``ci`` or ``w*`` is not finite (no interval yet: nothing to project), ``inf`` when ``w* <= 0`` (no width
    decides)."""
    lo, hi = ci
    if not all(math.isfinite(v) for v in (lo, hi, decisive_half_width)):
        return math.nan
    if decisive_half_width <= 0:
        return math.inf
    return batches * (0.5 * (hi - lo) / decisive_half_width) ** 2


def more_batches(open_: bool, batches: int, budget: int, needed: float, without_projection: int) -> bool:
    """Whether the sequential design runs another batch after ``batches``: the verdict is still ``open_``, the
    fixed ``budget`` (a compute cap, in batches) is not spent, and a decision is within it, i.e. the
    projection ``needed`` (:func:`batches_needed`) is at most ``budget``; without a projection (``needed``
    ``nan``: no interval yet) batches are added up to ``without_projection``. An open verdict whose
    projection exceeds the budget stops at once, undecided: more batches could not decide it."""
    within = batches < without_projection if math.isnan(needed) else needed <= budget
    return open_ and batches < budget and within
