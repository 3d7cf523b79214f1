"""``attnflow reproduce ou``: integrable (OU) weights relax to a stationary point of the limiting energy.

The runs are those of :mod:`attnflow.experiments.relax_runs` (shared with ``oscillating``). Three rows:

1. stationarity for ``Theta_inf``: by position (:func:`attnflow.analysis.following.rest_distance` over
   ``w_follow``) where the settled cloud is one cluster or an antipodal pair, else by slope on the scale the
   cloud shows for that law (:func:`attnflow.analysis.following.following_scale`); control: the same run
   before it relaxed;
2. the cloud settles (sequential, :func:`attnflow.experiments.settle_row.settle_row`); control: the OU law
   turned at ``g / 4``;
3. the slope decays to its finite-``H`` floor ``FLOOR_FACTOR s_H``; control: the oscillating run.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any

import numpy as np

from attnflow.analysis.following import FollowingScale, following_scale, rest_distance
from attnflow.analysis.limits import stationarity
from attnflow.analysis.model_gap import TrajectoryGap, field_gap, trajectory_gap
from attnflow.analysis.relaxation import (
    SETTLED_FRACTION,
    WANDER_FACTOR,
    WINDOW_TAUS,
    Settling,
    Window,
    settling_distances,
    transient_window,
    window_indices,
)
from attnflow.core.trajectory import Trajectory
from attnflow.dynamics.infinite import GaussianHeads
from attnflow.experiments.common import ExperimentResult, Prediction, Progress, fmt
from attnflow.experiments.relax_figures import figure_ou, figure_snapshots
from attnflow.experiments.relax_runs import (
    FLOOR_DRAWS,
    FLOOR_FACTOR,
    HYPOTHESES,
    RUNS_NOTE,
    SEE_FIGURES,
    WANDER_REPLICAS,
    ParamsLike,
    RelaxationParams,
    RunLength,
    SlopeFloor,
    floor_keys,
    floor_note,
    length_note,
    pair_runs,
    relaxation_params,
    run_length,
    run_seeds,
    run_window,
    settled_runs,
    slope_floor,
)
from attnflow.experiments.settle_row import SETTLE_CONTINUATIONS, SettleStage, settle_row, undecided_looks
from attnflow.io.store import trajectory_to_dataset
from attnflow.verdicts.margins import MIN_MARGIN, margin_above, margin_below
from attnflow.weights.processes import OrnsteinUhlenbeck

#: Row 1 by position takes its control, the cloud before it relaxed, over ``[0, tau)``: a token's distance to its
#: rest point is largest at the start and falls as the cloud collapses, so the rms over ``[0, tau)`` is at least the
#: rms over ``[0, 3 tau)`` at every set where it does (all 20 of ``--seed 9``: 1.3-1.8 times it). The slope test keeps
#: ``[0, 3 tau)``: the uniform start is nearly a critical configuration, its slope is largest during the collapse.
#: (``3`` until 2026-12-02 11:50, when the position control lacked power at ``H = 8``, ``sigma ~ 0.47``.)
POSITION_CONTROL_TAUS = 1.0


def _wander_note(fs: FollowingScale) -> str:
    """The linear-response wander along the slowest mode, for a control without power (empty for the fallback)."""
    if not fs.applies:
        return ""
    m = int(np.nanargmax(fs.wander))
    w = float(fs.wander[m])
    return (
        f" The heads' noise alone moves the settled cloud, by linear response, by up to {fmt(w)} rad "
        f"({math.degrees(w):.3g} degrees) rms along "
        f"one mode (g = {fmt(float(fs.rates[m]))} against the heads' r = {fmt(fs.rate)}; FollowingScale.wander); the "
        f"final cloud sits {fs.angle:.3g} degrees from the limit law's rest point, and relaxing along a mode of rate g "
        "shows a slope of only g times the angle."
    )


def _settle_note(params: RelaxationParams, sq: dict[str, Any], floor_ratio: float) -> str:
    """Why ``ou``'s settling row (or its control) failed, from the last look's numbers (:func:`settle_row`), the final
    cluster count and the slow mode."""
    fin, length = sq["final"], sq["length"]
    ou, ctrl, win = fin.ou, fin.control, fin.window
    looks = len(sq["stages"])
    seq = (
        ""
        if looks == 1
        else f" (look {looks} of at most {SETTLE_CONTINUATIONS + 1}: continued while undecided, "
        + undecided_looks(sq["stages"])
        + ")"
    )
    if not win.ok:
        return length_note(length, win) + seq
    if ou.ratio >= 1.0 - MIN_MARGIN:
        head = (
            f"the OU run still moves in its late window ({ou.text()}) although its energy relaxed "
            f"(tau = {fmt(fin.tau)}){seq}: "
            if ou.ratio >= 1.0
            else f"Undecided: the OU run is within the minimum margin of the bound ({ou.text()}){seq}; "
        )
        if fin.clusters > 1 and not fin.antipodal:
            why = (
                f"it ends in {fin.clusters} clusters, a saddle of the limiting energy (e.g. near-antipodal clusters) "
                "that it leaves, or merges from, only slowly."
            )
        else:
            why = (
                f"a motion common to independent noise paths (a drift, not the finite-H wander, which the bound "
                f"includes) is still going on; the cluster's slowest mode has 1/g = {fmt(length.tau_slow)}."
            )
        extra = f" Its slope is at the finite-H floor ({floor_ratio:.2g} s_H)." if floor_ratio <= FLOOR_FACTOR else ""
        return head + why + extra
    which = f" (the OU law turned at Omega = g/4 = {fmt(sq['turn'])}: {fmt(sq['turn'] * (win.end - win.start))} rad over the window)"
    # The OU run settled and the control stays within the bound: the position test has no power here.
    if SETTLED_FRACTION * ctrl.displacement < ctrl.late <= WANDER_FACTOR * ctrl.wander:
        why = (
            f"the heads' finite-H wander alone ({WANDER_FACTOR:g} w_H = {fmt(WANDER_FACTOR * ctrl.wander)}, at H = "
            f"{params.heads.count} and sigma = {params.ou.sigma}) exceeds the control's whole late motion "
            f"({fmt(ctrl.late)}): at this H and noise a cloud kept moving cannot be told from a settled one that "
            "wanders, by position."
        )
    else:
        why = (
            f"over the window the cap allows, its turn moved it {fmt(ctrl.late)}, against a bound of {fmt(ctrl.bound)} "
            f"({fmt(WANDER_FACTOR * ctrl.wander / ctrl.bound)} of it the finite-H wander, w_H = {fmt(ctrl.wander)} rad "
            f"at H = {params.heads.count} and sigma = {params.ou.sigma}): a turning cloud cannot be told from a "
            "settled one that wanders here."
        )
    return f"Control without power at this set: the control{which} stays within {fmt(ctrl.ratio)} of the settling " + (
        f"bound in the window ({ctrl.text()}){seq}: " + why
    )


def _position_row(traj, settled, sidx: np.ndarray, tidx: np.ndarray, fs: FollowingScale) -> dict[str, Any]:
    """Row 1 by position: the rms of :func:`rest_distance` over the settled run's settling window ``sidx``
    (``late``), over the run's transient ``tidx`` (``transient``, the control) and at ``t = 0`` (``start``), each
    over ``w_follow`` (:attr:`FollowingScale.wander_total`); ``series`` is ``D(mu_t, x*) / w_follow`` at every saved
    time of the settled run (the figure)."""
    w = fs.wander_total
    series = np.array([rest_distance(x, settled.token_weights, fs) for x in settled.x]) / w
    early = np.array([rest_distance(traj.x[k], traj.token_weights, fs) for k in tidx]) / w
    return {
        "late": float(np.sqrt(np.mean(series[sidx] ** 2))),
        "transient": float(np.sqrt(np.mean(early**2))),
        "start": float(early[0]),  # transient_window starts at t = 0
        "series": series,
    }


def _position_note(pos: dict[str, Any], fs: FollowingScale) -> str:
    """Why row 1 by position failed: the control without power, or the cloud away from its rest point."""
    if pos["transient"] <= FLOOR_FACTOR * (1 + MIN_MARGIN):
        return (
            f"Control without power at this set: the transient's rms distance from the rest configuration is only "
            f"{fmt(pos['transient'])} w_follow (t = 0: {fmt(pos['start'])}) against {FLOOR_FACTOR:g}: the heads' "
            "noise moves the settled cloud about as far as the cloud ever was from its rest point."
        )
    m = int(np.argmin(fs.rates))
    return (
        f"The settled cloud sits {fmt(pos['late'])} w_follow (rms) from the rest configuration of the limit law, "
        f"beyond what its heads' noise explains; its final state is {fs.angle:.3g} degrees from the rest point and "
        f"the slowest mode relaxes at g = {fmt(float(fs.rates[m]))} (1/g = {fmt(1.0 / float(fs.rates[m]))}): a cloud "
        "still relaxing along it, or resting elsewhere."
    )


_WHY_MODEL = "the theory's relaxation statements are about the gradient flow (docs/model.md)"


@dataclasses.dataclass(frozen=True)
class _OuRun:
    """What ``ou`` measures, in the order it measures it (:func:`_measure_ou`): the runs, the settling row, the
    scales and windows every row and note reads."""

    params: RelaxationParams
    gap: TrajectoryGap
    field_gaps: list[float]
    law_inf: GaussianHeads
    slope_inf: np.ndarray
    slope_0: np.ndarray
    fl: SlopeFloor
    window: Window
    length: RunLength
    sq: dict[str, Any]
    fin: SettleStage
    swin: Window
    idx: np.ndarray
    s_osc: Settling
    turned: float
    d: dict[str, np.ndarray]
    win: str
    s_H: float
    fs: FollowingScale
    scale: float
    scale_name: str
    rms_inf: float
    st_inf: float
    st_0: float
    tidx: np.ndarray
    rms_tr: float
    st_tr: float
    fs_pos: FollowingScale
    pidx: np.ndarray
    pos: dict[str, Any] | None
    traj: Trajectory
    osc: Trajectory
    ou: OrnsteinUhlenbeck
    o2: Trajectory
    c2: Trajectory
    sidx: np.ndarray
    sidx_c: np.ndarray
    w2_ou: np.ndarray
    w2_c: np.ndarray
    s_ou: Settling
    s_ctrl: Settling


def _measure_ou(cfg: RelaxationParams, seed: int, progress: Progress | None) -> _OuRun:
    """Run (or read from the cache) everything ``ou``'s rows need."""
    if progress:
        progress(0, 2, "simulating the OU and oscillating runs")
    runs, procs = pair_runs(cfg, seed)
    trajs = {k: runs[k] for k in ("ou", "oscillating")}
    traj, osc, ou = trajs["ou"], trajs["oscillating"], procs["ou"]
    mha = runs["ou-mha"]
    m = len(mha.t)  # the mha twin runs t_end only: the gap is measured over that span
    gap = trajectory_gap(traj.first(m), mha)
    field_gaps = [field_gap(traj.x[k], traj.A[k]) for k in (0, len(traj.t) - 1)]
    if progress:
        progress(1, 2, "stationarity and settling")
    law_inf = GaussianHeads.create(ou.A_bar, ou.stationary_scale)
    law_0 = GaussianHeads.create(ou.A0, 0.0)
    slope_inf = np.array([stationarity(x, law_inf).slope for x in traj.x])
    slope_0 = np.array([stationarity(x, law_0).slope for x in traj.x])
    fl = slope_floor(trajs, ou, cfg, seed)
    window = run_window(traj)
    length = run_length(cfg, seed)
    st = settled_runs(cfg, seed)
    # Row 2 is sequential (settle_row): its control runs at a pace the cloud can follow, and an undecided look
    # continues both runs. Rows 1 and 3 keep the runs above.
    sq = settle_row(cfg, seed)
    fin = sq["final"]
    swin = fin.window
    idx = window_indices(traj, window)
    o2, c2 = sq["ou_traj"], sq["control_traj"]
    sidx, sidx_c = window_indices(o2, swin), window_indices(c2, swin)
    w2_ou, _ = settling_distances(o2, sidx)
    w2_c, _ = settling_distances(c2, sidx_c)
    s_ou, s_ctrl = fin.ou, fin.control
    s_osc = st.oscillating
    turned = sq["turn"] * (swin.end - swin.start)  # the control's turn over the settling window, radians
    d = traj.diagnostics
    win = f"t in [{traj.t[idx[0]]:.3g}, {traj.t[-1]:.3g}] (from {WINDOW_TAUS:g} tau, tau = {fmt(window.tau)})"
    s_H = fl.scale
    # Row 1's scale: a settled single cluster (or antipodal pair) follows its heads, so for the limit law it shows
    # s_follow <= s_H (linear response, following_scale; the same draws as s_H); anything else falls back to s_H.
    fs = following_scale(traj.x[-1], ou, FLOOR_DRAWS, run_seeds(seed)[5] + 3)
    scale = fs.scale
    scale_name = fs.name
    rms_inf = float(np.sqrt(np.mean(slope_inf[idx] ** 2)))
    st_inf = rms_inf / scale
    st_0 = float(np.sqrt(np.mean(slope_0[idx] ** 2))) / scale
    # The stationarity row's control: the same run's transient against the same law (a cloud before it relaxed).
    tidx = transient_window(traj.t, window.tau)
    rms_tr = float(np.sqrt(np.mean(slope_inf[tidx] ** 2)))
    st_tr = rms_tr / scale
    # Row 1 by position where the linear response applies: the settled cloud (row 2's run, over its settling window,
    # which is in units of the slowest mode) against the rest configuration it relaxes to, in units of the wander
    # w_follow a cloud following its heads shows; the slope of a mode of rate g is only g times its displacement,
    # so a slope test cannot see a slow mode or tell a near-critical start (the uniform cloud) from a rest point.
    fs_pos = fs if o2 is traj else following_scale(o2.x[-1], ou, FLOOR_DRAWS, run_seeds(seed)[5] + 3)
    pidx = transient_window(traj.t, window.tau, POSITION_CONTROL_TAUS)
    pos = _position_row(traj, o2, sidx, pidx, fs_pos) if fs_pos.applies else None
    return _OuRun(
        params=cfg, gap=gap, field_gaps=field_gaps, law_inf=law_inf, slope_inf=slope_inf, slope_0=slope_0, fl=fl,
        window=window, length=length, sq=sq, fin=fin, swin=swin, idx=idx, s_osc=s_osc, turned=turned, d=d, win=win,
        s_H=s_H, fs=fs, scale=scale, scale_name=scale_name, rms_inf=rms_inf, st_inf=st_inf, st_0=st_0, tidx=tidx,
        rms_tr=rms_tr, st_tr=st_tr, fs_pos=fs_pos, pidx=pidx, pos=pos, traj=traj, osc=osc, ou=ou, o2=o2, c2=c2,
        sidx=sidx, sidx_c=sidx_c, w2_ou=w2_ou, w2_c=w2_c, s_ou=s_ou, s_ctrl=s_ctrl
    )  # fmt: skip


def _ou_headline(r: _OuRun) -> dict[str, Any]:
    """``ou``'s ``results.json`` numbers."""

    return {
        "stationarity_statistic": "position" if r.pos else "slope",
        "rest_distance_late_rms_over_wander": r.pos["late"] if r.pos else None,
        "rest_distance_transient_rms_over_wander": r.pos["transient"] if r.pos else None,
        "rest_distance_start_over_wander": r.pos["start"] if r.pos else None,
        "wander_follow_radians": r.fs_pos.wander_total if r.pos else None,
        "rest_points": np.asarray(r.fs_pos.rest).tolist() if r.pos else None,
        "rest_cluster_angle_degrees": r.fs_pos.angle if r.pos else None,
        "slope_limit_law_transient_rms_over_s_H": r.rms_tr / r.s_H,
        "transient_window": [float(r.traj.t[r.tidx[0]]), float(r.traj.t[r.tidx[-1]])],
        "position_control_window": [float(r.traj.t[r.pidx[0]]), float(r.traj.t[r.pidx[-1]])] if r.pos else None,
        "slope_limit_law_late_rms_over_s_H": r.rms_inf / r.s_H,
        "slope_t0_law_late_rms_over_s_H": r.st_0 * r.scale / r.s_H,
        "slope_limit_law_start_over_s_H": float(r.slope_inf[0]) / r.s_H,
        "stationarity_scale": r.scale,
        "stationarity_scale_kind": r.scale_name,
        "following_scale": r.fs.follow if r.fs.applies else None,
        "following_over_s_H": r.scale / r.s_H,
        "following_modes": r.fs.table() if r.fs.applies else [],
        "following_heads_rate": r.fs.rate,
        "following_cluster_angle_degrees": r.fs.angle if r.fs.applies else None,
        "following_pair_inner": r.fs.inner if math.isfinite(r.fs.inner) else None,
        "slope_limit_law_late_rms_over_scale": r.st_inf,
        "slope_limit_law_transient_rms_over_scale": r.st_tr,
        "settled_fraction": r.s_ou.late / r.s_ou.displacement,
        "settled_fraction_oscillating": r.s_osc.late / r.s_osc.displacement,
        "settling_over_bound": r.s_ou.ratio,
        "settling_over_bound_control": r.s_ctrl.ratio,
        "settling_over_bound_oscillating": r.s_osc.ratio,
        "settling_control_turn_rate": r.sq["turn"],
        "settling_control_turn_radians": r.turned,
        "settling_looks": [stage.summary() for stage in r.sq["stages"]],
        "settling_run_length": dataclasses.asdict(r.sq["length"]) | {"needed": r.sq["length"].needed},
        "wander_scale": r.fin.wander,
        "wander_replicas": r.fin.replicas,
        "wander_replicas_from": r.fin.replicas_from,
        "settling_window": [r.swin.start, r.swin.end],
        "w2_to_final_late": r.w2_ou,
        "run_length": dataclasses.asdict(r.length) | {"needed": r.length.needed, "capped": r.length.capped},
        "slow_mode_time": r.length.tau_slow,
        **floor_keys(r.fl, "ou", "oscillating"),
        "relaxation_time": r.window.tau,
        "window_relaxation_times": r.window.length_taus,
        "clusters_end": int(r.d["clusters"][-1]),
        "window": [float(r.traj.t[r.idx[0]]), float(r.traj.t[-1])],
        "spectrum": list(r.params.heads.spectrum),
        "hypotheses": HYPOTHESES,
        "gf_mha_gap": {
            "relative_field_difference_start_end": r.field_gaps,
            "w2_final": r.gap.final_w2,
            "largest_token_angle_degrees": r.gap.largest_angle,
        },
    }


def _ou_texts(r: _OuRun) -> tuple[str, str, str, str]:
    """The windows' texts the rows print: ``(short, sshort, swin_text, ctrl_name)``."""

    short = "" if r.window.ok else f" (the window is only {r.window.length_taus:.2g} relaxation times long)"
    sshort = (
        "" if r.swin.ok else f" (the window is only {r.swin.length_taus:.2g} of the slow time {fmt(r.swin.tau)} long)"
    )
    swin_text = (
        f"t in [{r.swin.start:.3g}, {r.swin.end:.3g}] (from {WINDOW_TAUS:g} x (tau + 1/g), tau = {fmt(r.fin.tau)}, "
        f"1/g = {fmt(r.fin.tau_slow)}"
        + (" (the antipodal pair's slowest mode)" if r.fin.tau_slow > r.length.tau_slow * (1 + 1e-12) else "")
        + ")"
        + (
            ""
            if len(r.sq["stages"]) == 1
            else f", look {len(r.sq['stages'])}: both runs continued to T = {r.fin.T:g} while undecided ("
            + undecided_looks(r.sq["stages"])
            + ")"
        )
    )
    g_c = 1.0 / r.length.tau_slow
    ctrl_name = (
        f"the same OU law (its own noise) turned at Omega = g/4 = {fmt(r.sq['turn'])} (g = {fmt(g_c)}) in the plane of "
        "the means' two leading axes, R_t Theta_t R_t^T: its stationary point keeps turning at a pace the cluster "
        f"follows ({fmt(r.turned)} rad over the window); same cloud, judged like the OU run"
    )
    return short, sshort, swin_text, ctrl_name


def _ou_row_1(r: _OuRun, short: str, sshort: str, swin_text: str) -> Prediction:
    """Row 1: stationarity for ``Theta_inf``, by position where the linear response applies, else by slope."""
    why_model = _WHY_MODEL

    in_s_H = lambda v: f" = {fmt(v / r.s_H)} s_H" if r.fs.applies else ""
    claim_1 = (
        "OU weights: the cloud relaxes to a stationary point of the limiting energy F(., Theta_inf) "
        "(anisotropic law: stationary points are isolated), up to the heads' finite-H fluctuation"
    )
    if r.pos:
        w = r.fs_pos.wander_total
        row_1 = Prediction(
            "ou",
            claim_1,
            f"rms over {swin_text} of D(mu_t, x*) = {fmt(r.pos['late'])} w_follow (D: each token's angle to its "
            f"cluster's rest point x* of F(., Theta_inf), rms over the tokens; w_follow = {fmt(w)} rad = "
            f"{math.degrees(w):.3g} degrees, the distance {'a single cluster' if r.fs_pos.single else 'an antipodal pair'} following its heads keeps from it by linear "
            f"response; the final cloud's centre {r.fs_pos.angle:.3g} degrees from x*). For reference, the slope "
            f"|dF|(mu_t, Theta_inf) over {r.win}: {fmt(r.st_inf)} {r.scale_name}{sshort}",
            f"<= {FLOOR_FACTOR:g} w_follow = {fmt(FLOOR_FACTOR * w)} rad (w_follow^2 = sum over modes of "
            "E[phi_m^2] / (g_m (g_m + r)), FollowingScale.wander_total)",
            bool(r.pos["late"] <= FLOOR_FACTOR) and r.swin.ok,
            f"the same run before it relaxed, t in [0, {r.traj.t[r.pidx[-1]]:.3g}] ({POSITION_CONTROL_TAUS:g} tau, tau = "
            f"{fmt(r.window.tau)}), against the same rest configuration",
            f"{fmt(r.pos['transient'])} w_follow (t = 0: {fmt(r.pos['start'])} w_follow; the slope test's transient, "
            f"for reference: {fmt(r.st_tr)} {r.scale_name})",
            not bool(r.pos["transient"] <= FLOOR_FACTOR),
            margin=margin_below(r.pos["late"], FLOOR_FACTOR),
            control_margin=margin_above(r.pos["transient"], FLOOR_FACTOR),
            model="gf",
            model_reason=why_model,
        )
    else:
        row_1 = Prediction(
            "ou",
            claim_1,
            f"rms over {r.win} of |dF|(mu_t, Theta_inf) = {fmt(r.st_inf)} {r.scale_name}{in_s_H(r.rms_inf)} "
            f"(t = 0: {fmt(float(r.slope_inf[0]) / r.scale)} {r.scale_name}); {r.fs.describe()}{short}",
            f"<= {FLOOR_FACTOR:g} {r.scale_name} = {fmt(FLOOR_FACTOR * r.scale)} ("
            + (
                f"s_follow: the slope a settled {'cluster' if r.fs.single else 'antipodal pair of clusters'} following "
                "its fluctuating heads shows for the limit law, sum over modes of E[f_m^2] g_m / (g_m + r); "
                f"{fmt(r.scale / r.s_H)} of the floor scale s_H)"
                if r.fs.applies
                else "s_H: the finite-H slope scale at the final cloud, measured; neither one cluster nor an "
                "antipodal pair)"
            ),
            bool(r.st_inf <= FLOOR_FACTOR) and r.window.ok,
            f"the same run's transient t in [0, {r.traj.t[r.tidx[-1]]:.3g}] ({WINDOW_TAUS:g} tau: the cloud before it "
            "relaxed) against the same law Theta_inf",
            f"{fmt(r.st_tr)} {r.scale_name}{in_s_H(r.rms_tr)} (the late states against the t = 0 law Theta_0, "
            f"for reference: {fmt(r.st_0)} {r.scale_name})",
            not bool(r.st_tr <= FLOOR_FACTOR),
            margin=margin_below(r.st_inf, FLOOR_FACTOR),
            control_margin=margin_above(r.st_tr, FLOOR_FACTOR),
            model="gf",
            model_reason=why_model,
        )
    return row_1


def _ou_predictions(r: _OuRun) -> list[Prediction]:
    """``ou``'s three rows, each with its control."""
    why_model = _WHY_MODEL
    short, sshort, swin_text, ctrl_name = _ou_texts(r)
    row_1 = _ou_row_1(r, short, sshort, swin_text)

    preds = [
        row_1,
        Prediction(
            "ou",
            "OU weights: the cloud settles (W2(mu_t, mu_T) over the late window stays within the finite-H wander)",
            f"over {swin_text}: {r.s_ou.text()}{sshort}",
            f"< 1 x bound (the bound: {SETTLED_FRACTION:g} of the run's own displacement + {WANDER_FACTOR:g} x the "
            f"wander between {WANDER_REPLICAS} independent noise replicas from the window's start)",
            bool(r.s_ou.ratio < 1.0) and r.swin.ok,
            ctrl_name,
            f"{fmt(r.s_ctrl.ratio)} x bound (the drawn oscillating run, for reference: {fmt(r.s_osc.ratio)} x bound)",
            not bool(r.s_ctrl.ratio < 1.0),
            margin=margin_below(r.s_ou.ratio, 1.0),
            control_margin=margin_above(r.s_ctrl.ratio, 1.0),
            model="gf",
            model_reason=why_model,
        ),
        Prediction(
            "ou",
            "OU weights: the slope |dF|(mu_t, Theta_t) decays to its finite-H floor",
            f"rms slope over t in [{r.fl.runs['ou'].window[0]:.3g}, {r.fl.runs['ou'].window[1]:.3g}] = "
            f"{fmt(r.fl.runs['ou'].rms)} = {fmt(r.fl.runs['ou'].ratio)} s_H (floor scale s_H = {fmt(r.fl.scale)}){short}",
            f"<= {FLOOR_FACTOR:g} s_H",
            bool(r.fl.runs["ou"].ratio <= FLOOR_FACTOR) and r.window.ok,
            "the oscillating run (same cloud and means, non-integrable weights)",
            f"{fmt(r.fl.runs['oscillating'].ratio)} s_H",
            not bool(r.fl.runs["oscillating"].ratio <= FLOOR_FACTOR),
            margin=margin_below(r.fl.runs["ou"].ratio, FLOOR_FACTOR),
            control_margin=margin_above(r.fl.runs["oscillating"].ratio, FLOOR_FACTOR),
            model="gf",
            model_reason=why_model,
        ),
    ]
    return preds


def _ou_explain(r: _OuRun, preds: list[Prediction]) -> None:
    """Each failed row's explanation, from its numbers."""

    # The control's power: how far the t = 0 law's mean is from the limit's, relative to the limit's mean.
    shift = float(np.linalg.norm(r.ou.A0.mean(0) - r.ou.A_bar.mean(0)) / np.linalg.norm(r.ou.A_bar.mean(0)))
    stat_note = (
        SEE_FIGURES + f" The stationarity row compares the cloud with the limit law on the scale {r.scale_name} "
        f"({r.fs.describe()})."
        if r.st_tr > FLOOR_FACTOR * (1 + MIN_MARGIN)
        else (
            f"Control without power at this set: before it relaxed the cloud's slope for the limit law was only "
            f"{fmt(r.st_tr)} {r.scale_name} in rms (t = 0: {fmt(float(r.slope_inf[0]) / r.scale)} {r.scale_name}), against "
            f"{FLOOR_FACTOR:g} {r.scale_name}: the heads' finite-H fluctuation ({r.fs.describe()}) is as large as the "
            "cloud's whole motion, so relaxation to a stationary point of the limit law cannot be told from the "
            "floor at this H and noise." + _wander_note(r.fs)
        )
    )
    if r.st_0 <= FLOOR_FACTOR * (1 + MIN_MARGIN):
        stat_note += (
            f" (The t = 0 law cannot be told from the limit law either: its mean is only {fmt(shift)} of the "
            f"limit's mean away from it, the heads start {r.params.ou.init_spread} x GOE from their means and "
            f"their average moves by about that over sqrt({r.ou.H}): {fmt(r.st_0)} {r.scale_name} on the late states.)"
        )
    settle_note = _settle_note(r.params, r.sq, r.fl.runs["ou"].ratio)
    notes = [
        (_position_note(r.pos, r.fs_pos) if r.swin.ok else length_note(r.sq["length"], r.swin)) if r.pos else stat_note,
        settle_note,
        floor_note(r.fl),
    ]
    for i, (p, note) in enumerate(zip(preds, notes)):
        if not p.ok:
            # A window too short for the run's relaxation time is the reason, whatever the numbers say (rows judged
            # on the settling window say so themselves).
            note = note if i == 1 or (i == 0 and r.pos) or r.window.ok else length_note(r.length, r.window)
            p.explanation = (note + " " + p.explanation).strip()


def _ou_result(r: _OuRun, headline: dict[str, Any], preds: list[Prediction]) -> ExperimentResult:
    """The result with its figures and notes."""

    return ExperimentResult(
        "ou",
        headline,
        preds,
        figures={
            "snapshots": figure_snapshots({"ou": r.traj}, "OU weights around an anisotropic mean: the cloud relaxes"),
            "stationarity": figure_ou(
                r.traj,
                r.slope_inf / r.scale,
                r.slope_0 / r.scale,
                r.idx,
                (r.o2.t[r.sidx], r.w2_ou, r.s_ou),
                (r.c2.t[r.sidx_c], r.w2_c, r.s_ctrl, f"control (turned at {fmt(r.sq['turn'])})"),
                r.osc,
                r.fl,
                (r.scale_name, r.s_H / r.scale),
                (r.o2.t, r.pos["series"], r.swin.start, float(r.traj.t[r.pidx[-1]])) if r.pos else None,
            ),
        },
        configs=[],
        dataset=trajectory_to_dataset(r.traj),
        parameters=r.params.to_dict(),
        notes=[
            f"Limiting law Theta_inf = (1/H) sum_h N(Abar_h, c^2), c = sigma / sqrt(2 rate) = {fmt(r.law_inf.c)}; "
            f"Abar_h = diag{tuple(r.params.heads.spectrum)} + {r.params.heads.variety} x GOE_h. "
            f"The late window starts {WINDOW_TAUS:g} relaxation times tau into the run (tau = {fmt(r.window.tau)}: the "
            "OU run's energy reaches 1/e of its initial distance to its late level), never before T/2; the settling "
            f"window starts {WINDOW_TAUS:g} x (tau + 1/g), 1/g the cluster's slow mode (slow_rate). Run length: "
            f"{r.length.describe()}.",
            HYPOTHESES["ou"],
            f"Model: gf, because the theory's statements are proven for the gradient flow. The gap to real multi-head "
            f"attention (mha) with the same heads, measured: relative field difference {fmt(r.field_gaps[0])} at t = 0 "
            f"and {fmt(r.field_gaps[1])} at t = T (attnflow.analysis.model_gap.field_gap); W2 between the gf and mha "
            f"clouds at t_end {fmt(r.gap.final_w2)}, largest angle between a token's two positions "
            f"{r.gap.largest_angle:.3g} "
            "degrees (trajectory_gap).",
            RUNS_NOTE,
        ],
    )


def experiment_ou(cfg: ParamsLike, *, seed: int = 0, progress: Progress | None = None) -> ExperimentResult:
    """OU weights: relaxation to a stationary point of the limiting energy (with its own transient as control)."""
    start = time.perf_counter()
    r = _measure_ou(relaxation_params(cfg), seed, progress)
    headline = _ou_headline(r)
    preds = _ou_predictions(r)
    _ou_explain(r, preds)
    res = _ou_result(r, headline, preds)
    if progress:
        progress(2, 2, "done")
    res.seconds = time.perf_counter() - start
    return res
