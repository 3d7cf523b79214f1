"""Issue 28, ``ou`` / ``oscillating``: the run's length follows its own relaxation time, the settling check
allows the finite-H wander measured by independent-noise replicas (a drift fails it), and the cluster's slow
mode is the rate the simulator shows."""

import dataclasses
import math

import numpy as np
import pytest
import yaml

from attnflow.analysis import following
from attnflow.analysis import lockin as alockin
from attnflow.analysis import relaxation as arelax
from attnflow.analysis.relaxation import Settling, settling, slow_rate
from attnflow.core.heads import goe_heads
from attnflow.experiments import ExperimentConfigError, experiment_config, relax_runs, run_experiment, settle_row
from attnflow.experiments import ou as ou_exp
from attnflow.experiments.floors import MIN_WINDOW_TAUS, WINDOW_TAUS
from attnflow.experiments.relax_runs import build
from attnflow.solve.simulation import simulate
from attnflow.weights.processes import Oscillating

#: A small, fast ou/oscillating configuration (d = 3, a clear spectral gap).
SMALL = ["tokens.n=24", "heads.count=8", "integration.t_end=8", "law.paths=2000", "law.t_ends=[4, 8]"]


def _decay_rate(A: np.ndarray) -> float:
    """The late exponential rate at which a slightly displaced cluster returns to its resting point (simulated)."""
    d = A.shape[-1]
    x = np.ones((1, d)) / np.sqrt(d)
    xs = simulate(np.repeat(x, 2, 0), A, model="gf", t_end=60, dt=0.05, save_every=1200).x[-1, 0]
    e = np.random.default_rng(0).standard_normal(d)
    e -= (e @ xs) * xs
    x0 = xs + 0.05 * e / np.linalg.norm(e)
    tr = simulate(np.repeat((x0 / np.linalg.norm(x0))[None], 2, 0), A, model="gf", t_end=10, dt=0.01, save_every=10)
    dist = np.arccos(np.clip(tr.x[:, 0] @ xs, -1, 1))
    keep = np.flatnonzero(dist > 1e-6)  # above arccos's rounding
    late = keep[int(0.7 * len(keep)) :]  # the last 30%: the faster modes have died out
    return float(-np.polyfit(tr.t[late], np.log(dist[late]), 1)[0])


@pytest.mark.parametrize(
    ("spectrum", "variety", "H"), [([2.0, 1.7, 0.5], 0.0, 1), ([1.5, 1.45], 0.3, 4), ([1.0, 0.9, 0.2], 1.5, 2)]
)
def test_slow_rate_is_the_simulated_return_rate_of_a_displaced_cluster(spectrum, variety, H):
    A = np.diag(spectrum)[None] + goe_heads(H, len(spectrum), variety, 3)
    g, sim = slow_rate(A), _decay_rate(A)
    assert g == pytest.approx(sim, rel=0.02)
    if variety > 0:
        # Control: the plain mean's gap ignores gf's head weighting exp(x^T A_h x) and its covariance term.
        w = np.linalg.eigvalsh(A.mean(0))
        assert abs((w[-1] - w[-2]) - sim) > 0.2 * sim


def test_the_continued_oscillating_run_is_the_uninterrupted_run():
    """A continuation from the last state, with the weights at their phase, reproduces one long run."""
    cfg = experiment_config("ou", quick=True, sets=SMALL)
    x0, _, osc, _ = build(cfg, 0)
    it = {"dt": 0.05, "save_every": 2}
    first = simulate(x0, osc, model="gf", t_end=4.0, dt=0.05, save_every=2)
    nxt = Oscillating(osc.A_bar, osc.C, osc.omega, osc.phase + osc.omega * 4.0)
    joined = relax_runs.continued(first, nxt, 4.0, it, None)
    whole = simulate(x0, osc, model="gf", t_end=8.0, dt=0.05, save_every=2)
    assert np.allclose(joined.t, whole.t, atol=1e-12)
    assert np.abs(joined.x - whole.x).max() < 1e-9
    assert np.allclose(joined.diagnostics["energy"], whole.diagnostics["energy"], atol=1e-9)
    assert np.allclose(joined.steps["step_time"], whole.steps["step_time"], atol=1e-12)


def test_the_typed_parameters_and_their_dict_run_the_same_cached_runs():
    """The runs read ``RelaxationParams`` attributes; its dict (configs.yaml's form) is validated into it at the entry
    and keys the cache with the same text as before the typed path, so ``ou`` and ``oscillating`` share one pair."""
    cfg = experiment_config("ou", quick=True, sets=SMALL)
    params = relax_runs.RelaxationParams.parse(cfg)
    assert relax_runs.params_key(params) == yaml.safe_dump(cfg, sort_keys=True)
    assert relax_runs.pair_runs(params, 0)[0] is relax_runs.pair_runs(cfg, 0)[0]
    assert relax_runs.run_length(params, 0) == relax_runs.run_length(cfg, 0)
    # Control: one parameter changed is another key.
    assert relax_runs.params_key(params.with_sets(["ou.sigma=0.31"])) != relax_runs.params_key(params)
    # A partial dict gets the documented defaults (a missing max_extension meant a cap of 1 x t_end inside the runs).
    assert relax_runs.relaxation_params({"ou": {"sigma": 0.5}}).integration.max_extension == 8.0
    with pytest.raises(ExperimentConfigError, match="sigmaa"):
        relax_runs.relaxation_params({"ou": {"sigmaa": 0.5}})


def test_the_run_continues_until_its_window_holds_a_relaxation_time():
    cfg = experiment_config("ou", quick=True, sets=[*SMALL, "integration.t_end=3"])
    trajs, _ = relax_runs.pair_runs(cfg, 0)
    length = relax_runs.run_length(cfg, 0)
    T = float(trajs["ou"].t[-1])
    assert T == pytest.approx(length.T) and T > 3.0 and T <= length.cap
    assert T >= length.needed - 1e-9 >= (WINDOW_TAUS + MIN_WINDOW_TAUS) * max(length.tau, length.tau_slow) - 1e-9
    assert np.allclose(trajs["ou"].t, trajs["oscillating"].t)
    assert np.all(np.diff(trajs["ou"].t) > 0) and len(trajs["ou"].t) == len(trajs["ou"].x) == len(trajs["ou"].A)
    assert relax_runs.run_window(trajs["ou"]).ok


def test_a_run_stopped_too_early_is_reported_as_not_settled():
    """Negative control of the run-length rule: no extension allowed, a run far shorter than its relaxation."""
    res = run_experiment("ou", quick=True, seed=0, sets=[*SMALL, "integration.t_end=2", "integration.max_extension=1"])
    assert not any(p.ok for p in res.predictions)
    assert all("within the cap" in p.explanation or "Slow mode" in p.explanation for p in res.predictions)
    assert res.headline["run_length"]["capped"]


def test_settling_allows_the_finite_h_wander_and_fails_a_planted_drift():
    cfg = experiment_config("ou", quick=True, sets=SMALL)
    trajs, _ = relax_runs.pair_runs(cfg, 0)
    st = relax_runs.settled_runs(cfg, 0)
    o, win = trajs["ou"], st.window
    assert win.ok and st.wander > 0 and len(st.replicas) == relax_runs.WANDER_REPLICAS
    assert st.ou.ratio < 1.0 <= st.oscillating.ratio
    # A planted non-stationary run: the same clouds turned about an axis, the angle growing through the window
    # by twice the bound (in radians, the distance it moves a cluster on the great circle at most).
    ang = np.clip((o.t - win.start) / (o.t[-1] - win.start), 0, 1) * 2.0 * st.ou.bound
    ang = ang[-1] - ang  # the planted drift ends at the final state
    c, s = np.cos(ang), np.sin(ang)
    R = np.zeros((len(o.t), 3, 3))
    R[:, 0, 0], R[:, 0, 1], R[:, 1, 0], R[:, 1, 1], R[:, 2, 2] = c, -s, s, c, 1.0
    axis = np.linalg.svd(o.x[-1] - o.x[-1].mean(0))[2][-1]  # a frame in which the final cloud moves when turned
    frame = np.linalg.qr(np.stack([o.x[-1].mean(0), axis, np.cross(o.x[-1].mean(0), axis)], 1))[0]
    planted = dataclasses.replace(o, x=np.einsum("ij,tjk,lk,tnl->tni", frame, R, frame, o.x))
    drift = settling(planted, win.start, st.wander)
    assert drift.ratio > 1.0, drift.text()
    # The bound itself: a fraction of the displacement plus the wander allowance.
    assert Settling(0.3, 2.0, 0.1).bound == pytest.approx(0.1 * 2.0 + 2.0 * 0.1)


def test_the_ou_stationarity_control_is_the_run_before_it_relaxed_and_no_power_is_not_a_pass(monkeypatch):
    """``ou`` row 1's control is the same run's transient ``[0, 3 tau)`` against the same rest configuration (by
    position: the final cloud is one cluster or an antipodal pair), rejected with a margin. Planted without power,
    the control is not rejected and the row is not a PASS and says why: the late states given as the "transient"
    (row 1), the OU law not turned, which settles (row 2's control); ``oscillating``'s no-relaxation
    row (a lock-in test at omega) then finds no motion locked to omega."""
    res = run_experiment("ou", quick=True, seed=0, sets=SMALL)
    h, stat = res.headline, res.predictions[0]
    assert stat.ok and res.predictions[1].ok, (stat.explanation, res.predictions[1].explanation)
    assert h["stationarity_statistic"] == "position" and "w_follow" in stat.measured
    tr, late = h["rest_distance_transient_rms_over_wander"], h["rest_distance_late_rms_over_wander"]
    assert tr > relax_runs.FLOOR_FACTOR * 1.1 and h["rest_distance_start_over_wander"] > tr
    assert stat.control_margin == pytest.approx(tr / relax_runs.FLOOR_FACTOR - 1.0, rel=1e-9)
    assert stat.margin == pytest.approx(1.0 - late / relax_runs.FLOOR_FACTOR, rel=1e-9)
    # The slope test, printed for reference, keeps its own scale.
    tr = h["slope_limit_law_transient_rms_over_scale"]
    # Prediction and control on one scale: s_follow for a single final cluster or an antipodal pair, s_H otherwise.
    inner = h["following_pair_inner"]
    pair = h["clusters_end"] == 2 and inner is not None and inner < -1.0 + arelax.ANTIPODAL_TOL
    kind = "s_follow" if h["clusters_end"] == 1 else "s_follow (antipodal pair)" if pair else "s_H"
    assert h["stationarity_scale_kind"] == kind
    assert tr == pytest.approx(h["slope_limit_law_transient_rms_over_s_H"] / h["following_over_s_H"], rel=1e-9)
    assert 0 < h["following_over_s_H"] <= 1.0
    assert h["transient_window"][0] == 0.0 and h["transient_window"][1] < h["window"][0]
    # The position's control window is the first relaxation time, inside the slope test's [0, 3 tau).
    pw = h["position_control_window"]
    assert pw[0] == 0.0 and pw[1] < h["relaxation_time"] < h["transient_window"][1]
    monkeypatch.setattr(ou_exp, "transient_window", lambda t, tau, taus=3: np.arange(len(t) // 2, len(t)))
    monkeypatch.setattr(settle_row, "control_turn", lambda g: 0.0)  # row 2's control: the OU law, not turned
    bad = run_experiment("ou", quick=True, seed=0, sets=[*SMALL, "oscillating.amplitude=0"])
    for p in bad.predictions[:2]:
        assert p.passed and not p.control_rejected and not p.ok
        assert "Control without power" in p.explanation, p.explanation
    # Row 2 looked again while its control stayed within the bound (a turn would gain power; this one cannot).
    assert bad.headline["settling_looks"][0]["undecided"] and len(bad.headline["settling_looks"]) > 1
    assert bad.headline["rest_distance_transient_rms_over_wander"] <= relax_runs.FLOOR_FACTOR
    osc = run_experiment("oscillating", quick=True, seed=0, sets=[*SMALL, "oscillating.amplitude=0"])
    row = osc.predictions[4]
    assert not row.passed and row.control_rejected and "No motion locked to omega" in row.explanation, row.explanation
    assert osc.headline["lockin_over_scale"] < alockin.LOCKIN_Z
    # The lock-in window (continued past T for it) holds its periods, counted from its first saved time.
    assert osc.headline["lockin_periods"] >= alockin.LOCKIN_PERIODS * (1 - 1e-6)
    # Undecided (nothing at omega, the position test settled): the sequential lock-in looked again, with more
    # periods each time, never past the run-length cap (max_extension x t_end).
    looks = osc.headline["lockin_look_periods"]
    assert osc.headline["lockin_looks"] == len(looks) >= 2 and looks == sorted(looks), looks
    assert looks[1] >= 2 * alockin.LOCKIN_PERIODS * (1 - 1e-6) or osc.headline["lockin_window"][1] >= 64 - 0.1
    assert osc.headline["lockin_window"][1] <= 8.0 * 8 + 1e-9
    assert f"{len(looks)} looks of at most" in row.explanation, row.explanation


def test_rest_distance_is_the_mass_weighted_rms_angle_to_each_tokens_rest_point():
    """``D(mu, x*)^2 = sum_i a_i d(x_i, x*_{k(i)})^2``: tokens at known angles from two antipodal rest points."""
    rest = np.array([[0.0, 0.0, 1.0], [0.0, 0.0, -1.0]])
    ang = np.array([0.1, 0.3, 0.2, 0.05])
    labels = np.array([0, 0, 1, 1])
    z = np.where(labels == 0, 1.0, -1.0)
    x = np.stack([np.sin(ang), np.zeros(4), z * np.cos(ang)], axis=1)
    a = np.array([1.0, 1.0, 1.0, 5.0])
    fs = following.FollowingScale(
        1.0, 1.0, 2, 1.0, np.ones(4), np.ones(4), 0.0, 0.0, "antipodal pair", -1.0, np.ones(4), rest, labels
    )  # fmt: skip
    assert following.rest_distance(x, a, fs) == pytest.approx(math.sqrt(float(a @ ang**2) / a.sum()), rel=1e-12)
    assert following.rest_distance(x, None, fs) == pytest.approx(math.sqrt(float(np.mean(ang**2))), rel=1e-12)
    assert fs.wander_total == pytest.approx(math.sqrt(4 * 1.0 / (1.0 * (1.0 + 1.0))), rel=1e-12)  # 4 modes, g = r = 1
    # Control: the wrong assignment of tokens to rest points is far (each token near the other pole).
    wrong = dataclasses.replace(fs, labels=1 - labels)
    assert following.rest_distance(x, None, wrong) > 2.5
    with pytest.raises(ValueError, match="single cluster or an antipodal pair"):
        following.rest_distance(x, None, dataclasses.replace(fs, rest=None, labels=None, kind=""))


def test_ou_row_1_by_position_rejects_a_cloud_held_off_its_rest_point():
    """The settled run passes by position; the same run with every state rotated by 3 ``w_follow`` away from its
    rest configuration (a cloud resting elsewhere) is rejected, at about ``sqrt(9 + late^2)`` ``w_follow``."""
    cfg = experiment_config("ou", quick=True, sets=SMALL)
    ou = relax_runs.pair_runs(cfg, 0)[1]["ou"]
    sq = settle_row.settle_row(cfg, 0)
    o, win = sq["ou_traj"], sq["final"].window
    fs = following.following_scale(o.x[-1], ou, relax_runs.FLOOR_DRAWS, relax_runs.run_seeds(0)[5] + 3)
    assert fs.applies and fs.wander_total > 0
    sidx, tidx = arelax.window_indices(o, win), arelax.transient_window(o.t, sq["final"].tau)
    pos = ou_exp._position_row(o, o, sidx, tidx, fs)
    assert pos["late"] < relax_runs.FLOOR_FACTOR
    theta = 3.0 * fs.wander_total
    e0 = fs.rest[0]
    u = np.linalg.svd(e0[None])[2][1]  # a unit vector orthogonal to the rest point
    R = np.eye(len(e0)) + np.sin(theta) * (np.outer(u, e0) - np.outer(e0, u))
    R += (np.cos(theta) - 1.0) * (np.outer(e0, e0) + np.outer(u, u))
    assert np.allclose(R @ R.T, np.eye(len(e0)), atol=1e-12)
    planted = dataclasses.replace(o, x=np.einsum("ij,tnj->tni", R, o.x))
    off = ou_exp._position_row(o, planted, sidx, tidx, fs)
    assert off["late"] > relax_runs.FLOOR_FACTOR * 1.1
    assert off["late"] == pytest.approx(math.sqrt(9.0 + pos["late"] ** 2), abs=pos["late"] + 0.2)


def test_wander_replicas_run_as_one_batch_equal_the_single_runs():
    """``wander_scale`` runs its replicas as one ensemble: each member equals the single run with its noise seed (an
    independent implementation, :func:`attnflow.simulate` one replica at a time), to rounding."""
    from attnflow.analysis.distances import wasserstein_sphere
    from attnflow.weights.processes import OrnsteinUhlenbeck

    cfg = experiment_config("ou", quick=True, sets=["tokens.n=16", "heads.count=4", "integration.t_end=4"])
    trajs, procs = relax_runs.pair_runs(cfg, 0)
    o, ou = trajs["ou"], procs["ou"]
    k, dt = len(o.t) // 2, float(cfg["integration"]["dt"])
    batched = relax_runs.wander_scale(o, ou, k, 3, dt, 7)
    n = max(1, int(round(float(o.t[-1] - o.t[k]) / dt)))
    single = []
    for r in range(3):
        proc = OrnsteinUhlenbeck(ou.A_bar, ou.rate, ou.sigma, A0=o.A[k])
        rep = simulate(o.x[k], proc, model="gf", t_end=n * dt, dt=dt, method="rk4", save_every=n,
                       seed=relax_runs.segment_seed(7, 1000 + r))  # fmt: skip
        single.append(wasserstein_sphere(o.x[-1], rep.x[-1]).value)
    assert np.all(batched > 0) and np.allclose(batched, single, rtol=1e-9, atol=1e-12)
    # Control: another seed's replicas are another wander (the seed reaches every member).
    assert not np.allclose(relax_runs.wander_scale(o, ou, k, 3, dt, 8), single, rtol=1e-3)
