"""``heads``: the late slope floor under OU weights, per seed against its predicted constant, and ``1/H``.

For each parameter set, each ``H`` and each seed, a ``gf`` run with ``H`` OU heads around
``beta I``. Seeds of one ``(set, H)`` run as one batched ensemble (:func:`attnflow.simulate_ensemble`, fixed
``rk4`` steps; its diagnostics give each member's ``|dF|`` and energy at the saved times), each member with its
own initial cloud and weight path. Per seed (:mod:`attnflow.experiments.floors`):

* the run's own relaxation time ``tau`` (the energy's ``1/e`` time) and the late window
  ``[max(3 tau, T/2), T]``; the run's length ``T`` is ``t_end`` at ``d >= 3`` and ``2 t_end`` on the circle
  (:func:`run_length`: a window of one tangent dimension needs twice the length for ``d = 3``'s precision);
* the floor: the window's time average of ``|dF|^2``, with its standard error from the integrated
  autocorrelation time ``tau_int`` of ``|dF|^2`` (Sokal's windowing, each lag over its own pairs) and the
  relative variance, both pooled over the seeds of one ``(set, H)``: they are draws of one stationary process
  (``correlated_means(..., same_law=True)``);
* whether the seed settled, decided by its state (:func:`attnflow.analysis.seed_state.window_state`): the
  same clusters at the window's start and end, whatever their number, near a stationary point of the limiting
  energy (minimiser or saddle, index reported; clusters merging inside the window are "in transition", a
  configuration whose Newton step exceeds the window's own fluctuation is "not near a stationary point":
  both reported, not averaged in), a window at least one ``tau`` long, and a pooled window (over the seeds
  in as many clusters) at least ``MIN_TAUS = 50`` ``tau_int`` long (else ``tau_int``, and every error, is not
  trusted);
* its predicted floor: the central-limit constant ``E |dF|^2`` of ``H`` heads drawn from the stationary
  OU law at the seed's final cloud (Monte Carlo with its standard error; docs/model.md).

Two predictions per set. (1) The constant: at the tail's ``H``, every settled seed's measured /
predicted ratio lies within ``RATIO_TOL`` (widened by its Gamma quantile at Sidak's level for ``n`` seeds:
:func:`seed_bound`, :data:`FAMILY_LEVEL`) of 1 and the pooled geometric
mean within ``RATIO_TOL``; control: the same with the prediction doubled. (2) The exponent, finite-``H``
correct: the floors follow their per-seed predicted constants across ``H``, i.e. the least-squares
exponent of measured / predicted (geometric mean over settled seeds) against ``H`` over the ``tail``
largest ``H`` (over their asymptotic range: where the local slopes stop drifting; none: "pre-asymptotic",
undecided) is 0, tested against the competing law ``H^(-1/2)`` (ratio exponent ``-1/2 - p``, ``p``
the predicted constants' own exponent, about 1/2), two-sided (:class:`attnflow.verdicts.Exponent`): the
bootstrap CI, on three or more ``H``, lies inside ``(-gap/2, gap/2)``; a CI reaching out of it and excluding 0,
on either side, fails (:func:`_decide`). While the CI is too wide the verdict is undecided and a batch of
``seeds`` more seeds runs at the tail's ``H`` (the sequential design) while the width of the run's own interval says a
decision lies within ``seed_batches`` batches (:func:`batches_needed`); undecided when it stops is a FAIL
(not enough seeds). Control: the same on the late mean of ``|dF|`` (not
squared, ``~ H^(-1/2)``) over the predicted floors. Unsettled seeds are listed, not averaged in.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import xarray as xr

from attnflow.analysis.diagnostics import energy_and_slope
from attnflow.analysis.floor_fit import (  # noqa: F401  (their home; the old names stay importable from here)
    BOOTSTRAP,
    COMPETING,
    CONTROL_FACTOR,
    FAMILY_LEVEL,
    LOCAL_BAND,
    NO_FIT_BATCHES,
    RATIO_TOL,
    SEED_BATCHES,
    SeedFloor,
    adds_batch,
    batches_needed,
    family_z,
    seed_bound,
    sidak_level,
)

# The names the tests and docs knew (before the analysis moved to attnflow.analysis.floor_fit).
from attnflow.analysis.floor_fit import constant_check as _constant_check
from attnflow.analysis.floor_fit import decide as _decide  # noqa: F401
from attnflow.analysis.floor_fit import decisive as _decisive  # noqa: F401
from attnflow.analysis.floor_fit import exponent_fit as _exponent_fit
from attnflow.analysis.floor_fit import floor_arrays as _arrays
from attnflow.analysis.floor_fit import ratio_margin as _ratio_margin  # noqa: F401
from attnflow.analysis.seed_state import window_state
from attnflow.core.errors import Hint, InputError, NumericalError
from attnflow.core.heads import goe_heads, identity_heads
from attnflow.core.tokens import cap, uniform
from attnflow.experiments.common import ExperimentResult, Prediction, Progress
from attnflow.experiments.floors import (
    MIN_TAUS,
    correlated_means,
    late_window,
    predicted_floor,
    relaxation_time,
    single_cluster_constant,
    time_average,
)
from attnflow.experiments.heads_params import (  # noqa: F401  (their home; the names stay importable from here)
    HeadsParams,
    HeadsSection,
    IntegrationParams,
    OUParams,
    SetResult,
    TokensParams,
    UnsettledSeed,
    heads_params,
)
from attnflow.experiments.heads_report import figure, headline, notes, set_predictions
from attnflow.io.metadata import describe
from attnflow.solve.ensemble import simulate_ensemble
from attnflow.solve.guards import NumericalInstability
from attnflow.weights.processes import OrnsteinUhlenbeck

#: The tangent dimension ``d - 1`` for which ``integration.t_end`` is sized: the default sphere ``S^2``, where the
#: design (8 seeds, the seed budget, ``t_end = 24``) was first measured. At a settled single cluster ``|dF|^2``
#: is ``(d - 1)`` squared Gaussian tangent components (``c^2 / (2 H) chi^2_(d-1)`` times the attention's factor:
#: :func:`~attnflow.experiments.floors.single_cluster_constant`), so a window of length ``L`` holds about
#: ``(d - 1) L / tau_int`` independent components and each seed's relative error is
#: ``sqrt(2 tau_int / ((d - 1) L))``: on the circle (``d = 2``) ``sqrt 2`` times that of ``d = 3`` at the same
#: ``L``. :func:`run_length` lengthens the run by ``TANGENT_REF / (d - 1)`` below this dimension (never shortens it).
TANGENT_REF = 2
#: Cluster threshold (1 - <x_i, x_j> below it: same cluster), the library's default: merged tokens of a
#: settled cloud coincide to rounding (all feel one field), separated ones are O(1) apart.
CLUSTER_EPS = 1e-3

#: name -> (long_name, units, description) of the dataset's variables and coordinates; ``{set}``
#: stands for a parameter set's name (see :func:`variables`).
VARIABLES: dict[str, tuple[str, str, str]] = {
    "seed": ("seed", "1", "seed of one ensemble member: its initial cloud, initial heads and OU weight path"),
    "H_{set}": ("number of heads H", "1", "number of OU attention heads H of the runs of parameter set {set}"),
    "floor_{set}": (
        "slope floor: late mean of |dF|^2",
        "1",
        "time average of the squared metric slope |dF|^2 over the late window [max(3 tau, T/2), T] of each seed "
        "(parameter set {set}); expected to scale like 1/H",
    ),
    "predicted_{set}": (
        "predicted slope floor",
        "1",
        "E |dF|^2 at the seed's final cloud over H heads drawn from the stationary OU law (Monte Carlo; "
        "parameter set {set})",
    ),
    "settled_{set}": (
        "seed settled",
        "1",
        "1 when the seed was one cluster through its late window and the window was at least one relaxation "
        "time long (parameter set {set}), else 0",
    ),
    "abs_slope_{set}": (
        "late mean of |dF|",
        "1",
        "time average of the metric slope |dF| over the late window (parameter set {set}); the negative "
        "control, scaling like H^(-1/2)",
    ),
}


def variables(sets: list[str]) -> dict[str, tuple[str, str, str]]:
    """:data:`VARIABLES` with ``{set}`` filled in for each parameter set's name."""
    out: dict[str, tuple[str, str, str]] = {}
    for key, entry in VARIABLES.items():
        for s in sets if "{set}" in key else [""]:
            out[key.format(set=s)] = (entry[0], entry[1], entry[2].format(set=s))
    return out


def default_params(quick: bool) -> HeadsParams:
    """The parameters of ``attnflow reproduce heads`` (``--quick``: the tail only, one set)."""
    if quick:
        return HeadsParams(heads=HeadsSection(counts=[32, 64, 128]))
    return HeadsParams(
        sets={
            "beta3-slow": {"heads.beta": 3.0, "weights.rate": 0.5, "weights.sigma": 0.4},
            "beta1.5-fast-uniform": {
                "heads.beta": 1.5,
                "weights.rate": 2.0,
                "weights.sigma": 0.8,
                "tokens.init": "uniform",
            },
        }
    )


def default_config(quick: bool) -> dict[str, Any]:
    """:func:`default_params` as the dict ``configs.yaml`` stores."""
    return default_params(quick).to_dict()


def run_length(t_end: float, d: int, scaled: bool = True) -> float:
    """The run's length ``T = t_end max(1, TANGENT_REF / (d - 1))`` on ``S^(d-1)`` (``scaled=False``: ``t_end``).

    The late window is ``[max(3 tau, T/2), T]``, so below ``d = 3`` it is ``TANGENT_REF / (d - 1)`` times longer
    and each seed's relative error ``sqrt(2 tau_int / ((d - 1) L))`` no larger than at ``d = 3``
    (:data:`TANGENT_REF`); at ``d >= 3`` the run is ``t_end``.
    """
    if d < 2:
        raise InputError(f"tokens.d must be at least 2; got {d}", hint=Hint("tokens.d", 2))
    return float(t_end) * (max(1.0, TANGENT_REF / (d - 1)) if scaled else 1.0)


def _config_run_length(p: HeadsParams) -> float:
    """:func:`run_length` of one set's parameters (``integration.t_end``, ``tokens.d``, ``integration.tangent_scaled``)."""
    return run_length(p.integration.t_end, p.tokens.d, p.integration.tangent_scaled)


def _set_configs(cfg: HeadsParams | Mapping[str, Any], user_sets: list[str]) -> dict[str, HeadsParams]:
    """The parameter sets of one run: ``base`` (``cfg`` without its ``sets``) and each of ``cfg.sets`` applied on top of
    it, the user's ``--set`` overrides (``user_sets``) applied again on top of each."""
    base = heads_params(cfg)
    plain = base.model_copy(update={"sets": {}})
    out = {"base": plain}
    again = [u for u in user_sets if not u.strip().startswith("sets")]
    for name, changes in base.sets.items():
        items = [f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}" for k, v in changes.items()]
        out[str(name)] = plain.with_sets(items + again)
    return out


@dataclass
class Members:
    """One batched ensemble: saved times ``t`` ``(S,)``, ``slope`` and ``energy`` ``(S, B)``, clouds
    ``x`` ``(S, B, N, d)``, and the OU law's means ``A_bar`` ``(H, d, d)`` and scale ``c``."""

    t: np.ndarray
    slope: np.ndarray
    energy: np.ndarray
    x: np.ndarray
    A_bar: np.ndarray
    c: float

    def joined(self, more: Members) -> Members:
        """These members and ``more`` (the same ``(set, H)``, further seeds) as one ensemble."""
        return Members(
            self.t,
            np.concatenate([self.slope, more.slope], axis=1),
            np.concatenate([self.energy, more.energy], axis=1),
            np.concatenate([self.x, more.x], axis=1),
            self.A_bar,
            self.c,
        )


def _run_members(p: HeadsParams, H: int, seeds: list[int]) -> Members:
    """The runs of one ``(set, H)``: one batched ensemble of ``len(seeds)`` members (:func:`attnflow.simulate_ensemble`,
    model ``gf``, fixed ``rk4`` steps), member ``b`` with its own cloud, initial heads and OU noise, each drawn from
    ``SeedSequence([seeds[b], H])``."""
    tk, w, it = p.tokens, p.weights, p.integration
    d, N = tk.d, tk.n
    A_bar = identity_heads(H, d, p.heads.beta)
    x0, processes, noise = [], [], []
    for s in seeds:
        ss = np.random.SeedSequence([s, H]).spawn(3)
        seed_tok, seed_a0, seed_noise = (int(q.generate_state(1)[0]) for q in ss)
        x0.append(cap(N, d, tk.angle, seed=seed_tok) if tk.init == "cap" else uniform(N, d, seed_tok))
        processes.append(OrnsteinUhlenbeck(A_bar, w.rate, w.sigma, A0=A_bar + goe_heads(H, d, w.init_spread, seed_a0)))
        noise.append(seed_noise)
    # A whole number of steps dt (the run length need not be one: it is rounded to the nearest step).
    n_steps = int(round(_config_run_length(p) / it.dt))
    try:
        ens = simulate_ensemble(
            np.stack(x0), processes, model="gf", method="rk4", t_end=n_steps * it.dt, dt=it.dt,
            save_every=it.save_every, seeds=noise,
        )  # fmt: skip
    except NumericalInstability as e:
        raise NumericalError(f"heads at H={H}: {e} (the step is integration.dt)", hint=Hint("integration.dt")) from None
    energy, slope = energy_and_slope(ens.diagnostics["log_abs_energy"], ens.diagnostics["log_slope"])
    return Members(ens.t, slope, energy, ens.x, A_bar, p.stationary_scale)


def _seed_floors(
    mem: Members,
    p: HeadsParams,
    H: int,
    seeds: list[int],
    draw_seed: int,
    known: dict[int, tuple[float, float]] | None = None,
) -> list[SeedFloor]:
    """Per seed: the floor, its error from the integrated autocorrelation time, and whether it settled.

    A seed settled when its late window rests at one configuration (the same clusters at its start and end,
    whatever their number: :func:`attnflow.analysis.seed_state.window_state`, which also classifies it as a
    minimiser or saddle of the limiting energy under the law's mean heads, with its index), the window is at
    least one ``tau`` long, and the pooled window of its group is long enough for ``tau_int``. Seeds resting in
    the same number of clusters are draws of one stationary process (under the rotation-invariant OU law around
    ``beta I``), so ``tau_int`` of ``|dF|^2`` is estimated from their windows pooled
    (:func:`~attnflow.experiments.floors.correlated_means`), one group per cluster count; when a group's pooled
    length is under :data:`~attnflow.experiments.floors.MIN_TAUS` ``tau_int`` the estimate (and every error
    built on it) is not trusted and those seeds are reported as too short, not averaged in. ``known``: member
    index -> predicted floor already computed (a later batch of seeds reuses the earlier ones').
    """
    known = {} if known is None else known
    beta, d = p.heads.beta, p.tokens.d
    # Equal heads are one head for the energy (uniform head masses): classify under the law's mean once.
    mean_heads = mem.A_bar[:1] if np.allclose(mem.A_bar, mem.A_bar[:1]) else mem.A_bar
    base = []
    for b in range(len(seeds)):
        tau = relaxation_time(mem.t, mem.energy[:, b])
        win = late_window(mem.t, tau)
        floor, se_batch = time_average(mem.t, mem.slope[:, b] ** 2, win.start)
        ab, _ = time_average(mem.t, mem.slope[:, b], win.start)
        k0 = min(int(np.searchsorted(mem.t, win.start - 1e-12)), len(mem.t) - 1)
        state = window_state(mem.x[k0:, b], mean_heads, CLUSTER_EPS)
        why = []
        if not win.ok:
            why.append(f"relaxation time tau = {tau:.3g}: the window [max(3 tau, T/2), T] is shorter than one tau")
        if not state.settled:
            why.append(state.reason)
        base.append((tau, win, floor, se_batch, ab, k0, state, why))
    # tau_int per cluster count, from the seeds that settled otherwise (all seeds when none did: then reported only).
    use = [b for b, r in enumerate(base) if not r[7]] or list(range(len(seeds)))
    groups: dict[int, list[int]] = {}
    for b in use:
        groups.setdefault(base[b][6].clusters[1], []).append(b)
    se_iat: dict[int, float] = {}
    tau_of: dict[int, float] = {}
    short: dict[int, str] = {}
    for K, members in groups.items():
        cm = correlated_means(mem.t, [mem.slope[base[b][5] :, b] ** 2 for b in members], same_law=True)
        se_iat |= dict(zip(members, (float(v) for v in cm.se)))
        tau_of |= dict.fromkeys(members, cm.tau_int)
        if not cm.trusted and not cm.tau_int > 0:
            msg = (
                f"no correlation time for its window: the autocorrelation sum of |dF|^2 (pooled over {len(members)} "
                f"seeds in {K} cluster{'s' if K != 1 else ''}) went negative ({cm.tau_int:.3g}), so its error is unknown"
            )
            short |= dict.fromkeys(members, msg)
        elif not cm.trusted:
            msg = (
                f"the window is too short for its correlation time: tau_int of |dF|^2 = {cm.tau_int:.3g} (pooled over "
                f"{len(members)} seeds in {K} cluster{'s' if K != 1 else ''}), pooled window {cm.length_taus:.3g} "
                f"tau_int < {MIN_TAUS:g}"
                + ("" if cm.window_closed else " (Sokal's window did not close: the seeds' means differ or drift)")
            )
            short |= dict.fromkeys(members, msg)
    # Seeds outside every group (left out by the window or in transition) carry the largest group's tau_int.
    main_tau = tau_of[max(groups.values(), key=len)[0]]
    out = []
    for b, s in enumerate(seeds):
        tau, win, floor, se_batch, ab, _, state, why = base[b]
        if b in short:
            why = [*why, short[b]]
        if b not in known:
            known[b] = predicted_floor(mem.x[-1, b], mem.A_bar, mem.c, p.draws, draw_seed + 7919 * b)
        pred, pse = known[b]
        cc = state.clusters
        closed = single_cluster_constant(beta, mem.c, d) / H if cc[1] == 1 else None
        out.append(
            SeedFloor(
                s, floor, se_iat.get(b, math.nan), ab, tau, (win.start, win.end), cc, not why, "; ".join(why), pred,
                pse, closed, tau_of.get(b, main_tau), se_batch, state,
            )
        )  # fmt: skip
    return out


def _run_set(
    name: str, sc: HeadsParams, seeds: list[int], seed: int, progress: Progress | None, count: list[int]
) -> SetResult:
    """One parameter set: the runs of every ``H``, the sequential design's further batches at the tail's ``H``,
    the per-seed floors, the exponent fit and the constant checks. ``count``: ``[done, total]`` of the progress bar."""
    unsettled: list[UnsettledSeed] = []
    Hs = np.array(sorted(set(sc.heads.counts)), dtype=float)
    if len(Hs) < 2:
        raise InputError(f"heads.counts needs at least two different numbers of heads; got {sc.heads.counts}")
    per_H: list[list[SeedFloor]] = []
    mems: dict[int, Members] = {}
    known: dict[int, dict[int, tuple[float, float]]] = {}
    row_seeds: dict[int, list[int]] = {}
    for H in Hs:
        h = int(H)
        if progress:
            progress(count[0], count[1], f"set {name}: H = {h} ({len(seeds)} seeds)")
        mems[h], known[h], row_seeds[h] = _run_members(sc, h, seeds), {}, list(seeds)
        per_H.append(_seed_floors(mems[h], sc, h, row_seeds[h], seed + 104729 * h, known[h]))
        count[0] += 1
    # The sequential design: while the ratio's CI straddles the midpoint between the prediction and the
    # competing law, add a batch of as many seeds at the tail's H, as long as the interval's width says a
    # decision lies within the seed_batches budget. More seeds also lengthen the pooled window tau_int is
    # trusted on.
    S, cap_b, tail_H, batches = len(seeds), sc.seed_batches, [int(h) for h in Hs[-sc.tail :]], 1
    while True:
        floors, ab, pred, settled = _arrays(per_H, S * batches)
        # The projection is recorded on the fit (results.json's seed_batches.needed, the report's note).
        fit = _exponent_fit(Hs, floors, ab, pred, settled, sc.tail, seed).with_batches(batches)
        if not adds_batch(fit, batches, cap_b):
            break
        new = [seed + batches * S + s for s in range(S)]
        count[1] += len(tail_H)
        for i, H in enumerate(Hs):
            h = int(H)
            if h not in tail_H:
                continue
            if progress:
                progress(
                    count[0], count[1], f"set {name}: H = {h}, seeds batch {batches + 1} of at most {cap_b} (undecided)"
                )
            mems[h] = mems[h].joined(_run_members(sc, h, new))
            row_seeds[h] += new
            per_H[i] = _seed_floors(mems[h], sc, h, row_seeds[h], seed + 104729 * h, known[h])
            count[0] += 1
        batches += 1
    for H, row in zip(Hs, per_H):
        unsettled += [
            UnsettledSeed(
                name, int(H), r.seed, r.why, r.floor, r.predicted, tuple(r.clusters), r.state.kind if r.state else None
            )
            for r in row
            if not r.settled
        ]
    tail_rows = [r for H, row in zip(Hs, per_H) if H in fit.main.tail_H for r in row if r.settled]
    return SetResult(
        sc, Hs.astype(int).tolist(), floors, ab, pred, settled, per_H, fit, batches, S, _constant_check(tail_rows),
        _constant_check(tail_rows, CONTROL_FACTOR), _config_run_length(sc), unsettled,
    )  # fmt: skip


def experiment_heads(
    cfg: HeadsParams | Mapping[str, Any],
    *,
    seed: int = 0,
    progress: Progress | None = None,
    user_sets: list[str] | None = None,
    quick: bool = False,
) -> ExperimentResult:
    """Per-seed floor constants and the 1/H law per parameter set; ``quick``: the competing-laws criterion."""
    start = time.perf_counter()
    params = heads_params(cfg)
    sets = _set_configs(params, user_sets or [])
    seeds = [seed + s for s in range(params.seeds)]
    total = sum(len(c.heads.counts) for c in sets.values())
    results: dict[str, SetResult] = {}
    preds: list[Prediction] = []
    unsettled: list[UnsettledSeed] = []
    count = [0, total]
    for name, sc in sets.items():
        results[name] = _run_set(name, sc, seeds, seed, progress, count)
        unsettled += results[name].unsettled
        preds += set_predictions(name, results[name])
    fig = figure(results, seeds)
    # Sets that needed more seed batches have more columns: pad every set to the most seeds used.
    n_all = max(r.floor.shape[1] for r in results.values())
    seeds = [seed + s for s in range(n_all)]
    for r in results.values():
        pad = ((0, 0), (0, n_all - r.floor.shape[1]))
        r.floor = np.pad(r.floor, pad, constant_values=math.nan)
        r.abs_slope = np.pad(r.abs_slope, pad, constant_values=math.nan)
        r.predicted = np.pad(r.predicted, pad, constant_values=math.nan)
        r.settled = np.pad(r.settled, pad, constant_values=False)
    ds = xr.Dataset(
        {f"floor_{n}": (("H_" + n, "seed"), r.floor) for n, r in results.items()}
        | {f"predicted_{n}": (("H_" + n, "seed"), r.predicted) for n, r in results.items()}
        | {f"settled_{n}": (("H_" + n, "seed"), r.settled.astype(np.int8)) for n, r in results.items()}
        | {f"abs_slope_{n}": (("H_" + n, "seed"), r.abs_slope) for n, r in results.items()},
        coords={"seed": seeds, **{"H_" + n: r.H for n, r in results.items()}},
        attrs={"exponent": float(e)} if math.isfinite(e := results["base"].main.exponent) else {},
    )
    describe(ds, variables(list(results)))
    res = ExperimentResult(
        "heads",
        headline(results, seeds, unsettled),
        preds,
        figures={"heads": fig},
        configs=[],
        dataset=ds,
        parameters=params.to_dict(),
        notes=notes(unsettled),
    )
    if progress:
        progress(count[1], count[1], "done")
    res.seconds = time.perf_counter() - start
    return res
