"""Criteria as objects: each decides PASS / FAIL / UNDECIDED from an :class:`Estimate` and states its margin.

An :class:`Estimate` is a number with its own error: ``value``, ``stderr`` and, when the error is not
Gaussian (a percentile bootstrap), its own interval ``ci``; ``n`` is the number of points a fitted
quantity rests on (an exponent fitted on fewer than three points is never decided). Every decision
reads the estimate's interval ``[lo, hi]`` (``ci``, else ``value +- z stderr`` at :data:`LEVEL`):

* :class:`Below` ``(x)``: PASS when ``hi < x``, FAIL when ``lo > x``, UNDECIDED when the interval holds ``x``.
* :class:`Above` ``(x)``: the mirror of :class:`Below`.
* :class:`Within` ``(target, tol)``: PASS when the interval lies inside ``[target - tol, target + tol]``,
  FAIL when it lies wholly outside, UNDECIDED when it straddles an edge.
* :class:`Exponent` ``(target, competitor)``: see its docstring; two-sided, so a law steeper than the
  target fails as surely as the competing shallower one.

The margin is signed (positive on the passing side) and in units of the estimate's own standard error
(``stderr``, or the interval's half-width over ``z``); an exact number (zero error) is measured in units of
the criterion's own scale (``|x|``, ``tol``, the half-gap) instead, and the unit is printed with it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy import stats as _stats

#: The level of every interval a criterion reads (two-sided).
LEVEL = 0.95
#: Fewer points than this and a fitted exponent is not decided: two points always lie on a line.
MIN_FIT_POINTS = 3

Outcome = Literal["PASS", "FAIL", "UNDECIDED"]


@dataclass(frozen=True)
class Estimate:
    """A measured number with its standard error (``nan``: unknown); optionally its own interval ``ci`` at
    :data:`LEVEL` (e.g. a bootstrap percentile interval) and the number of points ``n`` it was fitted on."""

    value: float
    stderr: float = 0.0
    n: int | None = None
    ci: tuple[float, float] | None = None

    @property
    def interval(self) -> tuple[float, float]:
        """``ci`` if given, else ``value +- z stderr`` (``z`` the normal quantile at :data:`LEVEL`)."""
        if self.ci is not None:
            return float(self.ci[0]), float(self.ci[1])
        h = _z() * self.stderr
        return float(self.value - h), float(self.value + h)

    @property
    def error(self) -> float:
        """The unit of margins: ``stderr``, else the interval's half-width over ``z`` (``0``: exact)."""
        if math.isfinite(self.stderr) and self.stderr > 0:
            return float(self.stderr)
        if self.ci is not None:
            return float((self.ci[1] - self.ci[0]) / (2 * _z()))
        return 0.0

    @property
    def finite(self) -> bool:
        lo, hi = self.interval
        return all(math.isfinite(v) for v in (self.value, lo, hi))

    def __str__(self) -> str:
        lo, hi = self.interval
        n = f", {self.n} points" if self.n is not None else ""
        if self.ci is None and self.error == 0:
            return f"{self.value:.4g}{n}"
        return f"{self.value:.4g} [{lo:.4g}, {hi:.4g}]{n}"


def _z() -> float:
    return float(_stats.norm.ppf(0.5 + LEVEL / 2))


@dataclass(frozen=True)
class Verdict:
    """A criterion's decision on one estimate: ``outcome``, the signed ``margin`` (positive on the passing
    side) in ``unit`` (``"stderr"`` or ``"scale"``) and one sentence ``why``."""

    outcome: Outcome
    margin: float
    unit: str
    why: str

    @property
    def passed(self) -> bool:
        return self.outcome == "PASS"

    @property
    def failed(self) -> bool:
        return self.outcome == "FAIL"

    def __str__(self) -> str:
        return f"{self.outcome} (margin {self.margin:.2g} {self.unit}): {self.why}"


def _undecided(why: str) -> Verdict:
    return Verdict("UNDECIDED", math.nan, "stderr", why)


def _unit(est: Estimate, scale: float) -> tuple[float, str]:
    e = est.error
    if e > 0:
        return e, "stderr"
    return (abs(scale) if scale != 0 and math.isfinite(scale) else 1.0), "scale"


class Criterion:
    """Decides an :class:`Estimate` (:meth:`decide`) and states itself in words (``str``)."""

    def decide(self, est: Estimate) -> Verdict:
        raise NotImplementedError

    def precheck(self, est: Estimate) -> Verdict | None:
        """A verdict given before the interval is read (e.g. too few points), or ``None``."""
        return None

    def __call__(self, est: Estimate) -> Verdict:
        early = self.precheck(est)
        if early is not None:
            return early
        if not est.finite:
            return _undecided(f"no finite estimate ({est})")
        return self.decide(est)


@dataclass(frozen=True)
class Below(Criterion):
    """The quantity lies below ``x``: PASS when the whole interval does, FAIL when the whole interval lies
    above, UNDECIDED when it holds ``x``. Margin ``(x - value) / stderr``."""

    x: float

    def decide(self, est: Estimate) -> Verdict:
        lo, hi = est.interval
        u, unit = _unit(est, self.x)
        m = (self.x - est.value) / u
        if hi < self.x:
            return Verdict("PASS", m, unit, f"{est} lies below {self.x:g}")
        if lo > self.x:
            return Verdict("FAIL", m, unit, f"{est} lies above {self.x:g}")
        return Verdict("UNDECIDED", m, unit, f"{est} holds {self.x:g}")

    def __str__(self) -> str:
        return f"below {self.x:g} (the {LEVEL:.0%} interval)"


@dataclass(frozen=True)
class Above(Criterion):
    """The mirror of :class:`Below`: PASS when the whole interval lies above ``x``."""

    x: float

    def decide(self, est: Estimate) -> Verdict:
        lo, hi = est.interval
        u, unit = _unit(est, self.x)
        m = (est.value - self.x) / u
        if lo > self.x:
            return Verdict("PASS", m, unit, f"{est} lies above {self.x:g}")
        if hi < self.x:
            return Verdict("FAIL", m, unit, f"{est} lies below {self.x:g}")
        return Verdict("UNDECIDED", m, unit, f"{est} holds {self.x:g}")

    def __str__(self) -> str:
        return f"above {self.x:g} (the {LEVEL:.0%} interval)"


@dataclass(frozen=True)
class Within(Criterion):
    """``|quantity - target| <= tol``: PASS when the interval lies inside ``[target - tol, target + tol]``,
    FAIL when it lies wholly outside it, UNDECIDED when it straddles an edge. Margin
    ``(tol - |value - target|) / stderr``."""

    target: float
    tol: float

    def __post_init__(self) -> None:
        if not self.tol > 0:
            raise ValueError(f"Within needs tol > 0; got {self.tol}")

    def decide(self, est: Estimate) -> Verdict:
        lo, hi = est.interval
        a, b = self.target - self.tol, self.target + self.tol
        u, unit = _unit(est, self.tol)
        m = (self.tol - abs(est.value - self.target)) / u
        if a <= lo and hi <= b:
            return Verdict("PASS", m, unit, f"{est} lies within {self.tol:g} of {self.target:g}")
        if hi < a or lo > b:
            return Verdict("FAIL", m, unit, f"{est} lies outside [{a:.4g}, {b:.4g}]")
        return Verdict("UNDECIDED", m, unit, f"{est} straddles an edge of [{a:.4g}, {b:.4g}]")

    def __str__(self) -> str:
        return f"within {self.tol:g} of {self.target:g} (the {LEVEL:.0%} interval)"


@dataclass(frozen=True)
class Exponent(Criterion):
    """A power law's exponent is ``target``, tested against a ``competitor`` law, on both sides.

    The claim is read at the resolution the competitor sets: ``h = |target - competitor| / 2``, half the
    gap between the two laws, and the window ``(target - h, target + h)``, symmetric about the target. With
    the estimate's interval ``[lo, hi]``:

    * PASS when the interval lies inside the window: every plausible exponent is nearer the target than
      any law ``h`` or more away from it, the competitor's side and the other one alike.
    * FAIL when the interval reaches outside the window and excludes ``target``: the claimed exponent is
      rejected, whether the data sit at the competitor or beyond the target on the other side
      (``-1.31 [-1.50, -1.15]`` fails ``Exponent(-1, competitor=-0.5)`` as surely as ``-0.5`` does).
    * UNDECIDED when the interval reaches outside the window but holds ``target`` (too wide: more data),
      or when the estimate rests on fewer than :data:`MIN_FIT_POINTS` points (``n``; two points always lie
      on a line) or on no ``n`` at all.

    A narrow interval inside the window that just misses the target (``[-1.06, -1.01]``) is a PASS at this
    resolution: a correct law's 95% interval misses its target in one draw of twenty, and an exact-target
    rule would fail it that often. Margin: ``(h - max(target - lo, hi - target)) / stderr``, how far the
    interval lies inside the window (negative: it reaches out of it).
    """

    target: float
    competitor: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.target) and math.isfinite(self.competitor)) or self.target == self.competitor:
            raise ValueError(f"Exponent needs finite target != competitor; got {self.target}, {self.competitor}")

    @property
    def half_gap(self) -> float:
        return 0.5 * abs(self.target - self.competitor)

    def precheck(self, est: Estimate) -> Verdict | None:
        if est.n is None or est.n < MIN_FIT_POINTS:
            return _undecided(
                f"an exponent fitted on {est.n if est.n is not None else 'an unknown number of'} points "
                f"(fewer than {MIN_FIT_POINTS}) decides nothing"
            )
        return None

    def decide(self, est: Estimate) -> Verdict:
        lo, hi = est.interval
        t, h = self.target, self.half_gap
        u, unit = _unit(est, h)
        window = h - max(t - lo, hi - t)  # > 0: the interval lies inside the window
        m = window / u
        if window > 0:
            return Verdict("PASS", m, unit, f"{est} lies within {h:.3g} of {t:g}")
        if not lo <= t <= hi:
            side = "the competitor's side" if (est.value - t) * (self.competitor - t) > 0 else "the far side"
            return Verdict("FAIL", m, unit, f"{est} excludes {t:g} and reaches {h:.3g} from it (on {side})")
        return Verdict("UNDECIDED", m, unit, f"{est} holds {t:g} but reaches {h:.3g} from it: too wide")

    def __str__(self) -> str:
        return (
            f"exponent {self.target:g} against {self.competitor:g}: the {LEVEL:.0%} interval, on {MIN_FIT_POINTS} or "
            f"more points, lies within {self.half_gap:.3g} of {self.target:g} (PASS) or excludes it reaching beyond (FAIL)"
        )


def fit_exponent(x: np.ndarray, y: np.ndarray, yerr: np.ndarray | None = None) -> Estimate:
    """The exponent ``p`` of ``y = c x^p`` by (weighted) least squares in log-log, with its standard error and
    the Student-``t`` interval at :data:`LEVEL` (``n - 2`` degrees of freedom; ``n`` the points used).

    ``yerr``: standard errors of ``y`` (weights ``y / yerr`` in log space). Points with ``x`` or ``y`` not
    positive and finite are left out. Two points give the exponent with an infinite error (``n = 2``: a
    criterion leaves it undecided)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    ok = np.isfinite(x) & np.isfinite(y) & (x > 0) & (y > 0)
    w = None
    if yerr is not None:
        e = np.asarray(yerr, float)
        ok &= np.isfinite(e) & (e > 0)
        w = (y / e)[ok]
    lx, ly = np.log(x[ok]), np.log(y[ok])
    n = int(ok.sum())
    if n < 2:
        return Estimate(math.nan, math.nan, n)
    if n == 2:  # a line through two points: no residual to measure its error by
        return Estimate(float(np.polyfit(lx, ly, 1, w=w)[0]), math.inf, n, (-math.inf, math.inf))
    coef, cov = np.polyfit(lx, ly, 1, w=w, cov=True)
    p, se = float(coef[0]), float(math.sqrt(cov[0, 0]))
    t = float(_stats.t.ppf(0.5 + LEVEL / 2, n - 2))
    return Estimate(p, se, n, (p - t * se, p + t * se))
