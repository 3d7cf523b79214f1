"""``ou``'s row #2 (the cloud settles), sequential (:func:`settle_row`).

Its control is the same OU law turned at ``g / 4`` in the plane of the means' two leading axes
(:func:`control_process`, a stationary point that keeps moving at a pace the cluster can follow), and an
undecided look continues both runs and judges them again on a later window (:data:`SETTLE_CONTINUATIONS`,
:data:`SETTLE_CAP_FACTOR`); the other rows keep the runs of :mod:`attnflow.experiments.relax_runs`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import numpy as np

from attnflow.analysis.relaxation import (
    MIN_WINDOW_TAUS,
    Settling,
    Window,
    pair_slow_time,
    relaxation_time,
    settling,
    settling_window,
)
from attnflow.config import defaults
from attnflow.experiments.common import fmt
from attnflow.experiments.relax_runs import (
    ParamsLike,
    RelaxIntegration,
    RunLength,
    continue_ou,
    continued,
    pair_start,
    params_key,
    relaxation_params,
    run_seeds,
    segment_seed,
    settle_wander,
)
from attnflow.solve.simulation import simulate
from attnflow.verdicts.margins import MIN_MARGIN, margin_above, margin_below
from attnflow.weights.processes import OrnsteinUhlenbeck, Rotated

#: Row #2 (the cloud settles) is sequential: while it is undecided (:func:`_undecided`) both of its runs, the OU run
#: and its control, continue and are judged again at the new settling window, at most this many times (stated
#: before the confirming runs; each look is on a later, disjoint window with fresh replicas).
SETTLE_CONTINUATIONS = 2
#: The continuation's run length is capped at this multiple of the run-length cap (``max_extension x t_end``): a
#: compute budget paid only by undecided sets (it lets a slow mode with ``4/g`` up to four times the cap be chased,
#: or a late merge whose energy relaxes over ``tau ~ 80`` at the ``--quick`` sizes). 2 until 2026-12-02 11:25: at
#: ``--seed 8`` sets 9 and 11 (``tau = 37``, ``1/g = 63``) and ``--seed 7`` set 19 (a two-cluster state that
#: merged at ``t ~ 100``) the run needed ``T ~ 255-370`` and was reported inconclusive.
SETTLE_CAP_FACTOR = 4.0
#: Row #2's control turns the OU law at this fraction of the slowest rate ``g`` (:func:`control_turn`).
CONTROL_TURN_FRACTION = 0.25


def control_turn(g: float) -> float:
    """``Omega = g / 4``: the pace at which row #2's control turns the OU law. A drift of rate ``g`` holds a point
    that turns at ``Omega`` with a lag of about ``Omega / g`` (linear response); the gradient of a well of curvature
    ``g`` is at most about ``g / 2`` (``(g/4) sin 2 theta`` along the slow axis of ``x^T A x``), so at ``g / 4`` the
    cluster keeps up, a quarter turn of ``theta`` behind (``sin 2 theta = 1/2``), rather than slipping and
    averaging the turn. Over a settling window of length ``L >= 1/g`` it moves by ``Omega L >= 1/4`` rad, and the
    motion grows with the window (an undecided look that continues the run gives the control more power; a swing's
    stays bounded by its amplitude)."""
    return CONTROL_TURN_FRACTION * float(g)


def control_plane(A_bar: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The two leading eigenvectors ``(u, v)`` of the heads' average mean ``(1/H) sum_h Abar_h``: the plane in which
    row #2's control turns (a cluster rests near ``u`` and relaxes slowest towards ``v``; an antipodal pair turns
    rigidly; on the circle it is the whole plane)."""
    M = np.asarray(A_bar, dtype=np.float64).mean(axis=0)
    _, vecs = np.linalg.eigh(0.5 * (M + M.T))
    return vecs[:, -1].copy(), vecs[:, -2].copy()


def control_process(ou: OrnsteinUhlenbeck, turn: float, seed: int, A0: np.ndarray | None = None, t0: float = 0.0):
    """Row #2's control, ``R_t Theta_t R_t^T``: the OU law of ``ou`` (same means, rate and noise level; its own
    noise ``seed``; from ``A0``, default ``ou``'s start) turned at ``turn`` in :func:`control_plane`, the angle
    counted from the absolute time ``t0`` of the segment's start (a :class:`~attnflow.weights.Rotated` process).
    Its stationary points turn rigidly (the ``gf`` field is equivariant): weights whose path never ends."""
    u, v = control_plane(ou.A_bar)
    inner = OrnsteinUhlenbeck(ou.A_bar, ou.rate, ou.sigma, A0=ou.A0 if A0 is None else A0, seed=seed)
    return Rotated(inner, u, v, turn, t0)


def _continue_turned(o, c, ou: OrnsteinUhlenbeck, proc_c: Rotated, add: float, it: RelaxIntegration, seeds):
    """The OU run ``o`` and the turned control ``c`` (ending at the same time ``T``) continued by ``add``, each with
    fresh noise from its last heads (Markov continuations; the control's heads unturned by ``R_T``, then turned on
    from ``T``)."""
    T = float(o.t[-1])
    R = proc_c.rotation(T - proc_c.t0)
    c_next = control_process(ou, proc_c.rate, seeds[1], A0=np.einsum("ji,hjk,kl->hil", R, c.A[-1], R), t0=T)
    return continue_ou(o, ou, add, it, seeds[0]), continued(c, c_next, add, it, seeds[1])


@dataclasses.dataclass(frozen=True)
class SettleStage:
    """One look of row #2: the OU run and its control up to ``T``, judged over the settling ``window`` (in units of
    ``tau`` and ``tau_slow``, the slowest mode of the state the run ends in) with the finite-``H`` wander ``wander``
    of replicas started at ``replicas_from``; ``clusters`` and ``antipodal`` describe the OU run's final cloud,
    ``undecided`` says why the row continued ('' once decided, or at the last look)."""

    T: float
    tau: float
    tau_slow: float
    window: Window
    replicas_from: float
    replicas: np.ndarray
    wander: float
    ou: Settling
    control: Settling
    clusters: int
    antipodal: bool
    undecided: str = ""

    def summary(self) -> dict[str, Any]:
        return {
            "T": self.T,
            "tau": self.tau,
            "tau_slow": self.tau_slow,
            "window": [self.window.start, self.window.end],
            "window_ok": self.window.ok,
            "replicas_from": self.replicas_from,
            "wander": self.wander,
            "ou_over_bound": self.ou.ratio,
            "control_over_bound": self.control.ratio,
            "clusters_end": self.clusters,
            "antipodal": self.antipodal,
            "undecided": self.undecided,
        }


def _undecided(stage: SettleStage) -> str:
    """Why row #2 cannot decide at this look ('' when it can): the window is too short; the OU run or the control
    lies within ``MIN_MARGIN`` of the bound; or the OU run fails while its final cloud is several clusters other
    than an antipodal pair (a saddle it may still leave, or merge from: not a settled state, not yet a drift)."""
    if not stage.window.ok:
        return (
            f"the settling window holds {stage.window.length_taus:.2g} of max(tau, 1/g) (at least {MIN_WINDOW_TAUS:g})"
        )
    r_ou, r_c = stage.ou.ratio, stage.control.ratio
    if abs(margin_below(r_ou, 1.0)) < MIN_MARGIN:
        return f"the OU run at {fmt(r_ou)} x bound, within the minimum margin {MIN_MARGIN:g} of it"
    if r_ou >= 1.0 and stage.clusters > 1 and not stage.antipodal:
        return f"the OU run at {fmt(r_ou)} x bound ends in {stage.clusters} clusters, not an antipodal pair (a saddle)"
    if margin_above(r_c, 1.0) < MIN_MARGIN:
        # The turned control moves by about Omega L: a longer window gives it more power (not so a swing).
        return (
            f"the control at {fmt(r_c)} x bound, not above it by the minimum margin {MIN_MARGIN:g} (it turns: a longer "
            "window holds more of its motion)"
        )
    return ""


def _end_state(o, ou: OrnsteinUhlenbeck, tau_slow: float) -> tuple[int, bool, float]:
    """The OU run's final cloud for row #2: its cluster count, whether it is an antipodal pair, and the slow time
    of its window, the slower of ``tau_slow`` (the single cluster's ``1/g``) and an antipodal pair's slowest mode.
    An antipodal pair is what rows 1 and 3 call one (:func:`following_scale`): two clusters from whose centres Newton
    reaches a rest pair of ``Theta_inf``, antipodal within :data:`ANTIPODAL_TOL`, all of whose modes relax (the
    cloud's own centres sit off it by the heads' noise)."""
    clusters = int(o.diagnostics["clusters"][-1])
    pair = pair_slow_time(o.x[-1], ou) if clusters == 2 else 0.0
    return clusters, pair > 0.0, max(tau_slow, pair)


def undecided_looks(stages: list[SettleStage]) -> str:
    """Row #2's earlier looks and why each continued: ``T = ...: <reason>; ...``."""
    return "; ".join(f"T = {st.T:g}: {st.undecided}" for st in stages[:-1])


def _stage(o, c, ou: OrnsteinUhlenbeck, end: tuple[int, bool, float], dt: float, seed: int) -> SettleStage:
    """Row #2 judged on the OU run ``o`` and its control ``c`` (same end time) at their current length, ``end`` the
    OU run's :func:`_end_state`."""
    tau = relaxation_time(o.t, o.diagnostics["energy"])
    clusters, antipodal, slow = end
    win = settling_window(o.t, tau, slow)
    t_from, reps, w = settle_wander(o, ou, win, dt, seed)
    return SettleStage(
        float(o.t[-1]), tau, slow, win, t_from, reps, w, settling(o, win.start, w), settling(c, win.start, w),
        clusters, antipodal,
    )  # fmt: skip


@functools.lru_cache(maxsize=2)
def _settle_row_cached(cfg_yaml: str, seed: int) -> dict[str, Any]:
    _, trajs, procs, length, st, it = pair_start(cfg_yaml, seed)
    dt, spacing = it.dt, it.dt * it.save_every
    ou = procs["ou"]
    o = trajs["ou"]
    turn = control_turn(1.0 / length.tau_slow)
    s_noise = run_seeds(seed)[5]
    # The control: the same OU law (its own noise) turned at g/4, from the same cloud, to the same T.
    s_ctrl = segment_seed(s_noise, 700)
    proc_c = control_process(ou, turn, s_ctrl)
    c = simulate(
        o.x[0], proc_c, model="gf", t_end=float(o.t[-1]), dt=dt, method=defaults.METHOD, save_every=it.save_every,
        seed=s_ctrl,
    )  # fmt: skip
    # Look 0: the runs every other row uses, with the window and replicas of settled_runs (the same numbers), unless the
    # run ends in an antipodal pair whose slowest mode is slower than the single cluster's (then its own window).
    end = _end_state(o, ou, length.tau_slow)
    clusters, antipodal, slow = end
    stages = [
        _stage(o, c, ou, end, dt, s_noise + 4)
        if slow > length.tau_slow
        else SettleStage(
            float(o.t[-1]),
            length.tau,
            length.tau_slow,
            st.window,
            st.replicas_from,
            st.replicas,
            st.wander,
            st.ou,
            settling(c, st.window.start, st.wander),
            clusters,
            antipodal,
        )  # fmt: skip
    ]
    cap = SETTLE_CAP_FACTOR * length.cap
    for k in range(1, SETTLE_CONTINUATIONS + 1):
        why = _undecided(stages[-1])
        T = stages[-1].T
        need = RunLength(length.base, T, cap, stages[-1].tau, stages[-1].tau_slow).needed
        if not why or T >= cap - 1e-9 or need > cap + 1e-9 or not math.isfinite(need):
            break
        stages[-1] = dataclasses.replace(stages[-1], undecided=why)
        # Doubled, or on to what the window needs (a slow mode), 25% beyond it as simulate_pair; up to the cap.
        target = min(cap, max(2.0 * T, 1.25 * need))
        add = math.ceil(round((target - T) / spacing, 6)) * spacing
        o, c = _continue_turned(
            o, c, ou, proc_c, add, it, (segment_seed(s_noise, 500 + k), segment_seed(s_noise, 700 + k))
        )
        stages.append(_stage(o, c, ou, _end_state(o, ou, length.tau_slow), dt, s_noise + 4 + 10 * k))
    final = stages[-1]
    return {
        "stages": stages,
        "final": final,
        "turn": turn,
        "plane": (proc_c.u, proc_c.v),
        # Row 2's cap is the continuation's: a slow mode beyond it was not chased.
        "length": RunLength(length.base, final.T, cap, final.tau, final.tau_slow),
        "ou_traj": o,
        "control_traj": c,
    }


def settle_row(cfg: ParamsLike, seed: int) -> dict[str, Any]:
    """Row #2 of ``ou`` (the cloud settles), sequential: ``{"stages": [SettleStage, ...], "final", "turn",
    "plane", "length", "ou_traj", "control_traj"}``. The control is the OU law turned at :func:`control_turn` in
    :func:`control_plane` (:func:`control_process`); while the row is undecided (:func:`_undecided`)
    both runs continue (T doubled, or to what a slow mode's window needs; at most :data:`SETTLE_CONTINUATIONS` times,
    up to :data:`SETTLE_CAP_FACTOR` x the run-length cap) and are judged again at the new window with fresh
    replicas; the verdict is the last look's."""
    return _settle_row_cached(params_key(relaxation_params(cfg)), seed)
