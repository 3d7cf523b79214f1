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
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from attnflow.core.errors import InputError
from attnflow.experiments.floors import AUTO_WINDOW_C, MIN_TAUS, integrated_time

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
