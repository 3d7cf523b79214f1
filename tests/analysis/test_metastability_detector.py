"""The plateau detector on planted staircases with known plateau times (random parameters), with controls:
smooth monotone decays have no closed plateau, a burst below min_drop is not an event, merge events
from the cluster count, and the staircase of a real run."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.optimize import brentq

import attnflow as af
from attnflow.analysis.metastability import detect_plateaus, merge_events, staircase
from attnflow.core.errors import InputError


def _planted(t, times, drops, width):
    E = -sum(f * (1 + np.tanh((t - tk) / width)) / 2 for f, tk in zip(drops, times))

    def sech2(u):
        q = np.exp(-2 * np.abs(u))
        return 4 * q / (1 + q) ** 2

    rate = lambda s: sum(f / (2 * width) * sech2((s - tk) / width) for f, tk in zip(drops, times))
    return E, rate


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_planted_staircase_plateau_times(seed):
    """Steps at log-spaced random times with random drops and width: each closed plateau's ends are where
    the exact rate crosses the threshold (brentq on the closed form), to within a save spacing."""
    rng = np.random.default_rng(seed)
    width = float(rng.uniform(0.3, 2.0))
    times = np.sort(10 ** rng.uniform(1.0, 3.3, 3))
    while np.diff(times).min() < 40 * width:  # distinct steps
        times = np.sort(10 ** rng.uniform(1.0, 3.3, 3))
    drops = rng.dirichlet(np.ones(3))
    T = 2 * times[-1] + 100
    h = width / 4
    t = np.arange(0.0, T + h / 2, h)
    E, rate = _planted(t, times, drops, width)
    st = detect_plateaus(t, E)
    theta = st.threshold
    assert math.isclose(st.rate_scale, (E[0] - E[-1]) / (t[-1] - t[0]), rel_tol=1e-12)
    closed = st.closed
    assert len(closed) == 2 and st.plateaus[0].from_start and st.plateaus[-1].censored
    worst = 0.0
    for p, (a, b) in zip(closed, zip(times[:-1], times[1:])):
        start = brentq(lambda s: rate(s) - theta, a, 0.5 * (a + b))
        end = brentq(lambda s: rate(s) - theta, 0.5 * (a + b), b)
        worst = max(worst, abs(p.start - start), abs(p.end - end))
        assert abs(p.energy - E[np.searchsorted(t, 0.5 * (a + b))]) < 1e-6
    print(
        f"seed {seed}: width {width:.2f}, steps {np.round(times, 1)}; worst end error {worst:.3f} (save spacing {h:.3f})"
    )
    assert worst < h
    # The staircase levels are the planted ones.
    np.testing.assert_allclose(st.levels[1:], -np.cumsum(drops), atol=1e-6)


@pytest.mark.parametrize(
    "decay", [lambda t: np.exp(-t / 30), lambda t: 1 / (1 + t), lambda t: np.exp(-np.sqrt(t)), lambda t: -np.log1p(t)]
)
def test_monotone_smooth_decay_has_no_plateau(decay):
    """Control: a decay whose rate only decreases has one low-rate interval, reaching the end (censored)."""
    t = np.linspace(0, 3000, 6001)
    st = detect_plateaus(t, decay(t))
    assert st.closed == [] and (st.first is None or st.first.censored)


def test_small_bursts_do_not_split_a_plateau():
    """Control: a burst that lowers F by less than min_drop of the total drop is not an event; above it is."""
    t = np.linspace(0, 2000, 8001)
    E, _ = _planted(t, [10.0, 500.0, 1000.0], [0.9, 1e-3, 0.1], 1.0)
    assert (
        len(detect_plateaus(t, E).closed) == 1
    )  # 10 .. 1000: the 1e-3 step (rate above theta, drop below min_drop) is absorbed
    assert len(detect_plateaus(t, E, min_drop=1e-5).closed) == 2  # now it is an event


def test_merge_events():
    t = np.arange(6.0)
    ev = merge_events(t, [8, 8, 5, 5, 4, 4])
    assert [(m.time, m.before, m.after) for m in ev] == [(2.0, 8, 5), (4.0, 5, 4)]


def test_bad_input_is_an_input_error():
    with pytest.raises(InputError):
        detect_plateaus([0, 1], [0, 1])
    with pytest.raises(InputError, match="increasing"):
        detect_plateaus([0, 2, 1], [0, -1, -2])
    with pytest.raises(InputError):
        detect_plateaus([0, 1, 2], [0, -1, -2], rel_rate=0)


def test_staircase_of_a_real_run():
    """Two clusters at 90 degrees on the circle (beta = 4) merge after a long plateau: the detector finds it
    closed, with 2 clusters on it, ended by the merge to 1 cluster."""
    beta = 4.0
    rng = np.random.default_rng(3)
    th = np.concatenate([rng.normal(0, 0.05, 4), rng.normal(np.pi / 2 + 0.6, 0.05, 4)])
    x0 = np.stack([np.cos(th), np.sin(th)], 1)
    traj = af.simulate(
        x0, beta * np.eye(2)[None], model="gf", t_end=200.0, dt=0.5, method="dopri5", rtol=1e-8, atol=1e-10,
        record_steps=False,
    )  # fmt: skip
    st = staircase(traj)
    closed = st.closed
    merge_to_one = [m for m in st.merges if m.after == 1]
    print(f"plateaus {[(round(p.start, 2), round(p.end, 2), p.clusters) for p in st.plateaus]}, merges {st.merges}")
    assert closed and closed[0].clusters == 2 and merge_to_one
    assert closed[0].end <= merge_to_one[0].time <= closed[0].end + 20
