"""The slope scales of a cloud at rest under ``H`` OU heads: the floor ``s_H`` and the following scale ``s_follow``.

The slope ``|dF|(mu_t, Theta_t)`` (the cloud's metric speed) is judged against the finite-``H`` floor scale
``s_H`` (:func:`floor_scale`): the rms slope that ``H`` heads drawn from the stationary law give a cloud at
the limit's stationary point. A settled single cluster follows its fluctuating heads, so its slope for the
limit law ``Theta_inf`` is ``s_follow <= s_H`` (:func:`following_scale`, linear response along the cluster's
relaxation modes, :func:`attnflow.analysis.relaxation.cluster_modes`); so does an antipodal pair of clusters
(the pair's modes, :func:`attnflow.analysis.relaxation.pair_modes`); any other cloud of several clusters
keeps ``s_H``. :func:`rest_distance` is the cloud's distance from the rest configuration those modes belong to.

Moved here from ``attnflow.experiments.relaxation`` (issue 42), which imports these names back.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator

import numpy as np
import torch

from attnflow.analysis.diagnostics import count_clusters
from attnflow.analysis.limits import stationarity
from attnflow.analysis.relaxation import ANTIPODAL_TOL, antipodal_pair, cluster_modes, rest_pair
from attnflow.core.geometry import geodesic_distance
from attnflow.dynamics.fields import metric_speed
from attnflow.dynamics.fields import velocity as field_velocity
from attnflow.dynamics.infinite import GaussianHeads
from attnflow.weights.processes import OrnsteinUhlenbeck


def floor_scale(x_ref: np.ndarray, ou: OrnsteinUhlenbeck, draws: int, seed: int) -> float:
    """``s_H``: rms over ``draws`` independent draws of ``|dF|(mu_ref, Theta^(H))``, ``Theta^(H)`` the empirical
    law of ``H`` heads ``A_h = Abar_h + c S_h`` drawn from the OU stationary law (``c = sigma / sqrt(2 rate)``).

    With ``mu_ref`` a stationary point of the limiting energy ``F(., Theta_inf)``, that is the slope the
    heads' finite-``H`` fluctuation alone gives a cloud at rest: the scale of the floor (it vanishes like
    ``H^(-1/2)``). A cloud that follows the heads sits lower; one that does not settle sits far above.
    """
    s = np.array([stationarity(x_ref, A).slope for A in stationary_draws(ou, draws, seed)])
    return float(np.sqrt(np.mean(s**2)))


def stationary_draws(ou: OrnsteinUhlenbeck, draws: int, seed: int) -> Iterator[np.ndarray]:
    """``draws`` independent sets of ``H`` heads ``A_h = Abar_h + c S_h`` from the OU stationary law
    (``c = sigma / sqrt(2 rate)``): the draws behind :func:`floor_scale` and :func:`following_scale`, the same
    ones for the same ``seed``."""
    c = ou.stationary_scale
    rng = np.random.default_rng(seed)
    for _ in range(draws):
        yield ou.A_bar + c * ou.noise(rng)


@dataclasses.dataclass(frozen=True)
class FollowingScale:
    """The late slope scale a settled single cluster, or antipodal pair of clusters, shows for the limit law
    ``Theta_inf`` while its heads fluctuate (:func:`following_scale`).

    ``follow`` is ``s_follow = (sum_m E[f_m^2] g_m / (g_m + r) + normal_sq)^{1/2}`` (``nan`` when the cloud is
    neither one cluster nor an antipodal pair), ``s_H`` the factor-1 floor scale of the same draws
    (:func:`floor_scale`), ``mode_sq`` the ``E[f_m^2]`` per mode (slope units), ``normal_sq`` the rest of ``s_H^2``
    (off the modes: the clusters' width, kept at factor 1), ``rates`` the modes' ``g_m``, ``rate`` the heads'
    ``r``, ``angle`` the largest angle in degrees between a cluster's centre and the rest point its modes belong
    to, ``kind`` ``"single"``, ``"antipodal pair"`` or ``""`` (the fallback), ``inner`` the inner product of the
    two centres of a two-cluster cloud (``nan`` otherwise; antipodal below ``-1 + ANTIPODAL_TOL``), ``rest`` the
    rest points ``x*_k`` ``(k, d)`` the modes belong to and ``labels`` each token's cluster ``k(i)`` (None for the
    fallback).
    """

    follow: float
    s_H: float
    clusters: int
    rate: float
    rates: np.ndarray
    mode_sq: np.ndarray
    normal_sq: float
    angle: float
    kind: str = "single"
    inner: float = math.nan
    angular_sq: np.ndarray | None = None
    rest: np.ndarray | None = None
    labels: np.ndarray | None = None

    @property
    def single(self) -> bool:
        """The final cloud is one cluster."""
        return self.clusters == 1

    @property
    def applies(self) -> bool:
        """The linear response applies: one cluster or an antipodal pair of clusters."""
        return self.kind != ""

    @property
    def scale(self) -> float:
        """``s_follow`` for one cluster or an antipodal pair, else ``s_H`` (the fallback)."""
        return self.follow if self.applies else self.s_H

    @property
    def name(self) -> str:
        """The scale's name in rows and results: ``s_follow``, ``s_follow (antipodal pair)`` or ``s_H``."""
        return {"single": "s_follow", "antipodal pair": "s_follow (antipodal pair)"}.get(self.kind, "s_H")

    @property
    def factors(self) -> np.ndarray:
        """``g_m / (g_m + r)``: the fraction of each mode's field variance the cluster's slope keeps."""
        return self.rates / (self.rates + self.rate)

    @property
    def wander(self) -> np.ndarray:
        """``(E[phi_m^2] / (g_m (g_m + r)))^{1/2}``, radians: the rms angle by which a cloud that follows its heads
        is displaced along each mode (the same linear response as ``s_follow``: the stationary variance of
        ``delta_m' = -g_m delta_m + f_m``), ``phi_m`` the forcing in plain angular units (:attr:`angular_sq`; the
        slope units of :attr:`mode_sq` carry the mobility). Where it is comparable to the way the cloud relaxed,
        the heads' noise moves the cloud as far as relaxing does, and no slope test over the run can tell them
        apart. ``nan`` for the fallback."""
        if self.angular_sq is None:
            return np.full(len(self.rates), math.nan)
        return np.sqrt(self.angular_sq / (self.rates * (self.rates + self.rate)))

    @property
    def wander_total(self) -> float:
        """``w_follow = (sum_m wander_m^2)^{1/2}``, radians: the rms distance :func:`rest_distance` by which a cloud
        that follows its heads sits from its rest configuration (linear response, :attr:`wander`)."""
        return float(np.sqrt(np.sum(self.wander**2)))

    def table(self) -> list[dict[str, float]]:
        """One row per mode: ``g``, ``E[f^2]``, ``g / (g + r)``, the rms displacement (:attr:`wander`)."""
        return [
            {"rate": float(g), "field_sq": float(f), "factor": float(k), "wander": float(w)}
            for g, f, k, w in zip(self.rates, self.mode_sq, self.factors, self.wander)
        ]

    def describe(self) -> str:
        if not self.applies:
            why = (
                f"(centres' inner product {format(self.inner, '.3g')}) whose rest pair Newton does not reach, is not antipodal "
                f"within {ANTIPODAL_TOL:g} or has a mode that does not relax (a saddle)"
                if self.clusters == 2 and math.isfinite(self.inner)
                else "neither one cluster nor an antipodal pair"
            )
            return (
                f"the final cloud is {self.clusters} clusters, {why}: the linear response does not apply, "
                f"so the tolerance falls back to s_H = {format(self.s_H, '.3g')}"
            )
        what = (
            ""
            if self.single
            else f" of the antipodal pair (1 + centres' inner product = {format(1.0 + self.inner, '.3g')})"
        )
        return (
            f"s_follow{what} = {format(self.follow, '.3g')} = {format(self.follow / self.s_H, '.3g')} s_H (s_H = {format(self.s_H, '.3g')}; modes g = "
            f"{', '.join(format(float(g), '.3g') for g in self.rates)} against the heads' rate r = {format(self.rate, '.3g')})"
        )


def following_scale(x_ref: np.ndarray, ou: OrnsteinUhlenbeck, draws: int, seed: int) -> FollowingScale:
    """``s_follow``: the rms slope ``|dF|(mu_t, Theta_inf)`` of a settled single cluster, or antipodal pair of
    clusters, whose ``H`` OU heads fluctuate around the limit law (linear response), with ``s_H``
    (:func:`floor_scale`, the same draws).

    Single cluster: at the resting point ``x*`` (:func:`cluster_modes`, ascent from the cloud's centre) the heads'
    finite-``H`` field ``f(t)`` is, to first order, linear in their OU deviations: an OU process with the heads'
    rate ``r``. Along each mode ``delta_m' = -g_m delta_m + f_m``, and the cluster's slope for ``Theta_inf`` is
    ``g_m delta_m``, of stationary variance ``E[f_m^2] g_m / (g_m + r)`` (OU input of rate ``r`` through a
    first-order filter of rate ``g_m``). ``E[f_m^2]`` is the Monte Carlo of :func:`floor_scale` projected on
    ``u_m`` (all tokens of one cluster share one velocity): ``||(v . u_m) u_m||_mu^2`` of the ``gf`` field of
    ``H`` heads ``A_bar + c S`` drawn from the stationary law.

    Antipodal pair (two clusters from whose centres Newton reaches a rest pair antipodal within ``ANTIPODAL_TOL``
    all of whose modes relax, any masses; the centres themselves may sit off it by the heads' noise): the
    same with the pair's modes (:func:`pair_modes` for the law ``Theta_inf``, Newton from the two centres), which
    are orthonormal in the mobility metric ``M``; the slope is ``|J delta|_M`` and the forcing's mode component is
    ``f_m = <u_m, f>_M = sum_i a_i S(x_i) u^{k(i)}_m . v(x_i)`` (``S`` the law's, ``k(i)`` token ``i``'s cluster).

    Anything else (more clusters, a pair whose rest point is not reached, is not antipodal or has a mode that
    does not relax) gets ``follow = nan`` and :attr:`FollowingScale.scale` falls back to ``s_H``.
    """
    x_ref = np.asarray(x_ref, dtype=np.float64)
    clusters = count_clusters(torch.from_numpy(x_ref))
    c = ou.stationary_scale
    centre = x_ref.mean(0)
    modes = cluster_modes(ou.A_bar, centre if np.linalg.norm(centre) > 0 else None)
    law = GaussianHeads.create(ou.A_bar, c)
    split = antipodal_pair(x_ref) if clusters == 2 else None
    inner = math.nan if split is None else split[2]
    pair = None if split is None else rest_pair(split, len(x_ref), law)
    if pair is not None and split is not None:
        labels, centres, _ = split
        S = np.asarray(law.partition(x_ref))
        U = pair.vectors[labels]  # (N, d, modes): each token's cluster's mode vectors
    U1 = modes.vectors
    slope_sq, mode_sq, vel_sq = [], [], []
    for A in stationary_draws(ou, draws, seed):  # the same draws as floor_scale
        slope_sq.append(stationarity(x_ref, A).slope ** 2)
        if clusters == 1:
            v = np.asarray(field_velocity(x_ref, A, model="gf"))
            along = v @ U1  # (N, d-1): each token's velocity on the modes
            mode_sq.append(
                [float(metric_speed(x_ref, along[:, m : m + 1] * U1[:, m], A)) ** 2 for m in range(U1.shape[1])]
            )
            vel_sq.append(np.mean(along**2, axis=0))
        elif pair is not None:
            v = np.asarray(field_velocity(x_ref, A, model="gf"))
            f = np.einsum("i,id,idm->m", S / len(x_ref), v, U)
            mode_sq.append(f**2)
    s_H = float(np.sqrt(np.mean(slope_sq)))
    if clusters == 1:
        rates = modes.rates
        cos = abs(float(centre @ modes.x)) / max(float(np.linalg.norm(centre)), 1e-300)
        angle = math.degrees(math.acos(min(1.0, cos)))
        kind = "single"
        rest, rest_labels = modes.x[None], np.zeros(len(x_ref), dtype=int)
    elif pair is not None:
        rates = pair.rates
        cos = min(float(centres[k] @ pair.x[k]) for k in range(2))
        angle = math.degrees(math.acos(min(1.0, cos)))
        kind = "antipodal pair"
        rest, rest_labels = pair.x, labels
    else:  # no one centre or pair, no one rest point: only s_H
        nan = np.full(len(modes.rates), math.nan)
        return FollowingScale(math.nan, s_H, clusters, ou.rate, modes.rates, nan, math.nan, math.nan, "", inner)
    f2 = np.mean(np.asarray(mode_sq), axis=0)
    normal = max(s_H**2 - float(f2.sum()), 0.0)
    follow = math.sqrt(float((f2 * rates / (rates + ou.rate)).sum()) + normal)
    if clusters == 1:
        angular = np.mean(np.asarray(vel_sq), axis=0)
    else:  # M-coordinates to the tokens' mass-weighted angles: |u_m|^2 averaged over the clusters' masses
        assert pair is not None
        angular = f2 * np.einsum("k,kdm->m", pair.masses, pair.vectors**2)
    return FollowingScale(
        follow, s_H, clusters, ou.rate, rates, f2, normal, angle, kind, inner, angular, rest, rest_labels
    )  # fmt: skip


def rest_distance(x: np.ndarray, weights: np.ndarray | None, fs: FollowingScale) -> float:
    """``D(mu, x*) = (sum_i a_i d(x_i, x*_{k(i)})^2)^{1/2}``, radians: the distance of the cloud ``x`` (token weights
    ``a``, uniform when None) from the rest configuration of :func:`following_scale` (``fs.rest``), each token to
    the rest point of its cluster ``k(i)`` (``fs.labels``). For a cloud of point clusters it is the mass-weighted
    rms angle of the clusters from their rest points, the quantity whose linear-response value is
    :attr:`FollowingScale.wander_total`."""
    if fs.rest is None or fs.labels is None:
        raise ValueError("rest_distance needs a single cluster or an antipodal pair (FollowingScale.applies)")
    x = np.asarray(x, dtype=np.float64)
    a = np.full(len(x), 1.0 / len(x)) if weights is None else np.asarray(weights, dtype=np.float64) / np.sum(weights)
    d = geodesic_distance(torch.from_numpy(x), torch.from_numpy(np.asarray(fs.rest)[fs.labels])).numpy()
    return float(np.sqrt(np.sum(a * d**2)))
