"""Issue 28, ``oscillating`` row #5: the lock-in fit at the weights' frequency recovers a forced amplitude, its
standard error is the Monte Carlo scatter (and the closed form ``var a = 2 S(omega) / n`` of AR(1) noise), pure
correlated noise is not significant (a white-noise error would call it so), and a short window is refused."""

import math

import numpy as np
import pytest
from scipy.signal import lfilter

from attnflow.core.errors import InputError
from attnflow.experiments.lockin import MIN_PERIODS, lockin_fit

DT, N = 0.1, 2000


def _ar1(rng: np.random.Generator, phi: float, sigma: float, m: int) -> np.ndarray:
    """``m`` independent stationary AR(1) series ``x_i = phi x_{i-1} + sigma e_i`` of length :data:`N`."""
    burn = int(20 / (1 - phi))
    e = sigma * rng.standard_normal((N + burn, m))
    return lfilter([1.0], [1.0, -phi], e, axis=0)[burn:]


def _spectral(phi: float, sigma: float, omega: float) -> float:
    """AR(1)'s spectral density ``sum_k gamma_k cos(omega k dt)`` at ``omega``: ``sigma^2 / |1 - phi e^{-i omega dt}|^2``."""
    return sigma**2 / abs(1.0 - phi * np.exp(-1j * omega * DT)) ** 2


@pytest.mark.parametrize(("phi", "omega", "lowpass"), [(0.8, 1.3, False), (0.95, 2.0, True)])
def test_lockin_recovers_the_amplitude_and_its_error_is_the_scatter(phi, omega, lowpass):
    """``lowpass``: the noise's spectral density at 0 is 16x that at omega (it is 1.3x in the other case)."""
    rng = np.random.default_rng(7)
    t = np.arange(N) * DT
    m, R, psi, sigma = 3, 150, np.array([0.3, 1.7, -2.0]), 0.5
    closed = math.sqrt(2 * 2 * _spectral(phi, sigma, omega) / N)  # var a + var b, per coordinate
    fits = []
    for _ in range(R):
        y = _ar1(rng, phi, sigma, m) + 0.03 * t[:, None] - 1.0 + R_AMP * np.cos(omega * t[:, None] + psi)
        fits.append(lockin_fit(t, y, omega))
    a = np.array([f.a for f in fits])
    b = np.array([f.b for f in fits])
    assert np.allclose(a.mean(0), R_AMP * np.cos(psi), atol=4 * closed / math.sqrt(2 * R))
    assert np.allclose(b.mean(0), -R_AMP * np.sin(psi), atol=4 * closed / math.sqrt(2 * R))
    scatter = math.sqrt(float((a.var(0, ddof=1) + b.var(0, ddof=1)).mean()))
    se = float(np.mean([f.se for f in fits]))
    # The reported SE is the Monte Carlo scatter and the closed form (the scatter of R = 150 reps: ~6%).
    assert se == pytest.approx(scatter, rel=0.12)
    assert se == pytest.approx(closed, rel=0.08)
    # The amplitude: E A^2 = R^2 + se^2.
    A2 = np.array([f.amplitude**2 for f in fits])
    assert A2.mean() - se**2 == pytest.approx(R_AMP**2, rel=0.05)
    assert lowpass or all(f.trusted for f in fits)  # phi = 0.95: tau_int ~ 39 samples, n / tau_int ~ 50
    # Control: an error from tau_int alone (the spectral density at 0, not at omega) is far off for low-pass noise.
    s0 = sigma**2 / (1 - phi) ** 2
    if lowpass:
        assert math.sqrt(2 * 2 * s0 / N) > 3 * scatter


R_AMP = 0.3


def test_pure_correlated_noise_and_drift_is_not_significant():
    """The negative control: AR(1) noise and a drift have no amplitude beyond their error (``E A^2 = se^2``,
    ``P(A > 3 se) <= exp(-9)``); the same residuals read as white noise would be called significant."""
    rng = np.random.default_rng(11)
    t = np.arange(N) * DT
    phi, omega, sigma, m, R = 0.8, 1.3, 0.5, 3, 300
    z2, naive_hits, hits = [], 0, 0
    for _ in range(R):
        y = _ar1(rng, phi, sigma, m) + 0.05 * t[:, None] + 0.3
        f = lockin_fit(t, y, omega)
        z2.append(f.z**2)
        hits += f.z > 3
        X = np.stack([np.ones_like(t), t, np.cos(omega * t), np.sin(omega * t)], axis=1)
        r = y - X @ np.linalg.lstsq(X, y, rcond=None)[0]
        naive = math.sqrt(float((r**2).sum(0).mean() / (N - 4) * 2 * np.linalg.inv(X.T @ X)[2, 2]))
        naive_hits += f.amplitude > 3 * naive
    assert float(np.mean(z2)) == pytest.approx(1.0, rel=0.15)
    assert hits <= 2
    assert naive_hits > 0.1 * R


def test_a_window_shorter_than_two_periods_is_refused():
    t = np.arange(0, 1.5 * 2 * math.pi, DT)
    with pytest.raises(InputError, match="periods"):
        lockin_fit(t, np.cos(t), 1.0)
    long = np.arange(0, MIN_PERIODS * 2 * math.pi + DT, DT)
    assert lockin_fit(long, np.cos(long) + 0.01 * np.sin(3 * long), 1.0).amplitude == pytest.approx(1.0, rel=1e-2)
    with pytest.raises(InputError, match="uniformly"):
        lockin_fit(long[[0, 1, 3, *range(4, len(long))]], np.cos(long[[0, 1, 3, *range(4, len(long))]]), 1.0)


def test_no_relaxation_row_is_either_test_with_its_own_control():
    """Row #5: the lock-in decides when it sees motion at omega (and its OU control does not); else the
    position test with its own control; a settled oscillating cloud, or an OU run that has not settled
    while the lock-in sees nothing, fails."""
    from types import SimpleNamespace

    from attnflow.analysis.relaxation import Settling
    from attnflow.experiments.floors import Window
    from attnflow.experiments.oscillating import _no_relaxation_row
    from attnflow.experiments.relax_runs import LockInPair

    def fit(amplitude: float, se: float = 0.01):
        return SimpleNamespace(amplitude=amplitude, se=se, periods=4.0, text=lambda: f"A = {amplitude}")

    win = Window(10.0, 40.0, 1.0)
    moving, settled = Settling(2.0, 1.0, 0.1), Settling(0.05, 1.0, 0.1)  # 6.7 and 0.17 x bound

    def row(lock_osc: float, osc: Settling, ou: Settling, lock_ou: float = 0.01):
        pair = (fit(lock_osc), fit(lock_ou))
        lk = LockInPair((10.0, 40.0), 0.0, {}, [pair], *pair)
        return _no_relaxation_row(lk, 1.0, 0.3, osc, ou, win)

    by_lockin = row(0.2, settled, settled)  # a small forced swing the position test cannot see
    assert by_lockin.ok and by_lockin.control_rejected and "(decides)" in by_lockin.measured
    by_position = row(0.001, moving, settled)  # large motion not locked to omega
    assert by_position.ok and by_position.control_rejected and "decides: the lock-in sees no" in by_position.measured
    assert by_position.margin == pytest.approx(2.0 / 0.3 - 1.0)
    # Controls: a settled oscillating cloud with nothing at omega fails; so does the position test when the
    # OU run itself has not settled (its control would not be rejected), unless the lock-in decides.
    assert not row(0.001, settled, settled).ok
    unsettled_ou = row(0.001, moving, moving)
    assert not (unsettled_ou.ok and unsettled_ou.control_rejected)
    assert row(0.2, moving, moving).control_rejected  # the lock-in with its own control still decides
    # An OU run with a component at omega rejects the lock-in; the position test decides if it can.
    assert not row(0.2, settled, settled, lock_ou=0.2).control_rejected
