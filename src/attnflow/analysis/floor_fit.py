"""The ``heads`` experiment's analysis: per-seed floor records, tail fits of the floor against ``H``, the
exponent and constant decisions and the sequential design's step (:mod:`attnflow.experiments.heads` runs them).

Pure numbers in, numbers out: each ``(set, H)`` row is a list of :class:`SeedFloor`; the exponent of the ratio
measured / predicted against ``H`` is fitted over the ``tail`` largest ``H`` with settled seeds, over the range
where its local slopes have stopped drifting (:func:`attnflow.verdicts.stats.asymptotic_start`; none:
"pre-asymptotic", undecided), and decided two-sided by :class:`attnflow.verdicts.Exponent`; the per-seed
constant is decided with Sidak's family level (:func:`seed_bound`).

The results are typed records: :class:`TailFit` (one tail fit), :class:`ExponentFit` (the exponent
prediction's four fits and verdicts) and :class:`ConstantCheck` (the per-seed constant criterion).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np
from scipy import stats as _stats

from attnflow.analysis.seed_state import WindowState
from attnflow.verdicts import Estimate, Exponent
from attnflow.verdicts import stats as _vstats
from attnflow.verdicts.margins import MIN_MARGIN, margin_below
from attnflow.verdicts.stats import asymptotic_start, hierarchical_bootstrap, local_slopes, loglog_fit

#: Local exponents within this distance of -1 count as asymptotic (for the "pre-asymptotic range" column).
LOCAL_BAND = 0.2
BOOTSTRAP = 2000
#: The competing law of the exponent criterion (and the law the control plants): floor ``~ H^(-1/2)``.
COMPETING = -0.5
#: The sequential design's ceiling, a compute budget (each batch costs what the tail's ``H`` cost once):
#: seeds are added in batches of ``seeds`` at the tail's ``H`` while the exponent verdict is undecided and
#: the width of the run's own interval says a decision is within reach (:func:`batches_needed`), up to this many
#: batches; undecided when it stops is a FAIL, with the batches a decision would need.
SEED_BATCHES = 12
#: Without a fit (fewer than two ``H`` with settled seeds) there is no interval to project: batches are added
#: up to this many (the design's first budget), since more seeds lengthen the pooled window ``tau_int``
#: needs; a run too short for any seed to settle is not rescued by seeds.
NO_FIT_BATCHES = 3
#: The relative accuracy claimed for the predicted floor constant, stated before measuring: the
#: pooled geometric mean of measured / predicted over the settled tail seeds lies within 1 +- RATIO_TOL
#: (in log: |mean log ratio| <= log(1 + RATIO_TOL)), and each seed within that plus its Gamma quantile at
#: Sidak's level (:func:`seed_bound`, :data:`FAMILY_LEVEL`; ``z_n`` of its standard errors in the Gaussian
#: limit; the window's error from its integrated autocorrelation time, and the Monte Carlo error). What it
#: leaves out: a cluster that climbs its heads' noise sits lower than the frozen-cloud constant (at second order in
#: the noise; measured over 239 ``(set, H)``: no slope, docs/reproduce.md).
RATIO_TOL = 0.2
#: The per-seed bound's level for the whole family of a set's settled tail seeds: the chance that a correct
#: constant fails some seed, whatever their number, is that of one Gaussian error beyond 3 standard
#: errors (two-sided, 0.27%). Each seed's bound is ``z_n`` of its standard errors with Sidak's
#: ``z_n = Phi^-1(1 - (1 - (1 - FAMILY_LEVEL)^(1/n)) / 2)`` (3.0 at one seed, 3.9 at 24, 4.1 at 72): a
#: fixed per-seed 3 would fail a correct constant more often the more seeds the sequential design adds.
FAMILY_LEVEL = 2.0 * float(_stats.norm.sf(3.0))
#: The planted wrong constant of the negative control: the prediction times this factor.
CONTROL_FACTOR = 2.0


@dataclass
class SeedFloor:
    """One seed's late floor, its predicted constant and whether it settled (and why not)."""

    seed: int
    floor: float
    se: float
    abs_slope: float
    tau: float
    window: tuple[float, float]
    clusters: tuple[int, int]
    settled: bool
    why: str
    predicted: float
    predicted_se: float
    closed_form: float | None
    #: The integrated autocorrelation time of ``|dF|^2`` (pooled over the seeds of this ``(set, H)``).
    tau_int: float = math.nan
    #: The batch-means error (:data:`~attnflow.experiments.floors.BATCHES` blocks), for comparison only:
    #: blocks shorter than ``tau_int`` make it too small.
    se_batch: float = math.nan
    #: What the late window rests at (cluster counts, settled or in transition, minimiser or saddle and index).
    state: WindowState | None = None

    @property
    def ratio(self) -> float:
        return self.floor / self.predicted

    @property
    def se_log(self) -> float:
        """Standard error of ``log ratio`` (window and Monte Carlo errors combined)."""
        rel = [v for v in (self.se / self.floor, self.predicted_se / self.predicted) if math.isfinite(v)]
        return math.sqrt(sum(v * v for v in rel))


#: An exponent verdict (:func:`decide`): the ratio's interval passes, fails, or decides nothing yet.
Decision = Literal["pass", "fail", "undecided"]


@dataclass(frozen=True, eq=False)
class TailFit:
    """One :func:`tail_fit`: the fit of ``stat`` of a per-seed quantity ``y`` against ``H`` as ``y ~ c H^p``.

    ``median`` per ``H`` the ``stat`` (median or geometric mean) over settled seeds (``nan`` under two);
    ``local_exponents`` the slopes between neighbouring usable ``H``; ``exponent`` ``p`` and ``prefactor`` ``c``
    of the least-squares fit in log-log over ``fit_H``, ``ci`` ``p``'s 95% bootstrap interval ``[lo, hi]``;
    ``tail_H`` the tail's ``H``, ``fit_H`` its asymptotic range (the end where the local slopes stop drifting),
    ``pre_asymptotic`` when they drift over the whole tail; ``asymptotic_from_H`` the first ``H`` from which
    every local exponent lies within :data:`LOCAL_BAND` of -1 (``None``: none)."""

    median: np.ndarray
    local_exponents: np.ndarray
    exponent: float
    prefactor: float
    ci: list[float]
    tail_H: list[float]
    asymptotic_from_H: int | None
    fit_H: list[float]
    pre_asymptotic: bool


@dataclass(frozen=True, eq=False)
class ExponentFit:
    """One :func:`exponent_fit`: the floor's fit ``main`` and the control's (``<|dF|>``, ``control``), for
    information; the ratio measured / predicted (``ratio``, prediction: exponent 0) and its control
    (``ratio_control``, ``<|dF|> / predicted``); ``predicted_exponent`` ``p`` the predicted constants' own
    exponent, ``gap = -1/2 - p`` (:func:`ratio_gap`), and the verdicts ``decision`` / ``control_decision``
    (:func:`fit_decision`). ``batches_needed``: the sequential design's projection (:func:`batches_needed`)
    at the batches run, recorded by :meth:`with_batches` (``nan`` until then)."""

    main: TailFit
    control: TailFit
    ratio: TailFit
    ratio_control: TailFit
    predicted_exponent: float
    gap: float
    decision: Decision
    control_decision: Decision
    batches_needed: float = math.nan

    def with_batches(self, batches: int) -> ExponentFit:
        """This fit with :attr:`batches_needed` recorded for ``batches`` batches of seeds run."""
        return replace(self, batches_needed=batches_needed(self.ratio.ci, self.gap, batches))


@dataclass(frozen=True, eq=False)
class ConstantCheck:
    """One :func:`constant_check`: over ``n`` settled seeds, ``margin`` (``>= 0``: pass) the smaller of the
    pooled margin and the worst seed's; ``pooled`` the mean of ``log ratio`` and ``pooled_se`` its standard
    error (``nan`` under two seeds); ``z`` Sidak's ``z_n`` (:func:`family_z`), ``ratios`` the seeds' measured /
    predicted; ``worst`` the worst seed as ``(seed, ratio, signed log bound)`` (``None`` without seeds, and
    then ``z`` is ``nan`` and ``ratios`` empty)."""

    n: int
    margin: float
    pooled: float
    pooled_se: float
    worst: tuple[int, float, float] | None
    z: float = math.nan
    ratios: np.ndarray = field(default_factory=lambda: np.array([], dtype=float))


def row_tau(row: list[SeedFloor]) -> float:
    """The ``tau_int`` most of a row's seeds carry (the largest group of seeds resting in as many clusters)."""
    vals = [r.tau_int for r in row]
    return max(vals, key=vals.count)


def seed_medians(vals: np.ndarray, settled: np.ndarray, stat: Any = np.median) -> np.ndarray:
    """Per-``H`` ``stat`` (median) over the settled seeds (``nan`` where fewer than two settled)."""
    return np.array([float(stat(v[m])) if m.sum() >= 2 else math.nan for v, m in zip(vals, settled)], dtype=float)


def tail_fit(
    Hs: np.ndarray,
    per_seed: np.ndarray,
    tail: int,
    rng: np.random.Generator,
    settled: np.ndarray | None = None,
    stat: Any = np.median,
    drift_tol: float = 0.0,
) -> TailFit:
    """Tail fit: local exponents, the least-squares slope of ``stat`` (median; over settled seeds) of
    ``per_seed`` against ``H`` over the asymptotic range of the ``tail`` largest usable ``H``, and its
    bootstrap CI (resampling each ``H``'s settled seeds).

    The asymptotic range is where the tail's local slopes stop drifting, judged by their own bootstrap
    (:func:`attnflow.verdicts.stats.asymptotic_start`, on 3 or more ``H``): ``fit_H`` are the ``H`` fitted
    (the tail, or its end where the slopes settle); ``pre_asymptotic`` when the slopes drift across the whole
    tail (then the fit over the tail is reported, and decides nothing). ``tail_H``: the tail itself.
    ``drift_tol``: drifts within it are not counted (``asymptotic_start``'s ``tol``: the criterion's resolution)."""
    settled = np.ones(per_seed.shape, bool) if settled is None else settled
    med = seed_medians(per_seed, settled, stat)
    use = np.flatnonzero(np.isfinite(med))
    Hu, mu = Hs[use], med[use]
    local = local_slopes(Hu, mu) if len(use) > 1 else np.array([])
    k = min(tail, len(use))
    if k < 2:
        return TailFit(
            median=med, local_exponents=local, exponent=math.nan, prefactor=math.nan, ci=[math.nan, math.nan],
            tail_H=Hu[-k:].tolist() if k else [], asymptotic_from_H=None, fit_H=Hu[-k:].tolist() if k else [],
            pre_asymptotic=False,
        )  # fmt: skip
    Ht = Hu[-k:]
    rows = [per_seed[i][settled[i]] for i in use[-k:]]
    # One resampling gives both the tail's points (for the fit) and its local slopes (for the range).
    pts = hierarchical_bootstrap(rows, lambda g: np.array([stat(r) for r in g]), n_boot=BOOTSTRAP, rng=rng)
    local_b = np.log(pts[:, 1:] / pts[:, :-1]) / np.log(Ht[1:] / Ht[:-1])  # local_slopes of each replicate
    s0 = asymptotic_start(local_slopes(Ht, mu[-k:]), local_b, tol=drift_tol) if k >= 3 else 0
    j = 0 if s0 is None else s0
    p, c = loglog_fit(Ht[j:], mu[-k:][j:])
    boots = np.array([loglog_fit(Ht[j:], b[j:])[0] for b in pts])
    lo, hi = (float(v) for v in np.percentile(boots, [2.5, 97.5]))
    start = None
    for i in range(len(local)):
        if np.all(np.abs(local[i:] + 1.0) <= LOCAL_BAND):
            start = int(Hu[i])
            break
    return TailFit(
        median=med,
        local_exponents=local,
        exponent=p,
        prefactor=c,
        ci=[lo, hi],
        tail_H=Ht.tolist(),
        asymptotic_from_H=start,
        fit_H=Ht[j:].tolist(),
        pre_asymptotic=s0 is None,
    )


def geomean(v: np.ndarray) -> float:
    return float(np.exp(np.mean(np.log(v))))


def ratio_gap(predicted_exponent: float) -> float:
    """The distance between the prediction (the ratio's exponent 0) and the competing law ``H^(-1/2)``
    seen through the ratio: ``-1/2 - p``, ``p`` the predicted constants' own exponent (about 1/2)."""
    return COMPETING - predicted_exponent if math.isfinite(predicted_exponent) else math.nan


def decide(ci: list[float], gap: float, n: int | None = None) -> Decision:
    """The exponent verdict on a 95% interval ``ci`` of the ratio's exponent fitted on ``n`` values of ``H``
    (stated before measuring), two-sided: :class:`attnflow.verdicts.Exponent` ``(0, competitor=gap)``.
    ``"pass"`` when the interval lies inside ``(-gap/2, gap/2)`` by at least the report's minimum margin
    (:data:`~attnflow.experiments.common.MIN_MARGIN`, in units of ``gap / 2``: a smaller margin is no PASS);
    ``"fail"`` when it reaches outside that window and excludes 0, on the competing law's side or beyond the
    prediction on the other (a floor falling like ``H^-1.3`` fails as surely as one like ``H^-1/2``);
    ``"undecided"`` otherwise (too wide; fewer than three ``H``; no fit; no positive gap): then more seeds
    are needed (the sequential design)."""
    lo, hi = ci
    if not (math.isfinite(lo) and math.isfinite(hi) and math.isfinite(gap)) or gap <= 0:
        return "undecided"
    v = Exponent(0.0, competitor=gap)(Estimate(0.5 * (lo + hi), math.nan, n, (lo, hi)))
    if v.outcome == "FAIL":
        return "fail"
    if v.outcome == "PASS" and ratio_margin(ci, gap) >= MIN_MARGIN:
        return "pass"
    return "undecided"


def batches_needed(ci: list[float], gap: float, batches: int) -> float:
    """The batches at which the interval would decide whichever of the two laws holds: its half-width
    ``(hi - lo) / 2`` shrinks like ``1/sqrt(seeds)``, and an interval centred on the prediction (exponent 0)
    passes once the half-width is below ``gap/2 (1 - MIN_MARGIN)`` (one centred on the competing law fails
    once it is below ``gap/2``, a weaker demand). The estimate's own location is not used: it is a draw,
    and a projection that took it for the truth would stop exactly the runs whose first batch landed near
    the midpoint. ``nan`` without a fit, ``inf`` without a positive gap."""
    return _vstats.batches_needed(ci, 0.5 * gap * (1.0 - MIN_MARGIN), batches)


def adds_batch(fit: ExponentFit, batches: int, cap: int) -> bool:
    """The sequential design's step: whether a further batch of seeds runs after ``batches`` of them, i.e. the
    exponent verdict is open, the budget ``cap`` is not spent and :func:`batches_needed` (of ``fit.ratio.ci``
    and ``fit.gap`` at ``batches``; :meth:`ExponentFit.with_batches` records it) says a decision is within it
    (without a fit, up to :data:`NO_FIT_BATCHES`). ``fit`` is not changed.

    Open: undecided, or a FAIL that is not decisive, i.e. an interval that excludes 0 but still reaches
    inside ``(-gap/2, gap/2)`` (:func:`decisive`). A correct law's first 8 seeds exclude 0 in some 5% of
    draws; more seeds bring its interval back over 0, while a wrong law's narrows away from 0 and leaves the
    window, so the FAIL stands either way with the budget. The verdict is the last fit's, as before."""
    need = batches_needed(fit.ratio.ci, fit.gap, batches)
    open_ = fit.decision == "undecided" or (fit.decision == "fail" and not decisive(fit.ratio.ci, fit.gap))
    return _vstats.more_batches(open_, batches, cap, need, NO_FIT_BATCHES)


def decisive(ci: list[float], gap: float) -> bool:
    """Whether the interval lies wholly outside ``(-gap/2, gap/2)``: closer to another law than to 0 throughout."""
    lo, hi = ci
    h = 0.5 * gap
    return bool(lo >= h or hi <= -h)


def ratio_margin(ci: list[float], gap: float) -> float:
    """The two-sided margin of the interval, in units of ``gap / 2``: how far it lies inside
    ``(-gap/2, gap/2)`` (negative: it reaches the midpoint to the competing law, or as far on the other side)."""
    if not (all(math.isfinite(v) for v in ci) and math.isfinite(gap)) or gap <= 0:
        return -math.inf
    lo, hi = ci
    h = 0.5 * gap
    return float((h - max(-lo, hi)) / h)


def floor_arrays(per_H: list[list[SeedFloor]], n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Floors, late ``|dF|`` means, predicted floors and settled flags ``(len(H), n)``; rows with fewer
    seeds (``H`` outside the tail, which got no further batch) padded with ``nan`` and not settled."""

    def pad(vals: list[float]) -> list[float]:
        return vals + [math.nan] * (n - len(vals))

    floors = np.array([pad([r.floor for r in row]) for row in per_H])
    ab = np.array([pad([r.abs_slope for r in row]) for row in per_H])
    pred = np.array([pad([r.predicted for r in row]) for row in per_H])
    settled = np.array([[r.settled for r in row] + [False] * (n - len(row)) for row in per_H])
    return floors, ab, pred, settled


def exponent_fit(
    Hs: np.ndarray,
    floors: np.ndarray,
    ab: np.ndarray,
    pred: np.ndarray,
    settled: np.ndarray,
    tail: int,
    seed: int,
) -> ExponentFit:
    """The exponent prediction's fits over the settled seeds: the ratio measured / predicted (geometric
    mean per ``H``; prediction: exponent 0), its control ``<|dF|> / predicted`` (exponent about +1/2), the
    predicted constants' own exponent ``p`` and the gap ``-1/2 - p`` to the competing law, the verdict
    (:func:`decide`), and for information the floor's and ``<|dF|>``'s own exponents (median fits)."""
    rng = np.random.default_rng(seed)
    # The predicted constants' own exponent over the tail sets the gap, and half the gap the resolution at
    # which a drift of the local slopes counts (a smaller drift cannot move the verdict between the two laws).
    pg = seed_medians(pred, settled, geomean)
    use = [i for i in range(len(Hs)) if math.isfinite(pg[i]) and int(np.sum(settled[i])) >= 2]
    ti = [i for i in use[-tail:] if math.isfinite(pg[i])]
    pe = loglog_fit(Hs[ti], pg[ti])[0] if len(ti) >= 2 else math.nan
    gap = ratio_gap(pe)
    tol = 0.5 * gap if math.isfinite(gap) and gap > 0 else 0.0
    main = tail_fit(Hs, floors, tail, rng, settled, drift_tol=tol)
    ctrl = tail_fit(Hs, ab, tail, rng, settled, drift_tol=tol)
    ratio = tail_fit(Hs, floors / pred, tail, rng, settled, geomean, drift_tol=tol)
    ratio_ctrl = tail_fit(Hs, ab / pred, tail, rng, settled, geomean, drift_tol=tol)
    return ExponentFit(
        main=main,
        control=ctrl,
        ratio=ratio,
        ratio_control=ratio_ctrl,
        predicted_exponent=pe,
        gap=gap,
        decision=fit_decision(ratio, gap),
        control_decision=fit_decision(ratio_ctrl, gap),
    )


def fit_decision(fit: TailFit, gap: float) -> Decision:
    """:func:`decide` on a :func:`tail_fit` over its fitted ``H``; ``"undecided"`` when it is pre-asymptotic
    (the local slopes drift over the whole tail: no exponent to test)."""
    return "undecided" if fit.pre_asymptotic else decide(fit.ci, gap, len(fit.fit_H))


def seed_bound(v: float, se_log: float, n: int, tol: float) -> float:
    """The per-seed bound on ``|log ratio|`` for a seed at ``v = log ratio``: ``tol`` plus the log of its
    Gamma quantile at Sidak's per-seed level for ``n`` seeds (:data:`FAMILY_LEVEL`), on the side of ``v``.

    A window mean of ``|dF|^2`` (a sum of squared Gaussian components) is close to a Gamma variable: under
    the prediction, ratio ``~ Gamma(k, 1/k)`` with ``k = 1 / se_log^2`` (mean 1, the measured relative
    error). Its log is skewed to the left (a low mean is likelier than a high one), which a Gaussian in
    log ratio ignores; for large ``k`` both are ``z_n se_log`` (used beyond ``k = 1e6``, and ``tol`` alone at
    ``se_log = 0``; ``nan`` without an error)."""
    if not math.isfinite(se_log) or se_log < 0:
        return math.nan
    if se_log * se_log < 1e-6:
        return tol + family_z(n) * se_log
    k = 1.0 / (se_log * se_log)
    tail = 0.5 * sidak_level(n)
    q = _stats.gamma.ppf(tail, k, scale=1.0 / k) if v < 0 else _stats.gamma.isf(tail, k, scale=1.0 / k)
    return tol + abs(math.log(q))


def constant_check(rows: list[SeedFloor], factor: float = 1.0) -> ConstantCheck:
    """The per-seed constant criterion on the settled ``rows`` (prediction times ``factor``)."""
    tol = math.log1p(RATIO_TOL)
    if not rows:
        return ConstantCheck(n=0, margin=-math.inf, pooled=math.nan, pooled_se=math.nan, worst=None)
    logs = np.array([math.log(r.floor / (factor * r.predicted)) for r in rows])
    se = np.array([r.se_log for r in rows])
    pooled = float(logs.mean())
    pooled_se = float(logs.std(ddof=1) / math.sqrt(len(logs))) if len(logs) > 1 else math.nan
    bounds = np.array([seed_bound(v, s, len(rows), tol) for v, s in zip(logs, se)])
    per = np.array([margin_below(abs(v), b) for v, b in zip(logs, bounds)])
    margin = float(min(margin_below(abs(pooled), tol), per.min()))
    worst = int(np.argmin(per))
    return ConstantCheck(
        n=len(rows),
        z=family_z(len(rows)),
        margin=margin,
        pooled=pooled,
        pooled_se=pooled_se,
        ratios=np.exp(logs),
        worst=(rows[worst].seed, float(np.exp(logs[worst])), float(math.copysign(bounds[worst], logs[worst]))),
    )


def sidak_level(n: int, level: float = FAMILY_LEVEL) -> float:
    """Sidak's per-seed level ``1 - (1 - level)^(1/n)``: ``n`` independent seeds all pass with probability
    ``1 - level`` (computed without cancellation for tiny levels)."""
    return -math.expm1(math.log1p(-level) / max(n, 1))


def family_z(n: int, level: float = FAMILY_LEVEL) -> float:
    """Sidak's per-seed ``z_n``: ``n`` Gaussian errors all within ``z_n`` with probability ``1 - level``."""
    return float(_stats.norm.isf(sidak_level(n, level) / 2.0))
