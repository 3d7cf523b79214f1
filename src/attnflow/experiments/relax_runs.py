"""The runs ``ou`` and ``oscillating`` share: parameters, the two runs, their continuation and the settling check.

Both run the ``gf`` model on ``S^{d-1}`` from the same uniform cloud with ``H`` heads around an
*anisotropic* mean ``Abar_h = diag(spectrum) + variety G_h`` (``G_h`` seeded GOE: per-head variety),
so that the stationary points of the limiting energy are isolated and being stationary is a real
property (around ``beta I`` every single cluster is stationary by symmetry):

* OU weights ``dA_h = -rate (A_h - Abar_h) dt + sigma dS_h`` from ``A0_h = Abar_h + init_spread G'_h``;
  their law converges to ``Theta_inf = (1/H) sum_h N(Abar_h, sigma^2 / (2 rate))`` (symmetric noise);
* oscillating weights ``Abar_h + C_h sin(omega t + phi_h)``, ``C_h`` GOE of size
  ``amplitude * max(spectrum)``: the eigen-directions keep turning.

The runs' length follows their own relaxation time: past ``integration.t_end`` both runs continue
(:func:`continued`) while the settling window ``[3 (tau + 1/g), T]`` would hold less than one
``max(tau, 1/g)``, up to ``integration.max_extension x t_end`` (``tau`` the energy's ``1/e`` time,
``g`` the cluster's slowest rate, :func:`attnflow.analysis.relaxation.slow_rate`); what stays short is reported
("did not settle within the cap", "slow mode beyond the cap"). The cloud has settled when ``max_t W2(mu_t, mu_T)``
over the settling window is below ``SETTLED_FRACTION W2(mu_0, mu_T) + WANDER_FACTOR w_H``
(:class:`~attnflow.analysis.relaxation.Settling`), ``w_H`` the finite-``H`` wander measured by replica runs
with independent heads' noise (:func:`wander_scale`).

The runs are cached (:func:`simulate_pair`, :func:`settle_cached`): ``ou`` and ``oscillating`` show the same
two runs. The pure analysis is in :mod:`attnflow.analysis.relaxation`, :mod:`attnflow.analysis.following`,
:mod:`attnflow.analysis.laws` and :mod:`attnflow.analysis.lockin`; the figures in
:mod:`attnflow.experiments.relax_figures`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping
from typing import Annotated, Any

import numpy as np
import yaml
from pydantic import Field, PositiveFloat, PositiveInt

from attnflow.analysis.distances import wasserstein_sphere
from attnflow.analysis.following import floor_scale
from attnflow.analysis.lockin import LockIn
from attnflow.analysis.relaxation import (
    MIN_WINDOW_TAUS,
    WINDOW_TAUS,
    Settling,
    Window,
    late_window,
    relaxation_time,
    settling,
    settling_window,
    slow_rate,
    window_indices,
)
from attnflow.config import defaults
from attnflow.core.errors import InputError
from attnflow.core.heads import goe_heads
from attnflow.core.tokens import uniform
from attnflow.experiments.common import ExperimentParams, OscillatingSection, Section, fmt
from attnflow.solve.ensemble import simulate_ensemble
from attnflow.solve.simulation import simulate
from attnflow.weights.processes import OrnsteinUhlenbeck, Oscillating

#: Replica runs behind the wander scale ``w_H``. The worst case is a one-dimensional wander (the circle, or one slow
#: mode carrying it): each replica's ``W2`` is then ``|N(0, w^2)|`` and the rms of ``n`` of them scatters by
#: ``1/sqrt(2 n)`` relative. At ``n = 4`` (until 2026-12-02 11:05) that is 35%, and a settled cloud fails the bound
#: whenever ``w_H`` comes out below about 0.55 of its value (chi^2_4 < 1.2: 12% of looks); at 16, 18% and 0.3%.
WANDER_REPLICAS = 16
#: Slope floor: the late-window rms slope ``|dF|(mu_t, Theta_t)`` is "at the finite-H floor" when it is at
#: most this multiple of the floor scale ``s_H`` (:func:`floor_scale`). A cloud sitting at the limit's
#: stationary point feels exactly ``s_H`` (in rms) from the heads' finite-H fluctuation; following the
#: heads lowers it. The factor 2 covers the sampling scatter of an rms over a late window of several
#: correlation times ``1/rate`` (relative error ~ 1/sqrt(2 x 6) ~ 0.3, so 2 is three of them).
#: Stationarity for the limiting law uses the same factor on the scale a settled cloud shows for that law:
#: ``s_follow`` for a single cluster or an antipodal pair (:func:`following_scale`: it follows the heads, which
#: lowers its slope for ``Theta_inf`` below ``s_H``), ``s_H`` for any other cloud of several clusters; its rms slope for ``Theta_inf`` is at most
#: ``FLOOR_FACTOR`` times that scale, and the slope of the same run before it relaxed is not (the row's control,
#: :func:`transient_window`, on the same scale).
FLOOR_FACTOR = 2.0
#: Independent draws of the ``H`` heads from the stationary law behind ``s_H``.
FLOOR_DRAWS = 64


class RelaxTokens(Section):
    n: PositiveInt = 128


class RelaxHeads(Section):
    count: PositiveInt = 16
    #: The eigenvalues of the common part of the means (their number is d).
    spectrum: Annotated[list[float], Field(min_length=2)] = [3.0, 1.5, 0.5]
    variety: Annotated[float, Field(ge=0)] = 0.3


class RelaxOU(Section):
    rate: PositiveFloat = 1.0
    sigma: PositiveFloat = 0.3
    init_spread: Annotated[float, Field(ge=0)] = 3.0


class RelaxIntegration(Section):
    t_end: PositiveFloat = 24.0
    dt: PositiveFloat = 0.05
    save_every: PositiveInt = 2
    #: The run's length follows its own relaxation time: it continues past ``t_end`` while it is shorter
    #: than ``WINDOW_TAUS + MIN_WINDOW_TAUS`` relaxation times, up to this multiple of ``t_end`` (1: never).
    max_extension: Annotated[float, Field(ge=1)] = 8.0


class LawParams(Section):
    paths: PositiveInt = 100000
    step: PositiveFloat = 0.5
    t_ends: Annotated[list[PositiveFloat], Field(min_length=2)] = [16.0, 32.0, 64.0]


class RelaxationParams(ExperimentParams):
    """The parameters of ``attnflow reproduce ou`` and ``oscillating`` (one model: they share runs)."""

    tokens: RelaxTokens = RelaxTokens()
    heads: RelaxHeads = RelaxHeads()
    ou: RelaxOU = RelaxOU()
    oscillating: OscillatingSection = OscillatingSection()
    integration: RelaxIntegration = RelaxIntegration()
    law: LawParams = LawParams()


def default_params(quick: bool) -> RelaxationParams:
    """The parameters of ``attnflow reproduce ou`` and ``oscillating`` (``quick``: smaller and shorter)."""
    if not quick:
        return RelaxationParams()
    return RelaxationParams(
        tokens=RelaxTokens(n=48),
        integration=RelaxIntegration(t_end=12.0),
        law=LawParams(t_ends=[8.0, 16.0, 32.0]),
    )


def default_config(quick: bool) -> dict[str, Any]:
    """:func:`default_params` as the dict ``configs.yaml`` stores."""
    return default_params(quick).to_dict()


#: What the run functions accept: the typed parameters, or their dict (``configs.yaml``'s form), validated once.
ParamsLike = RelaxationParams | Mapping[str, Any]


def relaxation_params(cfg: ParamsLike) -> RelaxationParams:
    """``cfg`` as :class:`RelaxationParams`: the model itself, or its dict validated (an invalid one raises
    :class:`~attnflow.experiments.common.ExperimentConfigError`)."""
    return cfg if isinstance(cfg, RelaxationParams) else RelaxationParams.parse(cfg)


def params_key(params: RelaxationParams) -> str:
    """The cache key of the runs (:func:`simulate_pair`, :func:`settle_cached`, ...): the parameters' dict as
    sorted YAML, the same text for the model and for the dict ``configs.yaml`` stores."""
    return yaml.safe_dump(params.to_dict(), sort_keys=True)


def _from_key(cfg_yaml: str) -> RelaxationParams:
    return RelaxationParams.model_validate(yaml.safe_load(cfg_yaml))


def _integration(it: RelaxIntegration | Mapping[str, Any]) -> RelaxIntegration:
    return it if isinstance(it, RelaxIntegration) else RelaxIntegration.model_validate(it)


def run_seeds(seed: int, n: int = 6) -> list[int]:
    return [int(s.generate_state(1)[0]) for s in np.random.SeedSequence([seed, 7]).spawn(n)]


def build(cfg: ParamsLike, seed: int):
    """Initial cloud, the OU and the oscillating process (same means ``Abar_h``) and the OU noise seed."""
    p = relaxation_params(cfg)
    s_tok, s_var, s_a0, s_c, s_phase, s_noise = run_seeds(seed)
    spec = np.asarray(p.heads.spectrum, dtype=float)
    d, H = len(spec), p.heads.count
    if d < 2:
        raise InputError(f"heads.spectrum needs at least two eigenvalues (it sets d); got {spec.tolist()}")
    x0 = uniform(p.tokens.n, d, s_tok)
    A_bar = np.diag(spec)[None] + goe_heads(H, d, float(p.heads.variety), s_var)
    o = p.ou
    A0 = A_bar + goe_heads(H, d, float(o.init_spread), s_a0)
    ou = OrnsteinUhlenbeck(A_bar, float(o.rate), float(o.sigma), A0=A0, seed=s_noise)
    C = goe_heads(H, d, float(p.oscillating.amplitude) * float(spec.max()), s_c)
    phase = np.random.default_rng(s_phase).uniform(0, 2 * np.pi, H)
    osc = Oscillating(A_bar, C, float(p.oscillating.omega), phase)
    return x0, ou, osc, s_noise


@dataclasses.dataclass(frozen=True)
class RunLength:
    """How long the runs went and why: the base ``t_end``, the final ``T``, the cap, the OU run's energy
    relaxation time ``tau`` and the slow mode's ``tau_slow = 1 / g`` (:func:`slow_rate`)."""

    base: float
    T: float
    cap: float
    tau: float
    tau_slow: float

    @property
    def needed(self) -> float:
        """The length at which the settling window (:func:`settling_window`) holds ``MIN_WINDOW_TAUS`` of the
        longer relaxation time."""
        return WINDOW_TAUS * (self.tau + self.tau_slow) + MIN_WINDOW_TAUS * max(self.tau, self.tau_slow)

    @property
    def capped(self) -> bool:
        """The run stopped at the cap shorter than it needed."""
        return self.T < self.needed - 1e-9

    @property
    def slow_beyond_cap(self) -> bool:
        """The slow mode alone needs a run longer than the cap (known before running: not extended for it)."""
        return (WINDOW_TAUS + MIN_WINDOW_TAUS) * self.tau_slow > self.cap + 1e-9

    def describe(self) -> str:
        ext = "" if self.T <= self.base + 1e-9 else f"continued from t_end = {self.base:g} to T = {self.T:g}; "
        return (
            f"{ext}energy relaxation time tau = {fmt(self.tau)}, the cluster's slow mode 1/g = {fmt(self.tau_slow)}; "
            f"cap {self.cap:g}"
        )


def continued(traj, process, t_add: float, it: RelaxIntegration | Mapping[str, Any], seed: int | None):
    """``traj`` continued by ``t_add`` from its last state, with ``process`` (started at that state's weights),
    stepped with ``it``'s ``dt`` and ``save_every``."""
    it = _integration(it)
    nxt = simulate(
        traj.x[-1], process, model=traj.model, t_end=t_add, dt=it.dt, method=defaults.METHOD, save_every=it.save_every,
        seed=seed,
    )  # fmt: skip
    shift = float(traj.t[-1])
    cat = lambda a, b: np.concatenate([a, b[1:]])
    steps = {k: np.concatenate([v, nxt.steps[k] + (shift if k == "step_time" else 0.0)]) for k, v in traj.steps.items()}
    prov = dict(traj.provenance)
    prov["segments"] = int(prov.get("segments", 1)) + 1
    prov["wall_time_s"] = float(prov.get("wall_time_s", 0.0)) + float(nxt.provenance.get("wall_time_s", 0.0))
    return dataclasses.replace(
        traj,
        t=cat(traj.t, nxt.t + shift),
        x=cat(traj.x, nxt.x),
        A=cat(traj.A, nxt.A),
        diagnostics={k: cat(v, nxt.diagnostics[k]) for k, v in traj.diagnostics.items()},
        steps=steps,
        provenance=prov,
    )


def continue_ou(o, ou: OrnsteinUhlenbeck, add: float, it: RelaxIntegration | Mapping[str, Any], seed: int):
    """The OU run ``o`` continued by ``add`` with fresh noise ``seed`` from its last heads (a Markov continuation)."""
    return continued(o, OrnsteinUhlenbeck(ou.A_bar, ou.rate, ou.sigma, A0=o.A[-1], seed=seed), add, it, seed)


def continue_both(
    o, c, ou: OrnsteinUhlenbeck, osc: Oscillating, add: float, it: RelaxIntegration | Mapping[str, Any], seed: int
):
    """The OU run ``o`` and the oscillating run ``c`` (ending at the same time) continued by ``add``: OU with fresh
    noise ``seed`` from its last heads (:func:`continue_ou`), the oscillating weights at their phase."""
    T = float(o.t[-1])
    osc_next = Oscillating(osc.A_bar, osc.C, osc.omega, osc.phase + osc.omega * T)
    return continue_ou(o, ou, add, it, seed), continued(c, osc_next, add, it, None)


def segment_seed(seed: int, j: int) -> int:
    return int(np.random.SeedSequence([seed, 11, j]).generate_state(1)[0])


@functools.lru_cache(maxsize=2)
def simulate_pair(cfg_yaml: str, seed: int):
    # Cached: `ou` and `oscillating` show the same two runs; nothing downstream mutates them.
    p = _from_key(cfg_yaml)
    x0, ou, osc, s_noise = build(p, seed)
    it = p.integration
    t_end, dt, save_every = it.t_end, it.dt, it.save_every
    trajs = {
        "ou": simulate(
            x0, ou, model="gf", t_end=t_end, dt=dt, method=defaults.METHOD, save_every=save_every, seed=s_noise
        ),
        "oscillating": simulate(x0, osc, model="gf", t_end=t_end, dt=dt, method=defaults.METHOD, save_every=save_every),
        # The same heads in real multi-head attention: the gf/mha gap is measured, not assumed away (over t_end).
        "ou-mha": simulate(
            x0, ou, model="mha", t_end=t_end, dt=dt, method=defaults.METHOD, save_every=save_every, seed=s_noise
        ),
    }
    # The run's length follows its own relaxation time: continue both runs (OU with fresh noise from its last
    # heads, a Markov continuation; the oscillating weights at their phase) while the late window would hold
    # fewer than MIN_WINDOW_TAUS relaxation times, up to the cap. A slow mode that alone needs more than the
    # cap is not chased: the settling check reports it.
    cap = it.max_extension * t_end
    spacing = dt * save_every
    tau_slow = 1.0 / max(slow_rate(ou.A_bar), 1e-300)
    j = 0
    while True:
        o = trajs["ou"]
        T = float(o.t[-1])
        length = RunLength(t_end, T, cap, relaxation_time(o.t, o.diagnostics["energy"]), tau_slow)
        need = (WINDOW_TAUS + MIN_WINDOW_TAUS) * length.tau if length.slow_beyond_cap else length.needed
        if not math.isfinite(need):
            need = 2.0 * T
        if T >= need - 1e-9 or T >= cap - 1e-9:
            break
        # 25% beyond the need: tau itself is measured against the late level, which the longer run refines.
        target = min(cap, max(1.25 * need, T + spacing))
        add = math.ceil(round((target - T) / spacing, 6)) * spacing
        j += 1
        trajs["ou"], trajs["oscillating"] = continue_both(
            o, trajs["oscillating"], ou, osc, add, it, segment_seed(s_noise, j)
        )
    return trajs, {"ou": ou, "oscillating": osc}, length


def pair_runs(cfg: ParamsLike, seed: int):
    """The OU, oscillating and OU-mha runs of ``cfg`` at ``seed`` and their processes (:func:`simulate_pair`)."""
    trajs, procs, _ = simulate_pair(params_key(relaxation_params(cfg)), seed)
    return trajs, procs


def run_length(cfg: ParamsLike, seed: int) -> RunLength:
    """How long :func:`pair_runs` went, and why."""
    return simulate_pair(params_key(relaxation_params(cfg)), seed)[2]


#: Which hypothesis of the theory each run satisfies (stated in the results and in docs/reproduce.md).
HYPOTHESES = {
    "ou": "OU weights: the H = infinity law Theta_t converges exponentially, so its path length is finite "
    "(integrable, the theory's hypothesis); the empirical measure of the H heads actually simulated has a Brownian "
    "path of infinite length (not integrable), which is why the slope stops at a finite-H floor instead of 0.",
    "oscillating": "Oscillating weights: neither the law nor the H heads are integrable (the path length grows "
    "linearly in T); the theory's relaxation statement does not apply.",
}


#: Why ``configs.yaml`` lists no core run configs for ``ou`` and ``oscillating``.
RUNS_NOTE = (
    "The two runs are built from the parameters above (configs.yaml: parameters): their anisotropic means "
    "Abar_h = diag(spectrum) + variety GOE_h are not expressible as a core run config, so configs.yaml lists no "
    "separate run configs; attnflow reproduce ou --set ... reruns them."
)


def run_window(ou_traj) -> Window:
    """The late window of both runs, ``[max(3 tau, T/2), T]`` with ``tau`` the OU run's relaxation time
    (its energy's ``1/e`` time): the run's own time scale, not a parameter that can exceed the run."""
    return late_window(ou_traj.t, relaxation_time(ou_traj.t, ou_traj.diagnostics["energy"]))


def wander_scale(traj, ou: OrnsteinUhlenbeck, k: int, replicas: int, dt: float, seed: int) -> np.ndarray:
    """``W2(mu^r_T, mu_T)`` for ``replicas`` runs ``mu^r`` from the OU run's state at saved index ``k`` (its tokens
    and heads) to its end ``T``, each with independent heads' noise: the finite-``H`` wander over the window.

    The replicas share the run's start and its deterministic drift, which cancel in the distance; what is left
    is the wander the heads' noise drives (two independent paths: ``sqrt(2)`` times one path's). Its rms is the
    wander scale ``w_H`` of the settling check.
    """
    L = float(traj.t[-1] - traj.t[k])
    a = traj.token_weights
    if L <= 0:
        return np.zeros(replicas)
    n = max(1, int(round(L / dt)))
    # One batched run (member r equals the single run with seed r's noise): the replicas cost one loop.
    ens = simulate_ensemble(
        traj.x[k], OrnsteinUhlenbeck(ou.A_bar, ou.rate, ou.sigma, A0=traj.A[k]), model=traj.model, t_end=n * dt,
        dt=dt, method=defaults.METHOD, save_every=n, seeds=[segment_seed(seed, 1000 + r) for r in range(replicas)],
    )  # fmt: skip
    return np.array([float(wasserstein_sphere(traj.x[-1], xr, a=a, b=a).value) for xr in ens.x[-1]])


@dataclasses.dataclass(frozen=True)
class PairSettling:
    """The settling of the pair's runs (:func:`settle_cached`): the settling ``window``, the replicas' start time
    ``replicas_from``, their distances ``W2(mu^r_T, mu_T)`` (``replicas``) and ``w_H`` (``wander``, their rms), and
    each run's :func:`~attnflow.analysis.relaxation.settling` check over the window."""

    window: Window
    replicas_from: float
    replicas: np.ndarray
    wander: float
    ou: Settling
    oscillating: Settling


@dataclasses.dataclass(frozen=True)
class LockInPair:
    """Row #5's lock-in of the pair (:func:`attnflow.experiments.oscillating.lockin_pair`): the window ``[start, T']``,
    how far the runs were continued for it (``extended_by``), every look's ``(oscillating, OU)`` fits (``looks``),
    the last look's fits (``oscillating``, ``ou``) and, per run, its most swinging coordinate with the fitted
    sinusoid (``series``: ``t``, the coordinate less its constant and drift, the fit; for the figure)."""

    window: tuple[float, float]
    extended_by: float
    series: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]
    looks: list[tuple[LockIn, LockIn]]
    oscillating: LockIn
    ou: LockIn

    def fit(self, run: str) -> LockIn:
        """The last look's fit of ``run`` (``"oscillating"`` or ``"ou"``)."""
        return self.oscillating if run == "oscillating" else self.ou


@functools.lru_cache(maxsize=2)
def settle_cached(cfg_yaml: str, seed: int) -> PairSettling:
    p = _from_key(cfg_yaml)
    trajs, procs, length = simulate_pair(cfg_yaml, seed)
    o = trajs["ou"]
    # The settling window is in units of the longer of the two relaxation times: the energy's and the slow mode's.
    win = settling_window(o.t, length.tau, length.tau_slow)
    t_from, reps, w = settle_wander(o, procs["ou"], win, p.integration.dt, run_seeds(seed)[5] + 4)
    return PairSettling(win, t_from, reps, w, settling(o, win.start, w), settling(trajs["oscillating"], win.start, w))


def settle_wander(o, ou: OrnsteinUhlenbeck, win: Window, dt: float, seed: int) -> tuple[float, np.ndarray, float]:
    """The replicas' start time, their distances and ``w_H`` (their rms) for the settling window ``win`` of ``o``."""
    # The replicas start one memory time before the window: the wander a path shows in the window also carries
    # the noise of the heads' correlation time 1/rate and of the cloud's relaxation time before it (started at
    # the window itself, the replicas would share that and underestimate the wander); never before
    # (WINDOW_TAUS - 1) relaxation times, where the cluster has formed.
    memory = win.tau + 1.0 / ou.rate
    t_rep = max(win.start - memory, (WINDOW_TAUS - 1.0) * win.tau) if math.isfinite(win.tau) else win.start
    k = int(np.flatnonzero(o.t >= min(t_rep, win.start) - 1e-12)[0])
    reps = wander_scale(o, ou, k, WANDER_REPLICAS, dt, seed)
    return float(o.t[k]), reps, float(np.sqrt(np.mean(reps**2)))


def settled_runs(cfg: ParamsLike, seed: int) -> PairSettling:
    """The settling of :func:`pair_runs` (:func:`settle_cached`)."""
    return settle_cached(params_key(relaxation_params(cfg)), seed)


def pair_start(cfg_yaml: str, seed: int):
    """What the sequential rows (``ou`` #2, ``oscillating`` #5) start from: the config, the pair's runs, processes
    and run length (:func:`simulate_pair`), the settling of :func:`settle_cached`, the integration options."""
    p = _from_key(cfg_yaml)
    trajs, procs, length = simulate_pair(cfg_yaml, seed)
    return p, trajs, procs, length, settle_cached(cfg_yaml, seed), p.integration


@dataclasses.dataclass(frozen=True)
class RunFloor:
    """One run's late-window rms slope ``rms``, its ``ratio`` to the floor scale ``s_H``, and the window ``[t0, T]``."""

    rms: float
    ratio: float
    window: list[float]


@dataclasses.dataclass(frozen=True)
class SlopeFloor:
    """:func:`slope_floor`: the floor scale ``s_H`` (``scale``), the OU run's relaxation time ``tau`` and whether its
    late window is long enough (``window_ok``), and each run's :class:`RunFloor` by run name (``runs``)."""

    scale: float
    tau: float
    window_ok: bool
    runs: dict[str, RunFloor]


def floor_keys(fl: SlopeFloor, own: str, other: str) -> dict[str, Any]:
    """The slope-floor entries of one experiment's ``results.json`` (``own`` run, ``other`` its control):
    the same keys in ``ou`` and ``oscillating``, each naming its own run plainly and the other by suffix."""
    return {
        "slope_floor_scale": fl.scale,
        "slope_late_rms": fl.runs[own].rms,
        f"slope_late_rms_{other}": fl.runs[other].rms,
        "slope_floor_ratio": fl.runs[own].ratio,
        f"slope_floor_ratio_{other}": fl.runs[other].ratio,
        "slope_window": fl.runs[own].window,
    }


def slope_floor(trajs: dict, ou: OrnsteinUhlenbeck, cfg: ParamsLike | None, seed: int) -> SlopeFloor:
    """Late-window rms slope of each run over the floor scale ``s_H`` (at the OU run's final cloud). ``cfg`` is not
    read (the window and ``s_H`` come from the runs and ``seed``); it stays for the callers that pass it."""
    win = run_window(trajs["ou"])
    s_H = floor_scale(trajs["ou"].x[-1], ou, FLOOR_DRAWS, run_seeds(seed)[5] + 3)
    runs: dict[str, RunFloor] = {}
    for k, t in trajs.items():
        idx = window_indices(t, win)
        rms = float(np.sqrt(np.mean(t.diagnostics["slope"][idx] ** 2)))
        runs[k] = RunFloor(rms, rms / s_H, [float(t.t[idx[0]]), float(t.t[-1])])
    return SlopeFloor(s_H, win.tau, win.ok, runs)


SEE_FIGURES = "See the figures: the measured value and its control are side by side."


def length_note(length: RunLength, window: Window) -> str:
    """Why a window is too short, from the run's length, its cap and its relaxation times ('' when it is not)."""
    if window.ok:
        return ""
    if length.slow_beyond_cap and length.tau_slow > length.tau and math.isclose(window.tau, length.tau_slow):
        return (
            f"Slow mode beyond the cap: the cluster's slowest direction relaxes at rate g = {fmt(1 / length.tau_slow)} "
            f"(1/g = {fmt(length.tau_slow)}, longer than the energy's tau = {fmt(length.tau)}), so a conclusive "
            "run needs "
            f"T >= {fmt(length.needed)} ({WINDOW_TAUS:g} (tau + 1/g) + max(tau, 1/g)), "
            f"beyond the cap {length.cap:g}; the run was not extended for it. Inconclusive, counted as a FAIL."
        )
    return (
        f"Did not settle within the cap: the run ended at T = {length.T:g} (t_end {length.base:g}, cap {length.cap:g}) "
        "and its late "
        f"window is still only {window.length_taus:.2g} of its relaxation time tau = {fmt(window.tau)} long "
        f"(at least {MIN_WINDOW_TAUS:g} needed). Inconclusive, counted as a FAIL."
    )


def floor_note(fl: SlopeFloor) -> str:
    """Why a slope-floor row failed, from its numbers."""
    o, c = fl.runs["ou"].ratio, fl.runs["oscillating"].ratio
    if o > FLOOR_FACTOR:
        return (
            f"the OU run's late rms slope is {o:.3g} s_H: above the finite-H floor, so the cloud has not settled "
            "near a stationary point of the limiting energy within the run (a longer run, or the cloud follows a "
            "slow drift of the heads' average)."
        )
    return (
        f"the oscillating run's late rms slope is only {c:.3g} s_H: its weights move the stationary point slowly "
        "enough for the cloud to follow it closely (a small amplitude or frequency)."
    )
