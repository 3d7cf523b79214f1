"""The finite-``H`` slope floor predicted per seed, and the run's own time scales.

Under OU weights the heads' empirical measure ``Theta^(H)_t`` keeps fluctuating around the stationary
law ``Theta_inf`` (its path has infinite length: docs/model.md), so the slope ``|dF|(mu_t, Theta_t)``
does not decay to zero but to a floor. At a cloud ``mu`` that is a stationary point of the limiting
energy, that floor is the central-limit constant of averaging ``H`` i.i.d. heads drawn from the
stationary law (docs/model.md, "What the numbers say"):

    floor(mu, H) = E |dF|^2(mu, Theta^(H)),   Theta^(H) = (1/H) sum_h delta_{A_h},  A_h ~ Abar_h + c S_h,

``c = sigma / sqrt(2 rate)``. :func:`predicted_floor` computes it by Monte Carlo over independent draws
of the ``H`` heads, with its standard error. For a single cluster under an isotropic mean
``Abar = beta I`` it has a closed form in the limit (:func:`single_cluster_constant`): with ``x`` the
cluster, ``x^T S x ~ N(0, 1)`` independent of the tangent part ``P_x S x`` (``E |P_x S x|^2 = (d-1)/2``),
so the Gaussian moment generating function gives
``H floor -> c^2 (d - 1) / 2 exp(beta + 3 c^2 / 2)`` as ``H -> inf``.

Time scales are the run's own: :func:`relaxation_time` is the ``1/e`` time of the energy's approach
to its late level, and the late window starts :data:`WINDOW_TAUS` of them in (never before half the
run), so a window never depends on a parameter that can exceed the run.

Errors of time averages come from the series' own **integrated autocorrelation time**
(:func:`integrated_time`, Sokal's automatic windowing, as emcee's ``integrated_time``;
:func:`correlated_means` pools the autocovariance over series of one law), not from batch means,
which underestimate the error when a batch is no longer than the correlation time. An estimate from
fewer than :data:`MIN_TAUS` ``tau_int`` is not trusted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from attnflow.dynamics.fields import masses
from attnflow.solve.ensemble import EnsembleField
from attnflow.weights.processes import Constant

#: The late window starts this many relaxation times into the run (e^-3: 5% of the energy's
#: initial distance to its late level is left), and never before half of the run.
WINDOW_TAUS = 3.0
#: A window shorter than this many relaxation times cannot tell a floor from a slow approach.
MIN_WINDOW_TAUS = 1.0
#: Batches of the batch-means standard error of a time average (consecutive blocks of the window).
BATCHES = 8
#: Heads per chunk of the Monte Carlo draws (bounds the memory of one batched kernel pass).
DRAW_CHUNK = 32


def relaxation_time(t: np.ndarray, energy: np.ndarray, tail: float = 0.1) -> float:
    """``tau``: the first time ``|F(t) - F_late| <= |F(0) - F_late| / e``, ``F_late`` the mean energy over
    the last ``tail`` of the run (``inf`` when the energy never gets there; 0 when it does not move)."""
    t, F = np.asarray(t, float), np.asarray(energy, float)
    late = F[t >= t[-1] - tail * (t[-1] - t[0])].mean()
    gap = abs(F[0] - late)
    if gap == 0.0:
        return 0.0
    inside = np.flatnonzero(np.abs(F - late) <= gap / math.e)
    return float(t[inside[0]]) if len(inside) else math.inf


@dataclass(frozen=True)
class Window:
    """The late window ``[start, end]`` in units of the relaxation time ``tau``; ``ok`` when long enough."""

    start: float
    end: float
    tau: float

    @property
    def length_taus(self) -> float:
        return (self.end - self.start) / self.tau if self.tau > 0 else math.inf

    @property
    def ok(self) -> bool:
        return math.isfinite(self.tau) and self.length_taus >= MIN_WINDOW_TAUS


def late_window(t: np.ndarray, tau: float) -> Window:
    """The window ``[max(WINDOW_TAUS tau, T/2), T]`` of a run on the saved times ``t``."""
    T0, T = float(t[0]), float(t[-1])
    start = max(WINDOW_TAUS * tau, T0 + 0.5 * (T - T0)) if math.isfinite(tau) else T
    return Window(min(start, T), T, tau)


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


def slopes_sq(x: np.ndarray, A: np.ndarray) -> np.ndarray:
    """``|dF|^2(mu, Theta_r)`` of one cloud ``x`` ``(N, d)`` under ``R`` head sets ``A`` ``(R, H, d, d)``
    (uniform token and head masses, model ``gf``), in one batched kernel pass."""
    R, H = A.shape[0], A.shape[1]
    X = torch.from_numpy(np.repeat(np.asarray(x, dtype=np.float64)[None], R, axis=0))
    a = masses(None, x.shape[0], "token_weights", X)
    w = masses(None, H, "head_weights", X)
    samplers = [Constant(A[r]).sampler() for r in range(R)]
    f = EnsembleField("gf", samplers, np.ones(R), a, w, X.dtype, X.device)
    st = f.stats(0.0, X)
    return torch.exp(2.0 * st.log_slope(X, a)).numpy()


def predicted_floor(
    x: np.ndarray, A_bar: np.ndarray, c: float, draws: int, seed: int, symmetric: bool = True
) -> tuple[float, float]:
    """``E |dF|^2(mu, Theta^(H))`` over ``draws`` independent draws of the ``H`` heads
    ``A_h = Abar_h + c S_h`` (``A_bar`` ``(H, d, d)``), and its Monte Carlo standard error."""
    rng = np.random.default_rng(seed)
    H, d = A_bar.shape[0], A_bar.shape[1]
    out = []
    per = max(1, DRAW_CHUNK * 16 // max(H, 1))
    done = 0
    while done < draws:
        r = min(per, draws - done)
        G = rng.standard_normal((r, H, d, d))
        S = 0.5 * (G + G.transpose(0, 1, 3, 2)) if symmetric else G
        out.append(slopes_sq(x, A_bar[None] + c * S))
        done += r
    v = np.concatenate(out)
    return float(v.mean()), float(v.std(ddof=1) / math.sqrt(len(v))) if len(v) > 1 else float("nan")


def single_cluster_constant(beta: float, c: float, d: int) -> float:
    """``lim_{H -> inf} H floor`` at a single cluster under heads ``beta I + c S``:
    ``c^2 (d - 1) / 2 exp(beta + 3 c^2 / 2)`` (module docstring)."""
    return c * c * (d - 1) / 2.0 * math.exp(beta + 1.5 * c * c)


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
    return float(taus[int(np.argmax(ok))]), True


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
        if n < 2 or not math.isfinite(tau):
            se.append(math.nan)
            continue
        var = m * m * rel if same_law else (float(y.var()) / k if k > 0 else math.inf)
        se.append(math.sqrt(var * tau / n))
    return CorrelatedMeans(tau * dt, means, np.array(se), n_tot / tau if tau > 0 else math.inf, closed)
