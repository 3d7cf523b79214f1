"""Metastability measured: energy plateaus, merge events, the energy staircase, plateau durations.

A clustering flow collapses fast, then rests on metastable plateaus (near saddles of the energy) that
end with merges. On a saved series ``(t_k, F_k)`` (any spacing) attnflow measures:

* the dissipation rate ``r(t) = -dF/dt`` (second-order differences on the saved grid);
* the rate scale of the run, ``r_bar = (F(t_0) - F(t_end)) / (t_end - t_0)`` (its mean dissipation rate),
  and the threshold ``theta = rel_rate * r_bar``: a plateau is a maximal interval on which ``r < theta``
  (and, when a slope series is given, ``|dF|^2 < theta`` as well), its ends placed where ``log r``
  crosses ``log theta`` (interpolated between saves);
* two plateaus separated by a burst that lowers ``F`` by less than ``min_drop`` of the whole drop are one
  plateau (a burst that moves nothing is not an event);
* a plateau that reaches the end of the run is *censored* (its duration is a lower bound: the final rest
  or a plateau not yet left); one that begins at the first save is marked ``from_start``.

A monotone decay with a decreasing rate (exponential, power law) has no closed plateau: its only
low-rate interval reaches the end. Merge events come from the cluster count (a decrease between two
saves, dated at the later one). Everything is a pure function of arrays: tests plant staircases.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from attnflow.core.errors import InputError


@dataclass(frozen=True)
class Plateau:
    """One metastable plateau: ``[start, end]``, its ``duration``, the energy on it (median), the largest
    slope on it (or None), the cluster count on it (most frequent; or None)."""

    start: float
    end: float
    energy: float
    slope: float | None
    clusters: int | None
    censored: bool  # reaches the end of the run: the duration is a lower bound
    from_start: bool  # begins at the first save: the run started at rest

    @property
    def duration(self) -> float:
        return self.end - self.start

    @property
    def closed(self) -> bool:
        """Entered from motion and left again: a metastable plateau with a measured duration."""
        return not (self.censored or self.from_start)


@dataclass(frozen=True)
class Merge:
    """Clusters merged between two saves: the count went from ``before`` to ``after`` at ``time``."""

    time: float
    before: int
    after: int


@dataclass(frozen=True)
class Staircase:
    """The energy staircase of a run: plateaus (in time order), merge events, and the scales used."""

    plateaus: list[Plateau]
    merges: list[Merge]
    threshold: float  # theta = rel_rate * rate_scale
    rate_scale: float  # r_bar = total energy drop / duration
    total_drop: float
    t: np.ndarray = field(repr=False)
    rate: np.ndarray = field(repr=False)

    @property
    def closed(self) -> list[Plateau]:
        return [p for p in self.plateaus if p.closed]

    @property
    def first(self) -> Plateau | None:
        """The first plateau entered from motion (closed or censored), or None: the first metastable rest."""
        return next((p for p in self.plateaus if not p.from_start), None)

    @property
    def levels(self) -> list[float]:
        """The staircase: the energy of each plateau, in time order."""
        return [p.energy for p in self.plateaus]


def energy_rate(t: np.ndarray, energy: np.ndarray) -> np.ndarray:
    """``-dF/dt`` on the saved grid (``numpy.gradient``: second order, any spacing)."""
    return -np.gradient(energy, t, edge_order=2) if len(t) > 2 else -np.gradient(energy, t)


def _validate(t: Any, energy: Any) -> tuple[np.ndarray, np.ndarray]:
    t = np.asarray(t, dtype=np.float64)
    e = np.asarray(energy, dtype=np.float64)
    if t.ndim != 1 or e.shape != t.shape or len(t) < 3:
        raise InputError(f"t and energy must be 1-D series of the same length >= 3; got {t.shape} and {e.shape}")
    if not (np.isfinite(t).all() and np.isfinite(e).all()):
        raise InputError("t and energy must be finite")
    if not (np.diff(t) > 0).all():
        raise InputError("t must be strictly increasing")
    return t, e


def _crossing(t0: float, t1: float, r0: float, r1: float, theta: float) -> float:
    """Where ``log r`` crosses ``log theta`` between two saves (linear interpolation in log r)."""
    lo, hi = math.log(max(r0, 1e-300)), math.log(max(r1, 1e-300))
    if hi == lo:
        return 0.5 * (t0 + t1)
    s = (math.log(theta) - lo) / (hi - lo)
    return t0 + min(max(s, 0.0), 1.0) * (t1 - t0)


def merge_events(t: Any, clusters: Any) -> list[Merge]:
    """Every decrease of the cluster count between consecutive saves, dated at the later save."""
    t = np.asarray(t, dtype=np.float64)
    c = np.asarray(clusters).astype(np.int64)
    return [Merge(float(t[k]), int(c[k - 1]), int(c[k])) for k in range(1, len(c)) if c[k] < c[k - 1]]


def detect_plateaus(
    t: Any,
    energy: Any,
    slope: Any | None = None,
    clusters: Any | None = None,
    *,
    rel_rate: float = 0.1,
    min_drop: float = 1e-3,
) -> Staircase:
    """The energy staircase of a series: plateaus where ``-dF/dt < rel_rate * r_bar`` (module docstring).

    ``t``, ``energy`` ``(S,)``; optional ``slope`` ``|dF|`` and ``clusters`` at the same times. ``r_bar``
    is the run's mean dissipation rate, so the threshold is a scale of the same run. Returns a
    :class:`Staircase`; a run whose energy does not drop has no plateaus (nothing to compare a rate with).
    """
    t, e = _validate(t, energy)
    if not rel_rate > 0 or not 0 <= min_drop < 1:
        raise InputError(f"rel_rate must be > 0 and min_drop in [0, 1); got {rel_rate}, {min_drop}")
    s = None if slope is None else np.asarray(slope, dtype=np.float64)
    c = None if clusters is None else np.asarray(clusters).astype(np.int64)
    for name, arr in (("slope", s), ("clusters", c)):
        if arr is not None and arr.shape != t.shape:
            raise InputError(f"{name} must have the shape of t {t.shape}; got {arr.shape}")
    rate = energy_rate(t, e)
    drop = float(e[0] - e[-1])
    span = float(t[-1] - t[0])
    merges = [] if c is None else merge_events(t, c)
    if not drop > 0:
        return Staircase([], merges, math.nan, 0.0, drop, t, rate)
    scale = drop / span
    theta = rel_rate * scale
    low = rate < theta
    if s is not None:
        low &= s * s < theta
    # Maximal runs of low samples.
    runs: list[list[int]] = []
    k = 0
    n = len(t)
    while k < n:
        if low[k]:
            j = k
            while j + 1 < n and low[j + 1]:
                j += 1
            runs.append([k, j])
            k = j + 1
        else:
            k += 1
    # Join runs separated by a burst that drops the energy by less than min_drop of the whole drop.
    joined: list[list[int]] = []
    for r in runs:
        if joined and e[joined[-1][1]] - e[r[0]] < min_drop * drop:
            joined[-1][1] = r[1]
        else:
            joined.append(list(r))
    plateaus = []
    for i, j in joined:
        if i == j and 0 < i < n - 1:
            continue  # one low sample between two moving ones: a turning point, not a rest
        start = float(t[0]) if i == 0 else _crossing(t[i - 1], t[i], rate[i - 1], rate[i], theta)
        end = float(t[-1]) if j == n - 1 else _crossing(t[j], t[j + 1], rate[j], rate[j + 1], theta)
        on = slice(i, j + 1)
        clusters_on = None
        if c is not None:
            vals, counts = np.unique(c[on], return_counts=True)
            clusters_on = int(vals[np.argmax(counts)])
        plateaus.append(
            Plateau(
                start=start,
                end=end,
                energy=float(np.median(e[on])),
                slope=None if s is None else float(np.max(s[on])),
                clusters=clusters_on,
                censored=j == n - 1,
                from_start=i == 0,
            )
        )
    return Staircase(plateaus, merges, theta, scale, drop, t, rate)


def staircase(traj: Any, *, rel_rate: float = 0.1, min_drop: float = 1e-3) -> Staircase:
    """:func:`detect_plateaus` on a :class:`attnflow.Trajectory`'s saved energy, slope and cluster count
    (the slope is used for ``gf`` runs with constant weights, where ``-dF/dt = |dF|^2``)."""
    d = traj.diagnostics
    if "energy" not in d:
        raise InputError("the trajectory has no energy series (diagnostics['energy'])")
    slope = d.get("slope") if traj.model == "gf" and np.allclose(traj.A, traj.A[:1]) else None
    return detect_plateaus(traj.t, d["energy"], slope, d.get("clusters"), rel_rate=rel_rate, min_drop=min_drop)
