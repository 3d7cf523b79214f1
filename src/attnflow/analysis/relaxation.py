"""How a cloud relaxes to rest: its time scales, its relaxation modes, and whether it has settled.

Time scales are the run's own: :func:`relaxation_time` is the ``1/e`` time of the energy's approach to its
late level, and the late window starts :data:`WINDOW_TAUS` of them in (never before half the run,
:func:`late_window`), so a window never depends on a parameter that can exceed the run. A single cluster at
its resting point ``x*`` relaxes along the modes of :func:`cluster_modes` (rates ``g_m``; the slowest,
:func:`slow_rate`, sets the settling window ``[3 (tau + 1/g), T]`` of :func:`settling_window`); an antipodal
pair of clusters along those of :func:`pair_modes`.

The cloud has settled when ``max_t W2(mu_t, mu_T)`` over the settling window is below
``SETTLED_FRACTION W2(mu_0, mu_T) + WANDER_FACTOR w_H`` (:class:`Settling`, :func:`settling`), ``w_H`` the
finite-``H`` wander (measured by replica runs: :func:`attnflow.experiments.relax_runs.wander_scale`).

Moved here from ``attnflow.experiments.relaxation`` and ``attnflow.experiments.floors`` (issue 42), which
import these names back.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch

from attnflow.analysis.distances import wasserstein_sphere
from attnflow.analysis.stationary import tangent_bases
from attnflow.core.errors import NumericalError
from attnflow.dynamics.infinite import GaussianHeads
from attnflow.weights.processes import OrnsteinUhlenbeck

#: The late window starts this many relaxation times into the run (e^-3: 5% of the energy's
#: initial distance to its late level is left), and never before half of the run.
WINDOW_TAUS = 3.0
#: A window shorter than this many relaxation times cannot tell a floor from a slow approach.
MIN_WINDOW_TAUS = 1.0


def relaxation_time(t: np.ndarray, energy: np.ndarray, tail: float = 0.1) -> float:
    """``tau``: the first time ``|F(t) - F_late| <= |F(0) - F_late| / e``, ``F_late`` the mean energy over
    the last ``tail`` of the run (``inf`` when the energy never gets there; 0 when it does not move)."""
    t, F = np.asarray(t, float), np.asarray(energy, float)
    late = F[t >= t[-1] - tail * (t[-1] - t[0])].mean()
    gap = abs(F[0] - late)
    if gap == 0.0:
        return 0.0
    inside = np.flatnonzero(np.abs(F - late) <= gap / math.e)
    return float(t[inside[0]]) if len(inside) else math.inf


@dataclasses.dataclass(frozen=True)
class Window:
    """The late window ``[start, end]`` in units of the relaxation time ``tau``; ``ok`` when long enough."""

    start: float
    end: float
    tau: float

    @property
    def length_taus(self) -> float:
        return (self.end - self.start) / self.tau if self.tau > 0 else math.inf

    @property
    def ok(self) -> bool:
        return math.isfinite(self.tau) and self.length_taus >= MIN_WINDOW_TAUS


def late_window(t: np.ndarray, tau: float) -> Window:
    """The window ``[max(WINDOW_TAUS tau, T/2), T]`` of a run on the saved times ``t``."""
    T0, T = float(t[0]), float(t[-1])
    start = max(WINDOW_TAUS * tau, T0 + 0.5 * (T - T0)) if math.isfinite(tau) else T
    return Window(min(start, T), T, tau)


#: The cloud has settled when, over the late window, it stays within this fraction of its whole displacement
#: of its final state, plus :data:`WANDER_FACTOR` times the wander scale of the heads' finite-H noise.
SETTLED_FRACTION = 0.1
#: The settling bound's allowance for the finite-H wander: :data:`WANDER_FACTOR` times ``w_H``, the rms over
#: :data:`WANDER_REPLICAS` replicas of ``W2`` between the run's final cloud and a replica run with independent
#: heads' noise from the run's state one memory time before the settling window (:func:`wander_scale`). A
#: common deterministic drift cancels in ``w_H``; the noise-driven wander does not. A settled cloud's largest
#: late distance ``max_t W2(mu_t, mu_T)`` is one path's wander over lags up to the window length: in
#: expectation ``1/sqrt(2)`` of ``w_H`` (two independent paths) times at most ~1.6 (the largest lag's
#: excursion over its end value), so about ``0.7 .. 1.1 w_H``; the factor 2 covers that and the scatter of an
#: rms of a few replicas (stated before any run was measured with it).
WANDER_FACTOR = 2.0


@dataclasses.dataclass(frozen=True)
class ClusterModes:
    """A single cluster's resting point ``x*`` under heads with means ``A_bar`` and its linearised relaxation:
    ``rates`` ``g_m`` (ascending) and ``vectors`` ``(d, d-1)``, column ``m`` the tangent unit vector ``u_m`` at
    ``x*`` along which a displacement decays like ``exp(-g_m t)`` (:func:`cluster_modes`)."""

    x: np.ndarray
    rates: np.ndarray
    vectors: np.ndarray


def cluster_modes(A_bar: np.ndarray, x0: np.ndarray | None = None) -> ClusterModes:
    """The resting point ``x*`` of a single cluster under heads with means ``A_bar`` ``(H, d, d)`` (model ``gf``,
    ``V = A``; the same for the OU limit law ``Theta_inf``, whose Gaussian spread shifts both terms below by
    ``c^2``) and its relaxation modes (:class:`ClusterModes`).

    A cluster at ``x`` moves by the Riemannian gradient of ``G(x) = 1/2 log (1/H) sum_h exp(x^T Abar_h x)``;
    ``x*`` is the maximiser reached by ascent from ``x0`` (default: the top eigenvector of the mean). The
    linearised flow ``delta' = -J delta`` has ``J = lambda I - P (Abar_pi + 2 Cov_pi(Abar_h x*)) P`` on the
    tangent space (the Riemannian Hessian of ``-G``, symmetric: the modes are orthogonal), ``pi_h`` the heads'
    weights ``exp(x*^T Abar_h x*)`` normalised and ``lambda = x*^T Abar_pi x*``; its eigenpairs are
    ``(g_m, u_m)``.
    """
    A = np.asarray(A_bar, dtype=np.float64)
    if x0 is None:
        x = np.linalg.eigh(A.mean(0))[1][:, -1]
    else:
        x = np.asarray(x0, dtype=np.float64) / np.linalg.norm(x0)
    for _ in range(500):
        q = np.einsum("i,hij,j->h", x, A, x)
        pi = np.exp(q - q.max())
        pi /= pi.sum()
        y = np.einsum("h,hij,j->i", pi, A, x)
        y = y + (abs(float(y @ x)) + 1.0) * x  # a shifted power step: ascent of G on the sphere
        y /= np.linalg.norm(y)
        if np.linalg.norm(y - x) < 1e-13:
            x = y
            break
        x = y
    q = np.einsum("i,hij,j->h", x, A, x)
    pi = np.exp(q - q.max())
    pi /= pi.sum()
    A_pi = np.einsum("h,hij->ij", pi, A)
    Ax = np.einsum("hij,j->hi", A, x)
    dev = Ax - pi @ Ax
    hess = A_pi + 2.0 * np.einsum("h,hi,hj->ij", pi, dev, dev)
    basis = tangent_bases_np(x[None])[0]
    lam = float(x @ A_pi @ x)
    rates, vecs = np.linalg.eigh(lam * np.eye(len(x) - 1) - basis.T @ hess @ basis)
    return ClusterModes(x=x, rates=rates, vectors=basis @ vecs)


def slow_rate(A_bar: np.ndarray) -> float:
    """``g``: the slowest relaxation rate of a single cluster at its resting point under heads with means
    ``A_bar`` ``(H, d, d)`` (model ``gf``, ``V = A``; the same for the OU limit law ``Theta_inf``): the smallest
    of :func:`cluster_modes`' rates. With one head it is the gap ``lambda_1 - lambda_2`` of the mean: a nearly
    degenerate mean is a nearly flat direction, along which the cluster relaxes like ``exp(-g t)``, long after
    the energy did.
    """
    return float(cluster_modes(A_bar).rates.min())


#: Two clusters form an antipodal pair when the inner product of their centres is below ``-1 + ANTIPODAL_TOL``
#: (within about 2.6 degrees of antipodal): the pair's rest point under unequal masses is antipodal to ~1e-7 in
#: that inner product (the validated configurations), a settled pair's centres a few token widths off it. Row 2's
#: end state asks it of the cloud; the linear response (:func:`following_scale`) asks it of the rest point Newton
#: reaches from the cloud's centres, because the heads' noise holds a settled pair off its rest point by its
#: wander (5-10 degrees at ``H = 8``, ``sigma = 0.3``), which no fixed angle knows.
ANTIPODAL_TOL = 1e-3


@dataclasses.dataclass(frozen=True)
class PairModes:
    """Two point clusters at rest, ``x`` ``(2, d)`` with masses ``masses``, and their linearised relaxation
    (:func:`pair_modes`): ``rates`` ``g_m`` (ascending, ``2 (d - 1)`` of them) and ``vectors`` ``(2, d, 2 (d - 1))``,
    mode ``m`` moving cluster ``k`` along ``vectors[k, :, m]`` (tangent at ``x[k]``); the modes are orthonormal in
    the metric ``sum_k metric[k] |u^k|^2``, ``metric[k] = m_k S(x_k)`` (the mobility metric of :func:`metric_speed`:
    ``|dF|^2 = sum_k metric[k] |v(x_k)|^2``)."""

    x: np.ndarray
    masses: np.ndarray
    rates: np.ndarray
    vectors: np.ndarray
    metric: np.ndarray


def tangent_bases_np(z: np.ndarray) -> np.ndarray:
    """``(k, d, d-1)`` orthonormal bases of the tangent spaces at the unit rows of ``z``
    (:func:`attnflow.analysis.stationary.tangent_bases`, in NumPy)."""
    return tangent_bases(torch.from_numpy(np.ascontiguousarray(z, dtype=np.float64))).numpy()


def pair_modes(law: GaussianHeads, centres: np.ndarray, masses: np.ndarray, *, step: float = 1e-6) -> PairModes:
    """The rest point of two point clusters of masses ``masses`` under the limit law ``law`` (model ``gf``; Newton
    from ``centres`` ``(2, d)``) and its relaxation modes (:class:`PairModes`).

    The clusters move by the law's ``gf`` field at their positions (:meth:`GaussianHeads.velocity`, tokens of
    masses ``m_k``); ``J`` is minus its Jacobian in tangent coordinates (central differences of the library's
    field, step ``step``). The flow is the gradient flow of ``F`` in the metric ``M = diag(m_k S(x_k))``, so ``J``
    is self-adjoint in ``M``: its eigenpairs ``(g_m, u_m)`` with ``<u_m, u_n>_M = delta_mn``. For equal masses the
    field is odd under ``x -> -x`` and the weights even, so an antipodal pair co-rotates rigidly (``v(-x) = -v(x)``)
    and the heads' finite-``H`` field forces only the co-rotating modes; unequal masses shift the rest point off
    antipodal (~1e-7) and couple both clusters' modes, which the metric eigenproblem keeps.
    Raises :class:`NumericalError` when Newton does not reach rest (field above ``1e-10``) or ``J`` is not
    self-adjoint in ``M`` (the flow is then not the gradient flow this rests on).
    """
    z = np.asarray(centres, dtype=np.float64)
    z = z / np.linalg.norm(z, axis=1, keepdims=True)
    m = np.asarray(masses, dtype=np.float64)
    n = z.shape[1] - 1

    def coords(zz: np.ndarray, B: np.ndarray) -> np.ndarray:
        v = np.asarray(law.velocity(zz, token_weights=m))
        return np.concatenate([B[k].T @ v[k] for k in range(2)])

    def jacobian(zz: np.ndarray, B: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        D = np.zeros((2 * n, 2 * n))
        for k in range(2):
            for j in range(n):
                side = []
                for sgn in (1.0, -1.0):
                    w = zz.copy()
                    w[k] = w[k] + sgn * step * B[k][:, j]
                    w[k] /= np.linalg.norm(w[k])
                    side.append(coords(w, B))
                D[:, k * n + j] = (side[0] - side[1]) / (2.0 * step)
        return coords(zz, B), D

    for _ in range(50):
        B = tangent_bases_np(z)
        t0, D = jacobian(z, B)
        if np.abs(t0).max() < 1e-13:
            break
        delta = -np.linalg.lstsq(D, t0, rcond=None)[0]
        for k in range(2):
            z[k] = z[k] + B[k] @ delta[k * n : (k + 1) * n]
            z[k] /= np.linalg.norm(z[k])
    B = tangent_bases_np(z)
    t0, D = jacobian(z, B)
    if not np.abs(t0).max() < 1e-10:
        raise NumericalError(f"the pair's rest point was not reached (field {float(np.abs(t0).max()):.3g})")
    metric = m * np.asarray(law.partition(z, token_weights=m))
    root = np.sqrt(np.repeat(metric, n))
    K = root[:, None] * -D / root[None, :]
    if not np.abs(K - K.T).max() <= 1e-6 * np.abs(K).max():
        raise NumericalError("the pair's linearised flow is not self-adjoint in the mobility metric")
    rates, W = np.linalg.eigh(0.5 * (K + K.T))
    U = W / root[:, None]
    vectors = np.stack([B[k] @ U[k * n : (k + 1) * n] for k in range(2)])
    return PairModes(x=z, masses=m, rates=rates, vectors=vectors, metric=metric)


def settling_window(t: np.ndarray, tau: float, tau_slow: float) -> Window:
    """The settling window ``[max(WINDOW_TAUS (tau + tau_slow), T/2), T]``, long enough when it holds
    ``MIN_WINDOW_TAUS`` of ``max(tau, tau_slow)``.

    The slow mode starts relaxing once the cluster has formed, about when the energy has (``WINDOW_TAUS tau``),
    and from an amplitude of order one (the cluster forms anywhere): it needs ``WINDOW_TAUS`` of its own time
    ``tau_slow = 1/g`` after that."""
    T0, T = float(t[0]), float(t[-1])
    if not (math.isfinite(tau) and math.isfinite(tau_slow)):
        return Window(T, T, math.inf)
    start = max(WINDOW_TAUS * (tau + tau_slow), T0 + 0.5 * (T - T0))
    return Window(min(start, T), T, max(tau, tau_slow))


def window_indices(traj, win: Window) -> np.ndarray:
    return np.flatnonzero(traj.t >= win.start - 1e-12)


def transient_window(t: np.ndarray, tau: float, taus: float = WINDOW_TAUS) -> np.ndarray:
    """Indices of the transient ``[0, taus tau)`` (default ``WINDOW_TAUS = 3``), ``tau`` the run's relaxation time:
    the cloud before it relaxed (the cluster forms in about ``tau``). At least the first two saved states."""
    t = np.asarray(t)
    n = int(np.count_nonzero(t < taus * tau)) if math.isfinite(tau) else len(t) // 2
    return np.arange(max(2, min(n, len(t))))


def settling_distances(traj, idx: np.ndarray) -> tuple[np.ndarray, float]:
    """``W2(mu_t, mu_T)`` over the window ``idx`` and the whole displacement ``W2(mu_0, mu_T)``."""
    a = traj.token_weights
    w = np.array([wasserstein_sphere(traj.x[-1], traj.x[k], a=a, b=a).value for k in idx])
    return w, float(wasserstein_sphere(traj.x[-1], traj.x[0], a=a, b=a).value)


@dataclasses.dataclass(frozen=True)
class Settling:
    """The settling check of one run over its late window: the largest late distance to the final state
    ``late = max_t W2(mu_t, mu_T)`` against ``bound = SETTLED_FRACTION displacement + WANDER_FACTOR wander``."""

    late: float
    displacement: float
    wander: float

    @property
    def bound(self) -> float:
        return SETTLED_FRACTION * self.displacement + WANDER_FACTOR * self.wander

    @property
    def ratio(self) -> float:
        """``late / bound``: below 1 the run has settled."""
        return self.late / self.bound if self.bound > 0 else math.inf

    def text(self) -> str:
        return (
            f"max W2(mu_t, mu_T) = {format(self.late, '.3g')} = {format(self.ratio, '.3g')} x bound ({SETTLED_FRACTION:g} x displacement "
            f"{format(self.displacement, '.3g')} + {WANDER_FACTOR:g} x finite-H wander {format(self.wander, '.3g')})"
        )


def settling(traj, start: float, wander: float) -> Settling:
    """:class:`Settling` of ``traj`` (anything with ``t``, ``x``, ``token_weights``) over ``t >= start``, with the
    wander scale ``wander`` (:func:`wander_scale`)."""
    late, full = settling_distances(traj, np.flatnonzero(np.asarray(traj.t) >= start - 1e-12))
    return Settling(float(late.max()), full, float(wander))


def antipodal_pair(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, float] | None:
    """``(labels, centres, inner)`` of a two-cluster cloud split by the sign of ``x_i . x_0`` (each cluster's
    tokens within 60 degrees of its centre), or None when the split is not clean."""
    side = x @ x[0]
    if np.abs(side).min() <= 0.5:
        return None
    labels = (side < 0).astype(int)
    centres = np.stack([x[labels == k].mean(0) for k in range(2)])
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    return labels, centres, float(centres[0] @ centres[1])


def rest_pair(split: tuple[np.ndarray, np.ndarray, float], n: int, law: GaussianHeads) -> PairModes | None:
    """The modes (:func:`pair_modes`, Newton from the centres) of the two-cluster split ``split`` of ``n`` tokens
    (:func:`antipodal_pair`) under ``law``, or None when the rest point is not reached, is not antipodal within
    :data:`ANTIPODAL_TOL`, or has a mode that does not relax (a saddle). The cloud's own centres may sit off it by
    the heads' noise."""
    labels, centres, _ = split
    try:
        pair = pair_modes(law, centres, np.bincount(labels, minlength=2) / n)
    except NumericalError:
        return None
    if not float(pair.x[0] @ pair.x[1]) < -1.0 + ANTIPODAL_TOL:
        return None
    return pair if pair.rates.min() > 0 else None


def pair_slow_time(x: np.ndarray, ou: OrnsteinUhlenbeck) -> float:
    """``1 / min_m g_m`` of an antipodal pair's modes (:func:`pair_modes` for the law ``Theta_inf``, Newton from the
    cloud's two centres; 0 when its rest point is not reached or a rate is not positive). The pair's relative modes,
    where the clusters' mutual attraction lowers the rate, can be slower than a single cluster's ``g``."""
    split = antipodal_pair(x)
    pair = None if split is None else rest_pair(split, len(x), GaussianHeads.create(ou.A_bar, ou.stationary_scale))
    return 0.0 if pair is None else 1.0 / float(pair.rates.min())
