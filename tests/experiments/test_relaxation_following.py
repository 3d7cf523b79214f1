"""Issue 28, ``ou`` row 1: a settled single cluster *follows* its fluctuating heads, and its slope for the limit
law is the linear-response scale ``s_follow`` (:func:`following_scale`), not the floor scale ``s_H``.

A single cluster (two tokens starting together at the resting point ``x*``) under ``H = 8`` OU heads that start
in their stationary law is simulated for many ``1/g`` and ``1/r``; the late rms of ``|dF|(mu_t, Theta_inf)`` must
match ``s_follow`` within three standard errors (the run's own, from its integrated autocorrelation time, and the
Monte Carlo's), and the factor-1 scale ``s_H`` (the negative control) must miss it by more at ``g/r`` small."""

import math
from types import SimpleNamespace

import numpy as np
import pytest

from attnflow.analysis.following import floor_scale, following_scale, rest_distance
from attnflow.analysis.limits import stationarity
from attnflow.analysis.relaxation import cluster_modes, pair_modes, slow_rate
from attnflow.core.heads import goe_heads
from attnflow.dynamics.infinite import GaussianHeads
from attnflow.experiments import settle_row
from attnflow.experiments.floors import correlated_means
from attnflow.solve.simulation import simulate
from attnflow.weights.processes import OrnsteinUhlenbeck

#: The heads' stationary spread ``c = sigma / sqrt(2 r)`` (small: the linear response's regime).
C = 0.1
#: Monte Carlo draws behind s_follow and s_H (their relative standard error is at most sqrt(2 / DRAWS) / 2).
DRAWS = 1500
#: The late window starts here (the heads start stationary and the cluster at x*: only the memory of the start).
BURN = 20.0


def _follow_run(spectrum: list[float], r: float, T: float, seed: int):
    """Late rms of ``|dF|(mu_t, Theta_inf)`` of a simulated single cluster, its standard error, and the scales."""
    A, ou, law = _stationary_heads(spectrum, r, seed)
    x0 = np.tile(cluster_modes(A).x, (2, 1))
    fs = following_scale(x0, ou, DRAWS, 3)
    rms, se, cm, tr = _late_rms(x0, ou, law, fs, r, T, seed)
    return rms, se, fs, cm, tr


def _stationary_heads(spectrum: list[float], r: float, seed: int):
    """8 OU heads around ``diag(spectrum) + GOE``, started from their stationary law, and the limit law."""
    d = len(spectrum)
    A = np.diag(spectrum)[None] + goe_heads(8, d, 0.3, 5)
    sigma = C * math.sqrt(2.0 * r)
    start = A + C * OrnsteinUhlenbeck(A, r, sigma).noise(np.random.default_rng(seed + 1))
    return A, OrnsteinUhlenbeck(A, r, sigma, A0=start, seed=seed), GaussianHeads.create(A, C)


def _late_rms(x0, ou, law, fs, r: float, T: float, seed: int):
    """The run's late rms of ``|dF|(mu_t, Theta_inf)``, its standard error (window and Monte Carlo), ``cm``."""
    dt = 0.05 if r > 1 else 0.1
    tr = simulate(x0, ou, model="gf", t_end=T, dt=dt, save_every=int(round(0.2 / dt)), seed=seed, record_steps=False)
    late = np.flatnonzero(tr.t >= BURN)
    y = np.array([stationarity(tr.x[k], law).slope ** 2 for k in late])
    cm = correlated_means(tr.t[late], [y])
    rms = math.sqrt(float(cm.means[0]))
    se = math.hypot(float(cm.se[0]) / (2.0 * rms), fs.follow * math.sqrt(2.0 / DRAWS) / 2.0)
    return rms, se, cm, tr


def _check(spectrum: list[float], r: float, T: float, seed: int, control: bool, wander: bool = False) -> None:
    rms, se, fs, cm, tr = _follow_run(spectrum, r, T, seed)
    msg = f"late rms {rms:.4g} +- {se:.2g}, s_follow {fs.follow:.4g}, s_H {fs.s_H:.4g}, tau_int {cm.tau_int:.3g}"
    assert cm.trusted, msg
    assert fs.single and fs.normal_sq < 1e-6 * fs.s_H**2, msg  # a point cluster: its field lies on the modes
    assert abs(rms - fs.follow) <= 3.0 * se, msg
    if control:  # g/r small: the factor-1 floor scale overstates what the cluster shows
        assert abs(rms - fs.s_H) > 3.0 * se, msg
    if wander:
        _check_wander(tr, cluster_modes(_stationary_heads(spectrum, r, seed)[0]), fs, control)


def _check_wander(tr, m, fs, control: bool) -> None:
    """The cluster's rms displacement along each mode is ``FollowingScale.wander``, ``(E f_m^2 / (g_m (g_m +
    r)))^{1/2}``; the quasi-static guess ``(E f_m^2)^{1/2} / g_m`` (a cluster that sits where the instantaneous
    heads' field vanishes: the control) misses it by more than three standard errors."""
    late = np.flatnonzero(tr.t >= BURN)
    delta = (tr.x[late].mean(1) - m.x) @ m.vectors  # (times, modes): small angles along the modes
    _compare_wander(tr.t[late], delta, fs.wander, fs.rates, fs, control)
    assert np.allclose(fs.rest, m.x[None], atol=1e-12)
    _compare_rest_distance(tr, late, fs, control)


def _compare_rest_distance(tr, late: np.ndarray, fs, control: bool) -> None:
    """``ou`` row 1's statistic: the rms of :func:`rest_distance` (each token's angle to its cluster's rest point)
    is ``FollowingScale.wander_total``; the quasi-static total (the control) misses it by more than 3 errors."""
    D2 = np.array([rest_distance(tr.x[k], tr.token_weights, fs) ** 2 for k in late])
    cm = correlated_means(tr.t[late], [D2])
    rms, w = math.sqrt(float(cm.means[0])), fs.wander_total
    se = math.hypot(float(cm.se[0]) / (2.0 * rms), w * math.sqrt(2.0 / DRAWS) / 2.0)
    static = math.sqrt(float(np.sum(fs.wander**2 * (fs.rates + fs.rate) / fs.rates)))
    msg = f"rms D {rms:.4g} +- {se:.2g}, w_follow {w:.4g}, quasi-static {static:.4g}"
    print(msg)
    assert abs(rms - w) <= 3.0 * se, msg
    if control:
        assert abs(rms - static) > 3.0 * se, msg


def _compare_wander(t, delta, wander, rates, fs, control: bool) -> None:
    cm = correlated_means(t, [delta[:, j] ** 2 for j in range(delta.shape[1])])
    rms = np.sqrt(cm.means)
    se = np.hypot(cm.se / (2.0 * rms), wander * math.sqrt(2.0 / DRAWS) / 2.0)
    static = wander * np.sqrt((rates + fs.rate) / rates)  # (E phi_m^2)^(1/2) / g_m
    msg = f"rms {rms}, +- {se}, wander {wander}, quasi-static {static}"
    print(msg)
    # delta^2 decorrelates more slowly than the slope (the slow mode's 1/g): 20 tau_int give a usable error here
    assert cm.window_closed and cm.length_taus >= 20, msg
    assert np.all(np.abs(rms - wander) <= 3.0 * se), msg
    if control:  # g/r small enough for the two to differ (at r = 0.3 they agree within the errors)
        assert np.any(np.abs(rms - static) > 3.0 * se), msg


def test_the_mode_rates_are_slow_rate_and_the_scales_agree_with_floor_scale():
    """``cluster_modes`` is ``slow_rate``'s one home; ``following_scale``'s ``s_H`` is ``floor_scale`` (same
    draws); ``s_follow^2`` is the closed form ``sum_m E[f_m^2] g_m / (g_m + r)``; more than one cluster falls back."""
    A = np.diag([2.0, 1.0, 0.3])[None] + goe_heads(8, 3, 0.3, 5)
    m = cluster_modes(A)
    assert slow_rate(A) == m.rates.min() > 0
    assert np.allclose(m.vectors.T @ m.vectors, np.eye(2), atol=1e-12) and np.abs(m.vectors.T @ m.x).max() < 1e-12
    law = GaussianHeads.create(A, C)
    assert stationarity(m.x[None], law).slope < 1e-10  # x* rests for the limit law too (the spread shifts along x)
    ou = OrnsteinUhlenbeck(A, 1.0, C * math.sqrt(2.0))
    x = np.tile(m.x, (3, 1))
    fs = following_scale(x, ou, 64, 7)
    assert fs.s_H == pytest.approx(floor_scale(x, ou, 64, 7), rel=1e-12)
    assert fs.follow**2 == pytest.approx(float((fs.mode_sq * m.rates / (m.rates + 1.0)).sum()) + fs.normal_sq)
    assert fs.mode_sq.sum() == pytest.approx(fs.s_H**2, rel=1e-6) and fs.follow < fs.s_H and fs.scale == fs.follow
    two = np.concatenate([x, -np.tile(np.cross(m.x, m.vectors[:, 0]), (3, 1))])
    apart = following_scale(two, ou, 16, 7)
    assert not apart.single and apart.clusters == 2 and apart.scale == apart.s_H and math.isnan(apart.follow)
    assert "falls back to s_H" in apart.describe()


def test_a_single_cluster_shows_s_follow_not_s_H():
    """d = 3, r = 3 (g/r = 0.28 and 0.59): the simulated late slope is s_follow; s_H (the control) misses it."""
    _check([2.0, 1.0, 0.3], 3.0, 200.0, 11, control=True, wander=True)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("spectrum", "r", "T", "seed", "control"),
    [
        ([2.0, 1.0, 0.3], 0.3, 400.0, 12, False),
        ([2.0, 1.0, 0.3], 1.0, 300.0, 13, True),
        ([2.0, 1.0], 0.3, 400.0, 14, False),
        ([2.0, 1.0], 1.0, 400.0, 15, True),
        ([2.0, 1.0], 3.0, 300.0, 16, True),
    ],
)
def test_a_single_cluster_shows_s_follow_at_other_rates_and_on_the_circle(spectrum, r, T, seed, control):
    """d = 3 and d = 2 at r = 0.3, 1, 3; at r = 0.3 (g/r >= 2.8) the two scales differ by less than the errors.
    The displacement along each mode is checked against ``FollowingScale.wander`` too."""
    _check(spectrum, r, T, seed, control, wander=True)


def _pair_run(spectrum: list[float], r: float, T: float, seed: int, counts: tuple[int, int]):
    """Late rms of ``|dF|(mu_t, Theta_inf)`` of a simulated antipodal pair of point clusters (``counts`` tokens
    each, starting at the pair's rest point), its standard error, and the scales."""
    A, ou, law = _stationary_heads(spectrum, r, seed)
    x = cluster_modes(A).x
    rest = pair_modes(law, np.stack([x, -x]), np.array(counts) / sum(counts)).x
    x0 = np.concatenate([np.tile(rest[0], (counts[0], 1)), np.tile(rest[1], (counts[1], 1))])
    fs = following_scale(x0, ou, DRAWS, 3)
    rms, se, cm, tr = _late_rms(x0, ou, law, fs, r, T, seed)
    return rms, se, fs, cm, tr, pair_modes(law, rest, np.array(counts) / sum(counts)), counts


def _check_pair(
    spectrum: list[float],
    r: float,
    T: float,
    seed: int,
    counts: tuple[int, int],
    control: bool,
    wander: bool = False,
    rest: bool = False,
) -> None:
    rms, se, fs, cm, tr, p, counts = _pair_run(spectrum, r, T, seed, counts)
    if rest and not wander:  # unequal masses: the modes are orthonormal in m_k S(x_k), the distance in m_k
        _compare_rest_distance(tr, np.flatnonzero(tr.t >= BURN), fs, False)
    if wander:  # the pair's displacement on its M-orthonormal modes, in the tokens' mass-weighted angles
        late = np.flatnonzero(tr.t >= BURN)
        centres = np.stack([tr.x[late, : counts[0]].mean(1), tr.x[late, counts[0] :].mean(1)], axis=1)
        delta = np.einsum("k,tkd,kdm->tm", p.metric, centres - p.x, p.vectors)
        to_angle = np.sqrt(np.einsum("k,kdm->m", p.masses, p.vectors**2))
        forced = fs.wander > 1e-3 * fs.wander.max()  # equal masses: the relative modes get no forcing
        _compare_wander(
            tr.t[late], delta[:, forced] * to_angle[forced], fs.wander[forced], fs.rates[forced], fs, control
        )
        assert np.allclose(fs.rest, p.x, atol=1e-9) and np.array_equal(fs.labels, np.repeat([0, 1], counts))
        _compare_rest_distance(tr, late, fs, control)
    msg = (
        f"late rms {rms:.4g} +- {se:.2g}, s_follow {fs.follow:.4g}, s_H {fs.s_H:.4g}, tau_int {cm.tau_int:.3g}, "
        f"normal {fs.normal_sq / fs.s_H**2:.2g} s_H^2, inner {fs.inner:.8f}"
    )
    print(msg)
    assert cm.trusted, msg
    assert fs.kind == "antipodal pair" and fs.clusters == 2 and fs.scale == fs.follow, msg
    # point clusters: the field lies on the pair's modes, up to O(c^2) (the modes are orthonormal in the law's
    # metric, s_H is measured in the drawn heads')
    assert fs.normal_sq < 10.0 * C**2 * fs.s_H**2, msg
    assert abs(rms - fs.follow) <= 3.0 * se, msg
    if control:  # g/r small: the factor-1 floor scale overstates what the pair shows
        assert abs(rms - fs.s_H) > 3.0 * se, msg


def test_pair_modes_are_metric_orthonormal_and_equal_masses_co_rotate():
    """The pair's modes are orthonormal in the mobility metric and relax; for equal masses the rest point is
    exactly antipodal and the heads' finite-H field has no component on the relative modes (the pair co-rotates)."""
    A = np.diag([2.0, 1.0, 0.3])[None] + goe_heads(8, 3, 0.3, 5)
    law = GaussianHeads.create(A, C)
    x = cluster_modes(A).x
    for m1 in (0.5, 0.3):
        p = pair_modes(law, np.stack([x, -x]), np.array([m1, 1.0 - m1]))
        gram = np.einsum("k,kdm,kdn->mn", p.metric, p.vectors, p.vectors)
        assert np.allclose(gram, np.eye(4), atol=1e-9) and p.rates.min() > 0
        assert np.abs(np.einsum("kd,kdm->km", p.x, p.vectors)).max() < 1e-12  # tangent at each cluster
        assert float(p.x[0] @ p.x[1]) < -1.0 + 1e-6
    ou = OrnsteinUhlenbeck(A, 1.0, C * math.sqrt(2.0))
    two = np.concatenate([np.tile(x, (2, 1)), np.tile(-x, (2, 1))])
    fs = following_scale(two, ou, 64, 7)
    assert fs.kind == "antipodal pair" and fs.name == "s_follow (antipodal pair)" and fs.scale == fs.follow
    assert len(fs.rates) == 4 and np.sort(fs.mode_sq)[:2].max() < 1e-12 * fs.s_H**2  # two modes unforced
    assert "antipodal pair" in fs.describe()


def test_an_antipodal_pair_shows_its_s_follow_not_s_H():
    """d = 3, r = 3, equal masses: the simulated late slope is the pair's s_follow; s_H (the control) misses it."""
    _check_pair([2.0, 1.0, 0.3], 3.0, 200.0, 21, (2, 2), control=True, wander=True)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("spectrum", "r", "T", "seed", "counts", "control"),
    [
        ([2.0, 1.0, 0.3], 1.0, 600.0, 31, (2, 2), True),
        ([2.0, 1.0, 0.3], 1.0, 300.0, 23, (3, 7), True),
        ([2.0, 1.0, 0.3], 3.0, 200.0, 24, (3, 7), True),
        ([2.0, 1.0], 1.0, 400.0, 25, (2, 2), True),
        ([2.0, 1.0], 3.0, 300.0, 26, (2, 2), True),
        ([2.0, 1.0], 3.0, 300.0, 27, (3, 7), True),
    ],
)
def test_an_antipodal_pair_shows_s_follow_at_other_rates_unequal_masses_and_on_the_circle(
    spectrum, r, T, seed, counts, control
):
    """d = 3 and d = 2 at r = 1, 3, equal masses and 0.3 / 0.7. (d = 3, r = 1, equal masses at seed 22, T = 300 sat
    3.0 errors low; the validated single-cluster s_follow sat 2.95 errors low on the same heads' path: the path's
    excursion, not the pair's. T = 600 at seeds 31, 32, 33: -1.6, -1.3, +1.0 errors, the single cluster's -1.5,
    -1.2, +1.0.)"""
    # (No wander check here: at r = 1 with unequal masses the quasi-static control is within 3 errors, and at
    # r = 3, 3 + 7 tokens on the circle delta^2 decorrelates over tau_int ~ 36, so a run of 300 holds only 15.
    # ou row 1's rest distance is checked against w_follow where it decorrelates fast enough: d = 3; 2026-12-02,
    # seeds 24 and 23 at 3 + 7 tokens: 0.01712 +- 0.00087 against 0.01595, 0.02303 +- 0.0013 against 0.02252.)
    _check_pair(spectrum, r, T, seed, counts, control, rest=len(spectrum) == 3)


def test_a_pair_held_off_its_rest_point_by_noise_is_still_a_pair_a_saddle_is_not():
    """``following_scale`` asks antipodality of the rest pair Newton reaches, not of the cloud: a pair whose second
    cluster sits 5 degrees off its rest point (inner product -0.996, outside ``ANTIPODAL_TOL`` = 1e-3) is the pair
    of that rest point. Controls: two clusters 90 degrees apart, and a pair around the rest point of the *least*
    favoured axis (a saddle: a mode that does not relax), fall back to ``s_H``."""
    A = np.diag([2.0, 1.0, 0.3])[None] + goe_heads(8, 3, 0.3, 5)
    ou = OrnsteinUhlenbeck(A, 1.0, C * math.sqrt(2.0))
    law = GaussianHeads.create(A, C)
    x = cluster_modes(A).x
    rest = pair_modes(law, np.stack([x, -x]), np.array([0.4, 0.6])).x
    u = np.cross(rest[1], [0.0, 1.0, 0.0])
    u /= np.linalg.norm(u)
    off = math.cos(math.radians(5.0)) * rest[1] + math.sin(math.radians(5.0)) * u
    cloud = np.concatenate([np.tile(rest[0], (4, 1)), np.tile(off, (6, 1))])
    fs = following_scale(cloud, ou, 16, 7)
    assert fs.inner > -1.0 + 1e-3 and fs.kind == "antipodal pair" and fs.scale == fs.follow
    assert np.allclose(fs.rest, rest, atol=1e-8) and fs.angle == pytest.approx(5.0, rel=1e-3)
    assert rest_distance(cloud, None, fs) == pytest.approx(math.radians(5.0) * math.sqrt(0.6), rel=1e-6)
    low = np.linalg.eigh(A.mean(0))[1][:, 0]  # the least favoured axis: a pair there has modes that grow
    saddle = np.concatenate([np.tile(low, (4, 1)), np.tile(-low, (6, 1))])
    sad = following_scale(saddle, ou, 16, 7)
    assert not sad.applies and sad.scale == sad.s_H and "a saddle" in sad.describe()
    # Row 2 calls the same clouds the same (its window in units of the pair's slowest mode; a saddle is no pair).
    end = lambda c: settle_row._end_state(SimpleNamespace(x=c[None], diagnostics={"clusters": [2]}), ou, 0.5)
    clusters, antipodal, slow = end(cloud)
    assert antipodal and slow == pytest.approx(1.0 / fs.rates.min())
    assert end(saddle) == (2, False, 0.5)
