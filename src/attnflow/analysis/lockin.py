"""The phase-resolved (lock-in) amplitude of a motion forced at a known frequency ``omega``.

Each coordinate ``y_j(t)`` of a window is fitted by least squares to

    y_j(t) = c0_j + c1_j (t - t_mid) + a_j cos(omega t) + b_j sin(omega t) + r_j(t),

the linear term absorbing a slow drift (a slow mode still relaxing). The forced amplitude is
``A = (sum_j w_j (a_j^2 + b_j^2) / sum_j w_j)^(1/2)``, the (weighted) rms over coordinates of ``sqrt(a^2 + b^2)``.

Its noise scale comes from the same fit's residuals, with their correlation: the covariance of the
coefficients is the sandwich ``(X^T X)^-1 X^T Gamma X (X^T X)^-1`` (a heteroscedasticity-and-autocorrelation
consistent estimate, as Newey-West's), ``Gamma_ik = gamma_j(|i - k|)`` each coordinate's own residual
autocovariance, cut at Sokal's window ``M ~ AUTO_WINDOW_C tau_int`` (:func:`integrated_time` of the residuals
pooled over coordinates; the same window as every other error in the reproduction). For a cosine column this
is ``var(a) ~ (2 / n) S(omega)``, the residuals' spectral density at ``omega`` (not at 0, which an error
from ``tau_int`` alone would use: for low-pass noise that overstates the error at ``omega``). The residual
variance is divided by ``1 - 4 tau_int / n`` (four fitted columns, each removing about ``tau_int`` samples'
worth of correlated noise; ``n / (n - 4)`` for white noise).

The **standard error of the amplitude**, :attr:`LockIn.se`, is the rms ``A`` would have without any forced
motion: ``se^2 = sum_j w_j (var a_j + var b_j) / sum_j w_j``. Then ``E A^2 = se^2`` under the null, and
``P(A > z se) <= exp(-z^2)`` whatever the correlation between coordinates (the worst case, all coordinates
one, is ``A^2 / se^2 ~ Exp(1)``): ``1.2e-4`` at ``z = 3``. That is for ``se`` known; estimated from a short
window of one coordinate it scatters and the tail is heavier (AR(1) noise, one coordinate, 4 periods, about 20
correlation times: ``A > 3.3 se`` at about ``7e-4`` instead of ``2e-5``; three coordinates: 0 of 2000,
``tests/experiments/test_oscillating_sequential_lockin.py``).

A window shorter than :data:`MIN_PERIODS` periods is refused: the cosine and sine columns then overlap the
constant and linear ones and the amplitude is not separated from a drift.

**Decisions at a known frequency** (``oscillating`` row #5): :func:`lockin_scales`, :func:`lockin_margins` and
:func:`lockin_decides` judge a forced run's amplitude against :data:`LOCKIN_Z` noise scales with an unforced
run as the control; :func:`sequential_lockin` looks again at 2x and 4x :data:`LOCKIN_PERIODS` while undecided;
:func:`position_margins` and :func:`position_decides` are the position test beside it.

Moved here from ``attnflow.experiments.lockin`` and ``attnflow.experiments.relaxation`` (issue 42), which import
these names back.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from attnflow.analysis.relaxation import Settling, Window
from attnflow.core.errors import InputError, NumericalError
from attnflow.verdicts.margins import MIN_MARGIN, margin_above, margin_below
from attnflow.verdicts.stats import AUTO_WINDOW_C, MIN_TAUS, integrated_time

#: A lock-in fit needs a window of at least this many periods ``2 pi / omega``.
MIN_PERIODS = 2.0
#: Columns of the fit: constant, linear drift, cosine, sine.
_COLUMNS = 4


@dataclass(frozen=True)
class LockIn:
    """The lock-in fit of a window at ``omega``: the forced amplitude ``A`` (:attr:`amplitude`), its null rms
    :attr:`se`, each coordinate's ``a_j, b_j``, the residuals' integrated autocorrelation time ``tau_int``
    (units of ``t``), the window's length in periods and samples; ``trusted`` when Sokal's window closed, the
    window holds :data:`MIN_TAUS` ``tau_int`` and the sandwich variance is positive."""

    omega: float
    amplitude: float
    se: float
    a: np.ndarray
    b: np.ndarray
    tau_int: float
    periods: float
    n: int
    window: tuple[float, float]
    trusted: bool

    @property
    def z(self) -> float:
        """``A / se``: the amplitude in standard errors."""
        return self.amplitude / self.se if self.se > 0 else math.inf

    def text(self) -> str:
        return (
            f"A = {self.amplitude:.3g}, SE {self.se:.3g} ({self.z:.3g} SE; {self.periods:.3g} periods, "
            f"tau_int {self.tau_int:.3g}{'' if self.trusted else ', error estimate not trusted'})"
        )


def design(t: np.ndarray, omega: float) -> np.ndarray:
    """The fit's columns ``[1, (t - t_mid) / half, cos(omega t), sin(omega t)]`` (``half`` the half-length)."""
    t = np.asarray(t, dtype=np.float64)
    mid, half = 0.5 * (t[0] + t[-1]), max(0.5 * (t[-1] - t[0]), 1e-300)
    return np.stack([np.ones_like(t), (t - mid) / half, np.cos(omega * t), np.sin(omega * t)], axis=1)


def lockin_fit(
    t: np.ndarray,
    y: np.ndarray,
    omega: float,
    weights: np.ndarray | None = None,
    min_periods: float = MIN_PERIODS,
    c: float = AUTO_WINDOW_C,
) -> LockIn:
    """:class:`LockIn` of ``y`` ``(n,)`` or ``(n, m)`` (``m`` coordinates) on the uniform times ``t`` ``(n,)`` at
    the angular frequency ``omega``; ``weights`` ``(m,)`` the coordinates' weights (uniform when ``None``)."""
    t = np.asarray(t, dtype=np.float64)
    Y = np.asarray(y, dtype=np.float64)
    Y = Y[:, None] if Y.ndim == 1 else Y.reshape(len(Y), -1)
    if t.ndim != 1 or len(t) != len(Y):
        raise InputError(f"t and y need the same number of times; got {t.shape} and {np.shape(y)}")
    if not (math.isfinite(omega) and omega > 0):
        raise InputError(f"omega must be a positive number; got {omega}")
    if len(t) < 2 * _COLUMNS or not (np.isfinite(t).all() and np.isfinite(Y).all()):
        raise InputError(f"the lock-in fit needs at least {2 * _COLUMNS} finite samples; got {len(t)}")
    step = np.diff(t)
    if not (step.min() > 0 and np.ptp(step) <= 1e-6 * step.mean()):
        raise InputError("the lock-in fit needs uniformly spaced increasing times t")
    periods = omega * float(t[-1] - t[0]) / (2.0 * math.pi)
    if periods < min_periods:
        raise InputError(
            f"the window [{t[0]:.4g}, {t[-1]:.4g}] holds {periods:.3g} periods of omega = {omega:.4g}; the lock-in "
            f"fit needs at least {min_periods:g} (the sinusoid is not separated from a drift)"
        )
    w = np.ones(Y.shape[1]) if weights is None else np.asarray(weights, dtype=np.float64).ravel()
    if w.shape != (Y.shape[1],) or not (np.isfinite(w).all() and (w >= 0).all() and w.sum() > 0):
        raise InputError(f"weights must be {Y.shape[1]} non-negative numbers, not all zero")
    w = w / w.sum()
    n = len(t)
    X = design(t, omega)
    P = np.linalg.inv(X.T @ X)
    coef = P @ (X.T @ Y)
    r = Y - X @ coef
    tau, closed = integrated_time([r[:, j] for j in range(r.shape[1])], c)
    tau = max(float(tau), 1.0) if math.isfinite(tau) else float(n)
    M = n - 1 if not closed else min(n - 1, int(math.ceil(c * tau)))
    f = np.fft.rfft(r, 2 * n, axis=0)
    gam = np.fft.irfft(f * np.conj(f), 2 * n, axis=0)[: M + 1] / n  # (M + 1, m): gamma_j(k)
    shrink = 1.0 - _COLUMNS * tau / n
    gam = gam / shrink if shrink > 0 else gam * math.inf
    S = np.stack([X[: n - k].T @ X[k:] for k in range(M + 1)])  # sum_i x_i x_{i+k}^T
    S[1:] = S[1:] + S[1:].transpose(0, 2, 1)
    B = np.einsum("kj,kab->jab", gam, S)
    V = np.einsum("ab,jbc,cd->jad", P, B, P)
    var = V[:, 2, 2] + V[:, 3, 3]
    se2 = float(w @ var)
    positive = se2 > 0
    if not positive:  # the cut sum went negative (a residual without power near omega): white noise, flagged
        se2 = float(w @ gam[0]) * float(P[2, 2] + P[3, 3])  # S_0 = X^T X, so the sandwich is gamma_0 P
    a, b = coef[2], coef[3]
    amp = float(math.sqrt(float(w @ (a * a + b * b))))
    dt = float(step.mean())
    return LockIn(
        omega=float(omega),
        amplitude=amp,
        se=math.sqrt(max(se2, 0.0)),
        a=a,
        b=b,
        tau_int=tau * dt,
        periods=periods,
        n=n,
        window=(float(t[0]), float(t[-1])),
        trusted=bool(closed and positive and n >= MIN_TAUS * tau),
    )


#: The lock-in window holds at least this many periods ``2 pi / omega``: both runs are continued past ``T`` (for
#: this row only) until the settling window does. Four periods keep the cosine and sine columns nearly
#: orthogonal to the drift columns and give the residuals' error estimate several correlation times.
LOCKIN_PERIODS = 4.0
#: Row #5: the oscillating run's lock-in amplitude exceeds ``LOCKIN_Z`` noise scales, the OU run's does not
#: (stated before any run was measured with it; under no forcing ``P(A > 3 se) <= exp(-9)``, lockin module).
LOCKIN_Z = 3.0
#: The sequential lock-in's longest window, in periods: a compute budget, not a threshold. When neither test of
#: row #5 decides over :data:`LOCKIN_PERIODS` periods, both runs (the oscillating run and its OU control) are
#: continued so the lock-in window holds 2x, then 4x :data:`LOCKIN_PERIODS` (never beyond the run-length cap),
#: both re-fitted at each look, and the row is decided at the first look where its rule decides
#: (:func:`sequential_lockin`; :data:`LOCKIN_Z` and ``MIN_MARGIN`` unchanged). Why it helps: the noise scale
#: falls like ``1 / sqrt(periods)`` while a forced amplitude stays, so 16 periods see half the amplitude that 4
#: do. Why 16: at most 4x the lock-in window's simulation, and at the random sets' ``omega`` (0.5 .. 2) 16
#: periods are 50 .. 200 time units, at or beyond the cap (``max_extension x t_end``, 96 quick) for ``omega``
#: below about 1: a larger budget would mostly be cut by the cap. The cost in false alarms, by a union bound over
#: the looks (each ``P(A > LOCKIN_Z se) <= exp(-LOCKIN_Z^2)`` under no forcing, lockin module): at most
#: ``3 exp(-9) = 3.7e-4`` for the three looks instead of ``1.2e-4`` for one (the looks share their first samples,
#: positively correlated, so the bound is conservative; with the minimum margin each look needs ``A > 3.3 se``).
#: Measured on unforced AR(1) series of one coordinate, where ``se`` estimated from 4 periods scatters (the bound
#: assumes it known): ``A > 3.3 s`` at 2 of 3000 first looks and at 5 of 3000 sequences of three looks, within
#: the union bound's 3x the single look's rate; with three coordinates 0 of 2000 (test_oscillating_sequential_lockin).
LOCKIN_MAX_PERIODS = 16.0


def amplitude_over(amplitude: float, scale: float) -> float:
    return amplitude / scale if scale > 0 else math.inf


def lockin_scales(osc: LockIn, ou: LockIn) -> tuple[float, float]:
    """Row #5's noise scales ``(s, s_ou)``: the oscillating run's own lock-in error, never below the OU run's (the
    oscillating run is deterministic, no heads' noise, so its residuals hold only harmonics and a slow drift and
    its error alone is no noise scale; the OU run's error is the finite-``H`` noise at ``omega`` in the same window
    and fit); the OU control's own error."""
    return max(osc.se, ou.se), ou.se


def lockin_margins(osc: LockIn, ou: LockIn) -> tuple[float, float]:
    """Row #5's lock-in margins: ``A / s`` above :data:`LOCKIN_Z` (over a window shorter than
    :data:`LOCKIN_PERIODS`, its shortfall in periods, negative), and the OU control's ``A_ou / s_ou`` below it."""
    s, s_ou = lockin_scales(osc, ou)
    long = osc.periods >= LOCKIN_PERIODS * (1.0 - 1e-6)
    margin = margin_above(amplitude_over(osc.amplitude, s), LOCKIN_Z) if long else osc.periods / LOCKIN_PERIODS - 1.0
    return margin, margin_below(amplitude_over(ou.amplitude, s_ou), LOCKIN_Z)


def lockin_decides(osc: LockIn, ou: LockIn) -> bool:
    """The lock-in decides row #5: the oscillating run's ``A > LOCKIN_Z s`` and the OU run's ``A_ou < LOCKIN_Z s_ou``,
    each by at least ``MIN_MARGIN``."""
    return min(lockin_margins(osc, ou)) >= MIN_MARGIN


def empty_window(swin: Window) -> bool:
    return not swin.end > swin.start + 1e-9


def position_margins(s_osc: Settling, s_ou: Settling, swin: Window) -> tuple[float, float] | None:
    """Row #5's position margins: the oscillating run's ``max W2 / bound`` above 1 and the OU control's below 1;
    ``None`` over an empty settling window (the run ends where the window would start: a distance over no times is
    no test, not a number)."""
    if empty_window(swin):
        return None
    return margin_above(s_osc.ratio, 1.0), margin_below(s_ou.ratio, 1.0)


def position_decides(s_osc: Settling, s_ou: Settling, swin: Window) -> bool:
    """The position test decides row #5: both margins at least ``MIN_MARGIN`` over a window long enough."""
    pm = position_margins(s_osc, s_ou, swin)
    return pm is not None and swin.ok and min(pm) >= MIN_MARGIN


def sequential_lockin(
    fit: Callable[[float], tuple[LockIn, LockIn] | None], position_decided: bool
) -> list[tuple[LockIn, LockIn]]:
    """Row #5's sequential lock-in: the looks ``(oscillating fit, OU fit)`` made, the deciding (or last) one last.

    ``fit(P)`` fits both runs over a lock-in window of ``P`` periods (continuing them for it), or returns ``None``
    when the window cannot grow beyond the previous look's (the run-length cap). Looks at :data:`LOCKIN_PERIODS`,
    2x, 4x ... up to :data:`LOCKIN_MAX_PERIODS`, the next one only while neither test decides: the lock-in
    (:func:`lockin_decides`) nor the position test (``position_decided``: its window and bound do not grow with
    the lock-in's). The extra looks' false-alarm cost: :data:`LOCKIN_MAX_PERIODS`."""
    looks: list[tuple[LockIn, LockIn]] = []
    periods = LOCKIN_PERIODS
    while periods <= LOCKIN_MAX_PERIODS * (1.0 + 1e-9):
        pair = fit(periods)
        if pair is not None:
            looks.append(pair)
            if position_decided or lockin_decides(*pair):
                break
        elif not looks:
            raise NumericalError(f"the lock-in's first look ({LOCKIN_PERIODS:g} periods) returned no fit")
        periods *= 2.0
    return looks
