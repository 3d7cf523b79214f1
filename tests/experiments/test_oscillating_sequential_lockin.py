"""Issue 28, ``oscillating`` row #5 as a sequential lock-in: while neither test decides, the lock-in looks again
over 2x and 4x :data:`LOCKIN_PERIODS` periods (up to :data:`LOCKIN_MAX_PERIODS`, never beyond the cap) and the
row is decided at the first look that decides. A forced swing too weak for 4 periods is decided at 16; an unforced
series is not turned into a PASS by the extra looks (their false-alarm cost is a union bound, ``3 exp(-9)``); the
extension happens only when undecided and stops at the first decision. An empty settling window is no position
test (reported as inconclusive, never as ``0 x bound``)."""

import math

import numpy as np
import pytest
from scipy.signal import lfilter

from attnflow.analysis.lockin import (
    LOCKIN_MAX_PERIODS,
    LOCKIN_PERIODS,
    LOCKIN_Z,
    lockin_decides,
    lockin_margins,
    lockin_scales,
    position_decides,
    position_margins,
    sequential_lockin,
)
from attnflow.analysis.relaxation import Settling
from attnflow.experiments.common import MIN_MARGIN, margin_above
from attnflow.experiments.floors import Window
from attnflow.experiments.lockin import lockin_fit
from attnflow.experiments.oscillating import _no_relaxation_row
from attnflow.experiments.relax_runs import LockInPair

DT, OMEGA, PHI, SIGMA, M = 0.1, 1.3, 0.8, 0.5, 3
#: Samples of the longest look (16 periods) and one more.
N = int(math.ceil(LOCKIN_MAX_PERIODS * 2 * math.pi / OMEGA / DT)) + 1
T = np.arange(N) * DT


def _noise(rng: np.random.Generator, m: int = M) -> np.ndarray:
    """``m`` stationary AR(1) series (the OU run's finite-H noise, low-passed) with a slow drift."""
    burn = int(20 / (1 - PHI))
    e = SIGMA * rng.standard_normal((N + burn, m))
    return lfilter([1.0], [1.0, -PHI], e, axis=0)[burn:] + 0.02 * T[:, None] + 0.4


def _se(periods: float) -> float:
    """The closed-form lock-in error of that noise over ``periods`` periods: ``sqrt(4 S(omega) / n)``."""
    S = SIGMA**2 / abs(1.0 - PHI * np.exp(-1j * OMEGA * DT)) ** 2
    return math.sqrt(4.0 * S / (periods * 2 * math.pi / OMEGA / DT))


def _fitter(y_osc: np.ndarray, y_ou: np.ndarray, calls: list[float] | None = None, cap_periods: float = math.inf):
    """``fit(P)`` over the first ``P`` periods (``None`` past ``cap_periods``: the run-length cap)."""

    def fit(periods: float):
        if calls is not None:
            calls.append(periods)
        if periods > cap_periods:
            return None
        n = int(math.ceil(periods * 2 * math.pi / OMEGA / DT)) + 1
        return lockin_fit(T[:n], y_osc[:n], OMEGA), lockin_fit(T[:n], y_ou[:n], OMEGA)

    return fit


def _forced(rng: np.random.Generator, amplitude: float) -> np.ndarray:
    psi = rng.uniform(0, 2 * math.pi, M)
    return _noise(rng) + amplitude * np.cos(OMEGA * T[:, None] + psi)


def test_the_extension_happens_only_when_undecided_and_stops_at_the_first_decision():
    rng = np.random.default_rng(3)
    assert (LOCKIN_PERIODS, LOCKIN_MAX_PERIODS) == (4.0, 16.0)
    # A strong forced swing: decided at the first look, no extension.
    calls: list[float] = []
    looks = sequential_lockin(_fitter(_forced(rng, 2.0), _noise(rng), calls), position_decided=False)
    assert calls == [4.0] and len(looks) == 1 and lockin_decides(*looks[0])
    # Nothing at omega but the position test decided: no extension either.
    calls = []
    looks = sequential_lockin(_fitter(_noise(rng), _noise(rng), calls), position_decided=True)
    assert calls == [4.0] and len(looks) == 1 and not lockin_decides(*looks[0])
    # Undecided throughout: every look up to LOCKIN_MAX_PERIODS, then stop (undecided: a FAIL).
    calls = []
    looks = sequential_lockin(_fitter(_noise(rng), _noise(rng), calls), position_decided=False)
    assert calls == [4.0, 8.0, 16.0] and len(looks) == 3
    assert [round(o.periods) for o, _ in looks] == [4, 8, 16]
    assert not any(lockin_decides(*pair) for pair in looks)
    # The cap: a look whose window cannot grow is skipped (the run-length cap), never fitted.
    calls = []
    looks = sequential_lockin(_fitter(_noise(rng), _noise(rng), calls, cap_periods=9.0), position_decided=False)
    assert calls == [4.0, 8.0, 16.0] and len(looks) == 2
    # Stops at the first decision: the first look that decides is the last one made.
    for seed in range(6):
        r = np.random.default_rng(100 + seed)
        looks = sequential_lockin(_fitter(_forced(r, 0.75), _noise(r)), position_decided=False)
        decided = [lockin_decides(*pair) for pair in looks]
        assert not any(decided[:-1])
        assert decided[-1] or len(looks) == 3


def test_a_forced_swing_too_weak_for_four_periods_is_decided_by_the_extension():
    """Amplitude 0.75: about 2.4 s over 4 periods (``s`` = 0.31 closed form), undecided; 4.8 s over 16 periods."""
    amplitude, R = 0.75, 40
    assert amplitude / _se(4.0) < LOCKIN_Z * 1.1 < amplitude / _se(16.0) / 1.3
    first, final, n_looks = 0, 0, []
    for r in range(R):
        rng = np.random.default_rng(1000 + r)
        looks = sequential_lockin(_fitter(_forced(rng, amplitude), _noise(rng)), position_decided=False)
        first += lockin_decides(*looks[0])
        final += lockin_decides(*looks[-1])
        n_looks.append(len(looks))
    assert first <= 0.2 * R  # 4 periods alone would mostly leave it undecided
    assert final >= 0.95 * R  # the extension decides it
    assert max(n_looks) == 3 and np.mean(n_looks) > 1.8
    # Through the row: the last look decides it, and the row says how many looks it took.
    rng = np.random.default_rng(1000)
    looks = sequential_lockin(_fitter(_forced(rng, amplitude), _noise(rng)), position_decided=False)
    settled, win = Settling(0.05, 1.0, 0.1), Window(10.0, 40.0, 1.0)
    lk = LockInPair((0.0, float(T[-1])), 0.0, {}, looks, *looks[-1])
    row = _no_relaxation_row(lk, OMEGA, 0.2, settled, settled, win)
    assert row.ok and row.margin == pytest.approx(lockin_margins(*looks[-1])[0])
    assert f"{len(looks)} looks of at most 16 periods" in row.measured, row.measured


def test_an_unforced_series_is_not_turned_into_a_pass_by_the_extra_looks():
    """The negative control: AR(1) noise and a drift, nothing at omega, in the "oscillating" series too, one
    coordinate (the bound's worst case: ``(A / se)^2 ~ Exp(1)`` with ``se`` known). With ``se`` estimated from a
    window of 4 periods (about 20 correlation times) the tail is heavier than ``exp(-z^2)``: over 3000 such
    replicas ``A > 3.3 s`` (the threshold with the minimum margin) at 2 at the first look and at 5 at any of the
    three (1.7e-3, the union bound's 3x the single look's rate at most); with three coordinates 0 of 2000. So at
    most 2 of 300 here. The count has power: the same looks read at ``z = 2`` (a threshold tuned down) pass many
    more, and the same replicas with a forced swing are decided."""
    R, passes, tuned, forced_passes = 300, 0, 0, 0
    for r in range(R):
        rng = np.random.default_rng(5000 + r)
        y_osc, y_ou = _noise(rng, 1), _noise(rng, 1)
        looks = sequential_lockin(_fitter(y_osc, y_ou), position_decided=False)
        assert len(looks) == 3 or lockin_decides(*looks[-1])  # undecided: every look made
        passes += lockin_decides(*looks[-1])
        z2 = [margin_above(o.amplitude / lockin_scales(o, u)[0], 2.0) for o, u in looks]
        tuned += max(z2) >= MIN_MARGIN
        if r < 30:
            forced = y_osc + 0.75 * np.cos(OMEGA * T[:, None] + rng.uniform(0, 2 * math.pi))
            forced_passes += lockin_decides(*sequential_lockin(_fitter(forced, y_ou), position_decided=False)[-1])
    assert passes <= 2, passes
    assert tuned >= 6, tuned
    assert forced_passes >= 27, forced_passes


def test_an_empty_settling_window_is_no_position_test():
    """Set 11 of seed 4: the slow mode beyond the cap leaves the settling window ``[12, 12]`` empty; its position
    "test" read max W2 = 0 = 0 x bound (wander 0). That is no test: reported as inconclusive, never as numbers,
    and it cannot decide the row even when the numbers would."""
    from types import SimpleNamespace

    def fit(amplitude: float, se: float = 0.01):
        return SimpleNamespace(amplitude=amplitude, se=se, periods=4.0, text=lambda: f"A = {amplitude}")

    empty = Window(12.0, 12.0, 31.4)
    moving, zero = Settling(2.0, 1.0, 0.1), Settling(0.0, 1.31, 0.0)
    assert position_margins(moving, zero, empty) is None and not position_decides(moving, zero, empty)
    pair = (fit(0.001), fit(0.001))
    lk = LockInPair((12.0, 28.8), 0.0, {}, [pair], *pair)
    row = _no_relaxation_row(lk, 1.5, 0.03, moving, zero, empty)
    assert not row.ok
    assert "no position test: the settling window [12, 12] is empty" in row.measured, row.measured
    assert "x bound" not in row.measured and "x bound" not in row.control_measured
    # Control: the same numbers over a non-empty window long enough are a position test that decides.
    full = Window(12.0, 200.0, 31.4)
    assert position_decides(moving, Settling(0.05, 1.0, 0.1), full)
    assert _no_relaxation_row(lk, 1.5, 0.03, moving, Settling(0.05, 1.0, 0.1), full).ok
