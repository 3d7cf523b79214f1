"""``attnflow reproduce oscillating``: non-integrable weights, no relaxation; OU weights as the contrast.

The runs are those of :mod:`attnflow.experiments.relax_runs` (shared with ``ou``). The law's path length
``int |Theta'_t| dt`` is measured from samples (:func:`attnflow.analysis.laws.law_path_length`); the finite-``H``
heads' path is Brownian (:func:`finite_h_path_length`); the slope stays above the finite-``H`` floor.

The no-relaxation row is phase-resolved (:func:`lockin_pair`): the cloud's component at the weights' frequency
``omega`` over the settling window (continued to :data:`~attnflow.analysis.lockin.LOCKIN_PERIODS` periods, and
while undecided to 2x and 4x that, :func:`attnflow.analysis.lockin.sequential_lockin`), against its error from
the fit's correlated residuals, with the OU run as the control.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from attnflow.analysis.laws import bures_wasserstein, law_path_length, length_at, sym_vec
from attnflow.analysis.lockin import (
    LOCKIN_MAX_PERIODS,
    LOCKIN_PERIODS,
    LOCKIN_Z,
    LockIn,
    amplitude_over,
    empty_window,
    lockin_decides,
    lockin_fit,
    lockin_margins,
    lockin_scales,
    position_decides,
    position_margins,
    sequential_lockin,
)
from attnflow.analysis.lockin import design as lockin_design
from attnflow.analysis.relaxation import Settling, Window
from attnflow.core.errors import InputError
from attnflow.core.trajectory import Trajectory
from attnflow.experiments.common import ExperimentResult, Prediction, Progress, fmt
from attnflow.experiments.relax_figures import figure_lockin, figure_osc, figure_snapshots
from attnflow.experiments.relax_runs import (
    FLOOR_FACTOR,
    HYPOTHESES,
    RUNS_NOTE,
    SEE_FIGURES,
    LockInPair,
    PairSettling,
    ParamsLike,
    RelaxationParams,
    RunLength,
    SlopeFloor,
    continue_both,
    floor_keys,
    floor_note,
    length_note,
    pair_runs,
    pair_start,
    params_key,
    relaxation_params,
    run_length,
    run_seeds,
    run_window,
    segment_seed,
    settled_runs,
    slope_floor,
)
from attnflow.io.store import trajectory_to_dataset
from attnflow.verdicts.margins import margin_above, margin_below, margin_inside
from attnflow.weights.processes import OrnsteinUhlenbeck

#: Integrable: the last doubling of t_end adds less than this fraction of the path length.
CONVERGED_FRACTION = 0.1
#: Linear growth: doubling t_end multiplies the path length by a factor within this interval.
LINEAR_RANGE = (1.8, 2.2)
#: Brownian roughness: quartering the step doubles a Brownian path's length (exponent -1/2 in the
#: step); the local exponent of length against step must lie in this interval. The steps are
#: fractions of the heads' own correlation time ``1/rate`` (:data:`ROUGH_STEPS`), where the OU path
#: is Brownian.
ROUGH_EXPONENT = (-0.6, -0.4)
ROUGH_STEPS = (0.1, 0.025, 0.00625)


def finite_h_path_length(ou: OrnsteinUhlenbeck, t_ends: list[float], seed: int) -> dict[str, Any]:
    """The path length of the ``H`` heads' empirical measure, ``sum_k (1/H sum_h |A_h(t_{k+1}) - A_h(t_k)|_F^2)^{1/2}``
    (heads kept by label, an upper bound of ``W_2`` between the measures), on grids of step
    :data:`ROUGH_STEPS` ``/ rate`` up to ``T = max(t_ends)``, all from one exact path on the finest grid;
    and the H = infinity law's length on the same grids (Bures-Wasserstein between its exact moments).

    A Brownian path's length grows like ``step^(-1/2)`` and linearly in ``T``; an integrable law's does
    neither. Returns lengths, local exponents against the step, the growth factor from the second
    largest ``t_end`` to ``T``, and the margins of :data:`ROUGH_EXPONENT` and :data:`LINEAR_RANGE`.
    """
    ts = sorted(float(v) for v in t_ends)
    T, T_half = ts[-1], ts[-2]
    steps = [f / ou.rate for f in ROUGH_STEPS]
    fine = steps[-1]
    times = np.arange(int(round(T / fine)) + 1) * fine
    path = ou.path(times.tolist(), seed=seed)

    def labelled(sub: np.ndarray) -> np.ndarray:
        return np.sqrt(((np.diff(sub, axis=0)) ** 2).sum(axis=(2, 3)).mean(axis=1))

    def law(grid: np.ndarray) -> np.ndarray:
        dim = ou.d * (ou.d + 1) // 2
        mom = []
        for t in grid:
            means = sym_vec(ou.mean(float(t)))
            c = ou.transition_scale(float(t)) if t > 0 else 0.0
            mom.append((means.mean(0), np.cov(means, rowvar=False, bias=True) + c * c * np.eye(dim)))
        return np.array([bures_wasserstein(*mom[k], *mom[k + 1]) for k in range(len(mom) - 1)])

    lengths, law_lengths = [], []
    for h in steps:
        k = max(1, int(round(h / fine)))
        lengths.append(float(labelled(path[::k]).sum()))
        law_lengths.append(float(law(times[::k]).sum()))
    inc = np.concatenate([[0.0], np.cumsum(labelled(path))])
    growth = float(inc[-1] / np.interp(T_half, times, inc))
    law_inc = np.concatenate([[0.0], np.cumsum(law(times[:: max(1, int(round(steps[0] / fine)))]))])
    coarse = times[:: max(1, int(round(steps[0] / fine)))]
    law_growth = float(law_inc[-1] / np.interp(T_half, coarse, law_inc))
    lo, hi = ROUGH_EXPONENT
    exps = [math.log(lengths[i + 1] / lengths[i]) / math.log(steps[i + 1] / steps[i]) for i in range(len(steps) - 1)]
    law_exps = [
        math.log(law_lengths[i + 1] / law_lengths[i]) / math.log(steps[i + 1] / steps[i]) for i in range(len(steps) - 1)
    ]
    return {
        "H": ou.H,
        "T": T,
        "steps": steps,
        "length": lengths,
        "law_length": law_lengths,
        "exponents": exps,
        "law_exponents": law_exps,
        "growth_T": growth,
        "law_growth_T": law_growth,
        "margins": [margin_inside(e, lo, hi) for e in exps] + [margin_inside(growth, *LINEAR_RANGE)],
        "law_margins": [margin_inside(e, lo, hi) for e in law_exps] + [margin_inside(law_growth, *LINEAR_RANGE)],
    }


def _lockin_of(tr, start: float, omega: float) -> LockIn:
    """The lock-in fit of every token's coordinates of ``tr`` over ``t >= start``, each weighted by the token's mass:
    no cluster labels needed (clusters merge and relabel); a cluster's tokens share its forced motion, and each
    cluster counts by its mass."""
    idx = np.flatnonzero(tr.t >= start - 1e-12)
    d = tr.x.shape[2]
    return lockin_fit(tr.t[idx], tr.x[idx].reshape(len(idx), -1), omega, np.repeat(tr.token_weights, d))


@functools.lru_cache(maxsize=2)
def _lockin_cached(cfg_yaml: str, seed: int) -> LockInPair:
    params, trajs, procs, length, st, it = pair_start(cfg_yaml, seed)
    omega = float(params.oscillating.omega)
    runs = {"ou": trajs["ou"], "oscillating": trajs["oscillating"]}
    T0, start = float(runs["ou"].t[-1]), float(st.window.start)
    spacing = it.dt * it.save_every
    # From the first saved time in the window (the window's start need not be on the save grid).
    o = runs["ou"]
    first = float(o.t[np.flatnonzero(o.t >= start - 1e-12)[0]]) if start <= T0 + 1e-12 else start
    segments = [0]

    def fit(periods: float) -> tuple[LockIn, LockIn] | None:
        o, c = runs["ou"], runs["oscillating"]
        T = float(o.t[-1])
        need = first + periods * 2.0 * math.pi / omega
        add = math.ceil((need - T) / spacing - 1e-9) * spacing if need > T + 1e-9 else 0.0
        if periods > LOCKIN_PERIODS * (1.0 + 1e-9):
            # A further look: never beyond the run-length cap, and only if its window is longer than the last one's.
            add = min(add, math.floor((length.cap - T) / spacing + 1e-9) * spacing)
            if add <= 0:
                return None
        if add > 0:
            # Continued as simulate_pair extends the runs, only for this row: the other rows keep the runs they
            # were measured on.
            o, c = continue_both(
                o, c, procs["ou"], procs["oscillating"], add, it, segment_seed(run_seeds(seed)[5], 900 + segments[0])
            )
            segments[0] += 1
            runs.update(ou=o, oscillating=c)
        return _lockin_of(c, start, omega), _lockin_of(o, start, omega)

    decided = position_decides(st.oscillating, st.ou, st.window)
    looks = sequential_lockin(fit, decided)
    fits = dict(zip(("oscillating", "ou"), looks[-1]))  # the last look's fits, by run
    series = {}
    for name, tr in runs.items():
        # For the figure: the coordinate that swings most, without its fitted constant and drift, and its sinusoid.
        idx = np.flatnonzero(tr.t >= start - 1e-12)
        y = tr.x[idx].reshape(len(idx), -1)
        f = fits[name]
        j = int(np.argmax(f.a**2 + f.b**2))
        X = lockin_design(tr.t[idx], omega)
        coef = np.linalg.lstsq(X, y[:, j], rcond=None)[0]
        series[name] = (tr.t[idx], y[:, j] - X[:, :2] @ coef[:2], X[:, 2:] @ coef[2:])
    T = float(runs["ou"].t[-1])
    return LockInPair((start, T), T - T0, series, looks, *looks[-1])


def lockin_pair(cfg: ParamsLike, seed: int) -> LockInPair:
    """The lock-in fits (:func:`attnflow.experiments.lockin.lockin_fit`) of the OU and the oscillating run at the
    oscillating weights' ``omega`` over ``[settling window start, T']``, ``T' >= T`` long enough to hold
    :data:`LOCKIN_PERIODS` periods, or up to :data:`LOCKIN_MAX_PERIODS` while row #5 is undecided
    (:func:`sequential_lockin`; both runs continued for it): a :class:`~attnflow.experiments.relax_runs.LockInPair`."""
    return _lockin_cached(params_key(relaxation_params(cfg)), seed)


def _looks_text(lk: LockInPair) -> str:
    """The sequential lock-in's looks: how many, their periods and ``A / s``."""
    looks = lk.looks
    zs = ", ".join(
        f"{osc.periods:.3g} periods: {amplitude_over(osc.amplitude, lockin_scales(osc, ou)[0]):.3g} s"
        for osc, ou in looks
    )
    return f"{len(looks)} look{'s' if len(looks) > 1 else ''} of at most {LOCKIN_MAX_PERIODS:g} periods ({zs})"


def _position_text(s_osc: Settling, swin: Window) -> str:
    if empty_window(swin):
        return (
            f"no position test: the settling window [{swin.start:.4g}, {swin.end:.4g}] is empty (the run ends where "
            "the window of its slow mode would start): inconclusive"
        )
    short = "" if swin.ok else " (window shorter than its relaxation times: inconclusive)"
    return f"position over t in [{swin.start:.3g}, {swin.end:.3g}]: {s_osc.text()}{short}"


def _lockin_note(lk: LockInPair, g: float, omega: float, position: Settling, swin: Window) -> str:
    """Why row #5 (or its control) failed, from the lock-in numbers."""
    osc, ou = lk.oscillating, lk.ou
    scale, scale_ou = lockin_scales(osc, ou)
    if osc.periods < LOCKIN_PERIODS * (1.0 - 1e-6):
        return (
            f"Window too short: the lock-in window [{lk.window[0]:.4g}, {lk.window[1]:.4g}] holds "
            f"{osc.periods:.4g} periods of omega = {fmt(omega)}, fewer than {LOCKIN_PERIODS:g}. Inconclusive, counted "
            "as a FAIL."
        )
    if ou.amplitude > LOCKIN_Z * scale_ou:
        return (
            f"Control not rejected: the OU run has a component at omega of {ou.amplitude / scale_ou:.3g} SE "
            f"({ou.text()}; {_looks_text(lk)}); nothing in OU weights is locked to omega, so its error estimate is too "
            "small here (residuals correlated beyond the window) or its slow motion projects onto the sinusoid."
        )
    return (
        f"No motion locked to omega: the oscillating cloud's amplitude at omega = {fmt(omega)} is "
        f"{amplitude_over(osc.amplitude, scale):.3g} noise scales ({osc.text()}; {_looks_text(lk)}); with the cluster's slow "
        f"rate g = {fmt(g)} its forced swing is about g / sqrt(g^2 + omega^2) = {g / math.hypot(g, omega):.2g} of the "
        f"resting point's, which the weights' amplitude sets ({_position_text(position, swin)})."
    )


def _no_relaxation_row(
    lk: LockInPair, omega: float, g: float, s_osc: Settling, s_ou: Settling, swin: Window
) -> Prediction:
    """Row #5, either of two tests, each with its own control (stated with both; a false PASS needs one of
    them to pass a settled cloud, so its chance is at most the sum of theirs): the lock-in at ``omega``
    (sees a forced swing however small against the noise at ``omega``; control: the OU run's component at
    ``omega``; sequential, :func:`sequential_lockin`: ``lk`` holds its last look) or, where the lock-in sees
    nothing (motion not locked to ``omega``: non-sinusoidal, or at other frequencies), the position test
    (``max_t W2(mu_t, mu_T)`` beyond the settling bound; control: the OU run within it, conclusive only when the
    OU run settled over a long enough window; no test over an empty window)."""
    lk_osc, lk_ou = lk.oscillating, lk.ou
    lk_scale, _ = lockin_scales(lk_osc, lk_ou)
    lk_margin, lk_ctrl = lockin_margins(lk_osc, lk_ou)
    pm = position_margins(s_osc, s_ou, swin)
    use_position = position_decides(s_osc, s_ou, swin) and not lockin_decides(lk_osc, lk_ou)
    lock_text = (
        f"lock-in c0 + c1 t + a cos(omega t) + b sin(omega t) of every token's coordinates over t in "
        f"[{lk.window[0]:.3g}, {lk.window[1]:.3g}] (omega = {fmt(omega)}): {lk_osc.text()}; noise scale "
        f"s = {fmt(lk_scale)} (the larger of this and the OU run's SE), A = {amplitude_over(lk_osc.amplitude, lk_scale):.3g} s "
        f"(g / omega = {g / omega:.2g}); sequential: {_looks_text(lk)}"
    )
    pos_text = _position_text(s_osc, swin)
    measured = (
        f"{pos_text} (decides: the lock-in sees no motion locked to omega); {lock_text}"
        if use_position
        else f"{lock_text} (decides); {pos_text}"
    )
    control_measured = f"{fmt(s_ou.ratio)} x bound" if use_position else lk_ou.text()
    return Prediction(
        "oscillating",
        "Oscillating weights: no relaxation (the cloud keeps moving in the late window: forced at the weights' "
        "frequency omega, or beyond the settling bound)",
        measured,
        f"A > {LOCKIN_Z:g} s over >= {LOCKIN_PERIODS:g} periods, looking again at 2x and 4x while undecided "
        f"(lock-in), or else max W2(mu_t, mu_T) >= 1 x the settling bound (position); each with its own control",
        bool(s_osc.ratio >= 1.0) if use_position else bool(lk_margin > 0),
        "the OU run, the same test: "
        + (
            "within its settling bound (conclusive only when its window is long enough)"
            if use_position
            else "its component at omega against its own SE, at the same look"
        ),
        control_measured,
        (not bool(s_ou.ratio >= 1.0)) if use_position else bool(lk_ctrl > 0),
        margin=pm[0] if use_position and pm is not None else lk_margin,
        control_margin=pm[1] if use_position and pm is not None else lk_ctrl,
        model="gf",
        model_reason="the theory's relaxation statements are about the gradient flow (docs/model.md)",
    )


@dataclasses.dataclass(frozen=True)
class _OscRun:
    """What ``oscillating`` measures, in the order it measures it (:func:`_measure_oscillating`): the runs, the
    lock-in, the laws' path lengths, the windows every row and note reads."""

    params: RelaxationParams
    trajs: dict[str, Trajectory]
    fl: SlopeFloor
    window: Window
    length: RunLength
    st: PairSettling
    swin: Window
    lk: LockInPair
    pos_empty: bool
    omega: float
    g: float
    t_ends: list[float]
    laws: dict[str, dict[str, np.ndarray]]
    L: dict[str, list[float]]
    Lc: dict[str, list[float]]
    frac: dict[str, float]
    growth: dict[str, float]
    Ts: str
    show: Callable[[str, dict[str, list[float]]], str]
    rough: dict[str, Any]
    s_ou: Settling
    s_osc: Settling
    lk_osc: LockIn
    lk_ou: LockIn
    lk_scale: float
    lk_scale_ou: float


def _measure_oscillating(cfg: RelaxationParams, seed: int, progress: Progress | None) -> _OscRun:
    """Run (or read from the cache) everything ``oscillating``'s rows need."""
    if progress:
        progress(0, 3, "simulating the OU and oscillating runs")
    runs, procs = pair_runs(cfg, seed)
    trajs = {k: runs[k] for k in ("ou", "oscillating")}
    fl = slope_floor(trajs, procs["ou"], cfg, seed)
    window = run_window(trajs["ou"])
    length = run_length(cfg, seed)
    st = settled_runs(cfg, seed)
    swin = st.window
    s_ou, s_osc = st.ou, st.oscillating
    lk = lockin_pair(cfg, seed)
    lk_osc, lk_ou = lk.oscillating, lk.ou
    lk_scale, lk_scale_ou = lockin_scales(lk_osc, lk_ou)
    pos_empty = position_margins(s_osc, s_ou, swin) is None
    omega = float(cfg.oscillating.omega)
    g = 1.0 / length.tau_slow
    if progress:
        progress(1, 3, f"law path length from {cfg.law.paths} sampled paths")
    lw = cfg.law
    t_ends = sorted(float(v) for v in lw.t_ends)
    if len(t_ends) < 2:
        raise InputError(f"law.t_ends needs at least two times; got {lw.t_ends}")
    laws = {
        k: law_path_length(p, lw.paths, float(lw.step), t_ends[-1], run_seeds(seed)[5] + 1) for k, p in procs.items()
    }
    if progress:
        progress(2, 3, "checks")
    L = {k: [length_at(law, T) for T in t_ends] for k, law in laws.items()}
    Lc = {k: [length_at(law, T, "closed_form") for T in t_ends] for k, law in laws.items()}
    # A law at rest (amplitude 0, a negative control) has no length at all: its last doubling adds nothing.
    frac = {k: (v[-1] - v[-2]) / v[-1] if v[-1] > 0 else 0.0 for k, v in L.items()}
    growth = {k: v[-1] / v[-2] if v[-2] > 0 else 1.0 for k, v in L.items()}
    Ts = ", ".join(f"{T:g}" for T in t_ends)
    show = lambda k, src: ", ".join(fmt(v) for v in src[k])
    rough = finite_h_path_length(procs["ou"], t_ends, run_seeds(seed)[5] + 2)
    return _OscRun(
        params=cfg, trajs=trajs, fl=fl, window=window, length=length, st=st, swin=swin, lk=lk, pos_empty=pos_empty,
        omega=omega, g=g, t_ends=t_ends, laws=laws, L=L, Lc=Lc, frac=frac, growth=growth, Ts=Ts, show=show, rough=rough,
        s_ou=s_ou, s_osc=s_osc, lk_osc=lk_osc, lk_ou=lk_ou, lk_scale=lk_scale, lk_scale_ou=lk_scale_ou
    )  # fmt: skip


def _oscillating_headline(r: _OscRun) -> dict[str, Any]:
    """``oscillating``'s ``results.json`` numbers."""
    return {
        **floor_keys(r.fl, "oscillating", "ou"),
        # Over an empty settling window there is no position test: no numbers (None), not zeros.
        "settled_fraction": None if r.pos_empty else r.s_osc.late / r.s_osc.displacement,
        "settled_fraction_ou": None if r.pos_empty else r.s_ou.late / r.s_ou.displacement,
        "settling_over_bound": None if r.pos_empty else r.s_osc.ratio,
        "settling_over_bound_ou": None if r.pos_empty else r.s_ou.ratio,
        "wander_scale": r.st.wander,
        "settling_window": [r.swin.start, r.swin.end],
        "lockin_window": list(r.lk.window),
        "lockin_extended_by": r.lk.extended_by,
        "lockin_periods": r.lk_osc.periods,
        "lockin_amplitude": r.lk_osc.amplitude,
        "lockin_se": r.lk_osc.se,
        "lockin_amplitude_ou": r.lk_ou.amplitude,
        "lockin_se_ou": r.lk_ou.se,
        "lockin_scale": r.lk_scale,
        "lockin_over_scale": amplitude_over(r.lk_osc.amplitude, r.lk_scale),
        "lockin_over_scale_ou": amplitude_over(r.lk_ou.amplitude, r.lk_scale_ou),
        "lockin_looks": len(r.lk.looks),
        "lockin_max_periods": LOCKIN_MAX_PERIODS,
        "lockin_look_periods": [osc.periods for osc, _ in r.lk.looks],
        "lockin_look_over_scale": [amplitude_over(osc.amplitude, lockin_scales(osc, ou)[0]) for osc, ou in r.lk.looks],
        "lockin_look_over_scale_ou": [amplitude_over(ou.amplitude, ou.se) for _, ou in r.lk.looks],
        "lockin_look_amplitude": [osc.amplitude for osc, _ in r.lk.looks],
        "lockin_look_se": [osc.se for osc, _ in r.lk.looks],
        "lockin_look_amplitude_ou": [ou.amplitude for _, ou in r.lk.looks],
        "lockin_look_se_ou": [ou.se for _, ou in r.lk.looks],
        "lockin_tau_int": r.lk_osc.tau_int,
        "lockin_tau_int_ou": r.lk_ou.tau_int,
        "lockin_trusted": r.lk_osc.trusted,
        "lockin_trusted_ou": r.lk_ou.trusted,
        "slow_rate_over_omega": r.g / r.omega,
        "run_length": dataclasses.asdict(r.length) | {"needed": r.length.needed, "capped": r.length.capped},
        "law_t_ends": r.t_ends,
        "law_length_sampled": r.L["oscillating"],
        "law_length_sampled_ou": r.L["ou"],
        "law_length_closed_form": r.Lc["oscillating"],
        "law_length_closed_form_ou": r.Lc["ou"],
        "law_paths": r.laws["ou"]["paths"],
        "finite_h_length": r.rough,
        "relaxation_time": r.window.tau,
        "hypotheses": HYPOTHESES,
        "clusters_end": int(r.trajs["oscillating"].diagnostics["clusters"][-1]),
    }


def _oscillating_predictions(r: _OscRun) -> list[Prediction]:
    """``oscillating``'s five rows, each with its control."""
    lo, hi = LINEAR_RANGE
    preds = [
        Prediction(
            "oscillating",
            "Integrable weights: the OU law's path length int_0^T |Theta'_t| dt converges as T grows (measured from samples)",
            f"OU length at T = {r.Ts}: {r.show('ou', r.L)} (closed form {r.show('ou', r.Lc)}); last doubling adds {fmt(r.frac['ou'])}",
            f"last doubling of T adds < {CONVERGED_FRACTION} of the length",
            bool(r.frac["ou"] < CONVERGED_FRACTION),
            "the oscillating weights' law",
            f"adds {fmt(r.frac['oscillating'])}",
            not bool(r.frac["oscillating"] < CONVERGED_FRACTION),
            margin=margin_below(r.frac["ou"], CONVERGED_FRACTION),
            control_margin=margin_above(r.frac["oscillating"], CONVERGED_FRACTION),
            model="-",
            model_reason="a property of the weights' law alone",
        ),
        Prediction(
            "oscillating",
            "Non-integrable weights: the oscillating law's path length grows linearly in T (measured from samples)",
            f"oscillating length at T = {r.Ts}: {r.show('oscillating', r.L)} (closed form {r.show('oscillating', r.Lc)}); "
            f"last doubling multiplies it by {fmt(r.growth['oscillating'])}",
            f"doubling T multiplies the length by a factor in [{lo}, {hi}]",
            bool(lo <= r.growth["oscillating"] <= hi),
            "the OU law",
            f"factor {fmt(r.growth['ou'])}",
            not bool(lo <= r.growth["ou"] <= hi),
            margin=margin_inside(r.growth["oscillating"], lo, hi),
            control_margin=-margin_inside(r.growth["ou"], lo, hi),
            model="-",
            model_reason="a property of the weights' law alone",
        ),
        Prediction(
            "oscillating",
            "Finite H: the empirical measure of H OU heads is not integrable (a Brownian path: its length grows "
            "like step^(-1/2) and linearly in T), unlike the H = infinity law",
            f"H = {r.rough['H']} heads, T = {r.rough['T']:g}: length {', '.join(fmt(v) for v in r.rough['length'])} at "
            f"step {', '.join(f'{h:.3g}' for h in r.rough['steps'])} (local exponents "
            f"{', '.join(f'{v:.2f}' for v in r.rough['exponents'])}); doubling T multiplies it by "
            f"{fmt(r.rough['growth_T'])}",
            f"every local exponent of length against step in [{ROUGH_EXPONENT[0]}, {ROUGH_EXPONENT[1]}] "
            f"(steps are fractions of 1/rate)",
            bool(min(r.rough["margins"]) >= 0),
            "the H = infinity law's length on the same steps (closed form)",
            f"local exponents {', '.join(f'{v:.2f}' for v in r.rough['law_exponents'])}",
            not bool(min(r.rough["law_margins"]) >= 0),
            margin=min(r.rough["margins"]),
            control_margin=-min(r.rough["law_margins"]),
            model="-",
            model_reason="a property of the weights alone",
        ),
        Prediction(
            "oscillating",
            "Oscillating weights: the slope |dF|(mu_t, Theta_t) does not decay to a finite-H floor",
            f"rms slope over t in [{r.fl.runs['oscillating'].window[0]:.3g}, {r.fl.runs['oscillating'].window[1]:.3g}] = "
            f"{fmt(r.fl.runs['oscillating'].rms)} = {fmt(r.fl.runs['oscillating'].ratio)} s_H (floor scale s_H = "
            f"{fmt(r.fl.scale)})",
            f"> {FLOOR_FACTOR:g} s_H",
            bool(r.fl.runs["oscillating"].ratio > FLOOR_FACTOR),
            "the OU run",
            f"{fmt(r.fl.runs['ou'].ratio)} s_H",
            not bool(r.fl.runs["ou"].ratio > FLOOR_FACTOR),
            margin=margin_above(r.fl.runs["oscillating"].ratio, FLOOR_FACTOR),
            control_margin=margin_below(r.fl.runs["ou"].ratio, FLOOR_FACTOR),
            model="gf",
            model_reason="the theory's slope |dF| is the gradient flow's (docs/model.md)",
        ),
        _no_relaxation_row(r.lk, r.omega, r.g, r.s_osc, r.s_ou, r.swin),
    ]
    return preds


def _oscillating_explain(r: _OscRun, preds: list[Prediction]) -> None:
    """Each failed row's explanation, from its numbers."""
    notes = [SEE_FIGURES] * 3 + [
        (floor_note(r.fl) + " " + length_note(r.length, r.window)).strip(),
        _lockin_note(r.lk, r.g, r.omega, r.s_osc, r.swin),
    ]
    for p, note in zip(preds, notes):
        if not p.ok:
            p.explanation = (note + " " + p.explanation).strip()


def _oscillating_result(r: _OscRun, headline: dict[str, Any], preds: list[Prediction]) -> ExperimentResult:
    """The result with its figures and notes."""
    return ExperimentResult(
        "oscillating",
        headline,
        preds,
        figures={
            "snapshots": figure_snapshots(r.trajs, "OU (top) vs oscillating (bottom) weights"),
            "curves": figure_osc(r.trajs, r.laws),
            "lockin": figure_lockin(r.lk),
        },
        configs=[],
        dataset=trajectory_to_dataset(r.trajs["oscillating"]),
        parameters=r.params.to_dict(),
        notes=[
            HYPOTHESES["oscillating"],
            HYPOTHESES["ou"],
            RUNS_NOTE,
            "No relaxation (the last row) is either of two tests, each with its own control. The lock-in: the weights "
            "force the cloud at their frequency omega, so a least-squares fit of every token's coordinates to c0 + c1 t "
            f"+ a cos(omega t) + b sin(omega t) over at least {LOCKIN_PERIODS:g} periods finds an amplitude A far above "
            "its error under oscillating weights and none under OU weights (sequential: while neither test decides, "
            f"both runs are continued and fitted again at 2x and 4x the periods, up to {LOCKIN_MAX_PERIODS:g}, never "
            "beyond the run-length cap; the extra looks cost at most 3 exp(-9) = 3.7e-4 in false alarms, a union "
            "bound over the looks); it sees the swing of a cluster whose slow "
            "rate g is far below omega (about g / omega of its resting point's swing), which a position range cannot. "
            "The error is from the fit's residuals with their autocorrelation (attnflow.experiments.lockin). Where the "
            "lock-in sees nothing (motion not locked to omega), the position test: max W2(mu_t, mu_T) beyond the "
            "settling bound, its control the OU run settled within it.",
            "The law's path length is measured from sampled paths with the Bures-Wasserstein distance between "
            "Gaussian fits (a lower bound of W2 between the laws). With finitely many paths the sampled moments "
            "fluctuate, so the raw sum grows like t even for a law at rest; the reported length is the raw sum "
            f"minus that of a law at rest sampled the same way (OU raw {fmt(r.laws['ou']['raw'][-1])}, null "
            f"{fmt(r.laws['ou']['null'][-1])} at T = {r.t_ends[-1]:g}).",
        ],
    )


def experiment_oscillating(cfg: ParamsLike, *, seed: int = 0, progress: Progress | None = None) -> ExperimentResult:
    """Oscillating weights: no relaxation and a law path length that grows linearly; OU as the contrast
    (``cfg``: :class:`~attnflow.experiments.relax_runs.RelaxationParams` or its dict)."""
    start = time.perf_counter()
    r = _measure_oscillating(relaxation_params(cfg), seed, progress)
    headline = _oscillating_headline(r)
    preds = _oscillating_predictions(r)
    _oscillating_explain(r, preds)
    res = _oscillating_result(r, headline, preds)
    if progress:
        progress(3, 3, "done")
    res.seconds = time.perf_counter() - start
    return res
