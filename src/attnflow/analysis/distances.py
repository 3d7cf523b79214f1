"""Distances between token clouds: W2 on the sphere and the weighted distance ``W_b`` of docs/model.md.

* :func:`wasserstein_sphere`: ``W_2(mu, nu)`` for the geodesic cost ``d(x, y) = arccos <x, y>``
  (exact through POT's network simplex up to ``exact_max`` tokens, entropic or sliced above).
* :func:`weighted_wasserstein_bounds`: ``exp(-alpha/2) W_2 <= W_b <= exp(alpha/2) W_2`` with
  ``alpha = max_h ||A_h||_op`` (because ``exp(-alpha) <= b <= exp(alpha)`` on the sphere).
* :func:`weighted_wasserstein`: an upper estimate of ``W_b`` by minimising the discrete action of
  particle paths (one particle per atom of the optimal W2 plan).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from attnflow.core.arrays import ArrayLike, to_numpy
from attnflow.core.errors import InputError
from attnflow.core.geometry import geodesic_distance_sq, pairwise_geodesic_distance_sq, retract, slerp
from attnflow.core.heads import Heads
from attnflow.dynamics.fields import FieldStats, masses, prepare
from attnflow.kernels.dense import dense_stats

METHODS = ("auto", "exact", "sinkhorn", "sliced")


@dataclass(frozen=True)
class DistanceResult:
    """A distance ``value`` (not squared) and how it was obtained (``method``, plus details)."""

    value: float
    method: str
    plan: np.ndarray | None = None
    info: dict | None = None


def _cloud(x: ArrayLike, name: str) -> np.ndarray:
    arr = np.asarray(to_numpy(x), dtype=np.float64)
    if arr.ndim != 2:
        raise InputError(f"{name} must have shape (N, d); got {arr.shape}")
    if not np.isfinite(arr).all():
        raise InputError(f"{name} contains NaN or inf")
    nrm = np.linalg.norm(arr, axis=1, keepdims=True)
    if np.abs(nrm - 1.0).max() > 1e-6:
        raise InputError(f"{name} must lie on the unit sphere (largest | |x_i| - 1 | is {np.abs(nrm - 1).max():.3g})")
    return arr / nrm


def _masses(m: ArrayLike | None, n: int, name: str) -> np.ndarray:
    ref = torch.zeros(1, dtype=torch.float64)
    return masses(m, n, name, ref).numpy()


def geodesic_cost(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``M_ij = d(x_i, y_j)^2`` (:func:`attnflow.core.geometry.pairwise_geodesic_distance_sq`)."""
    return pairwise_geodesic_distance_sq(x, y)


def wasserstein_sphere(
    x: ArrayLike,
    y: ArrayLike,
    *,
    a: ArrayLike | None = None,
    b: ArrayLike | None = None,
    method: str = "auto",
    exact_max: int = 3000,
    reg: float = 2e-3,
    n_projections: int = 200,
    seed: int | None = 0,
) -> DistanceResult:
    """``W_2(mu, nu) = (min_pi sum_ij pi_ij d(x_i, y_j)^2)^{1/2}`` with the great-circle distance ``d``.

    ``x`` ``(N, d)``, ``y`` ``(M, d)`` on the sphere, masses ``a``, ``b`` (uniform by default).
    ``method``: ``exact`` (POT ``emd``), ``sinkhorn`` (log-domain entropic OT with ``reg`` times
    ``max M``; its value is the transport cost of the entropic plan, an upper bound on ``W_2``),
    ``sliced`` (POT's spherical sliced Wasserstein, a different, smaller metric: use it to compare
    clouds, not as ``W_2``), or ``auto`` (exact up to ``exact_max`` tokens, sinkhorn above).
    """
    import ot  # POT: imported here so that ``import attnflow`` does not pay for it

    if method not in METHODS:
        raise InputError(f"unknown method {method!r}; choose one of {METHODS}")
    X, Y = _cloud(x, "x"), _cloud(y, "y")
    if X.shape[1] != Y.shape[1]:
        raise InputError(f"x and y live in different dimensions: {X.shape[1]} and {Y.shape[1]}")
    pa, pb = _masses(a, X.shape[0], "a"), _masses(b, Y.shape[0], "b")
    if method == "auto":
        method = "exact" if max(len(X), len(Y)) <= exact_max else "sinkhorn"
    if method == "sliced":
        val = ot.sliced_wasserstein_sphere(X, Y, pa, pb, n_projections=n_projections, p=2, seed=seed)
        return DistanceResult(float(val), "sliced")
    M = geodesic_cost(X, Y)
    if method == "exact":
        plan = ot.emd(pa, pb, M, numItermax=10_000_000)
        return DistanceResult(float(np.sqrt(max((plan * M).sum(), 0.0))), "exact", plan)
    plan = ot.sinkhorn(pa, pb, M, reg * float(M.max()), method="sinkhorn_log", numItermax=100_000, stopThr=1e-9)
    return DistanceResult(float(np.sqrt(max((plan * M).sum(), 0.0))), "sinkhorn", plan, {"reg": reg * float(M.max())})


def _alpha(A) -> float:
    heads = (
        A if isinstance(A, Heads) else Heads.from_matrices(torch.as_tensor(np.asarray(to_numpy(A), dtype=np.float64)))
    )
    return float(torch.linalg.matrix_norm(heads.A.to(torch.float64), ord=2).max())


def weighted_wasserstein_bounds(
    x: ArrayLike, y: ArrayLike, A, *, a: ArrayLike | None = None, b: ArrayLike | None = None, **w2_options
) -> tuple[float, float]:
    """``(exp(-alpha/2) W_2, exp(alpha/2) W_2)`` with ``alpha = max_h ||A_h||_op``: the bounds on ``W_b``.

    They hold for any head masses, because ``exp(-alpha) <= b(x) <= exp(alpha)`` on the sphere.
    """
    w2 = wasserstein_sphere(x, y, a=a, b=b, **w2_options).value
    alpha = _alpha(A)
    return float(np.exp(-alpha / 2) * w2), float(np.exp(alpha / 2) * w2)


def weighted_wasserstein(
    x: ArrayLike,
    y: ArrayLike,
    A,
    *,
    a: ArrayLike | None = None,
    b: ArrayLike | None = None,
    head_weights: ArrayLike | None = None,
    n_segments: int = 8,
    max_iter: int = 200,
) -> DistanceResult:
    """Upper estimate of ``W_b(mu, nu)`` by the discrete action of particle paths.

    Each atom ``pi_pq > 0`` of the optimal ``W_2`` plan becomes a particle of mass ``pi_pq`` moving
    from ``x_p`` to ``y_q`` through ``n_segments - 1`` free points ``z_k`` on the sphere; the action

        sum_k n_segments * sum_particles m d(z_k, z_{k+1})^2 (1/b_k + 1/b_{k+1}) / 2,

    with ``b_k`` the mobility of the moving measure ``mu_k = sum m delta_{z_k}`` under heads ``A``,
    is minimised over the free points (L-BFGS, starting from the geodesics). Returns its square
    root. With constant mobility ``b = 1`` (``A = 0``) the geodesics are optimal and the value is
    ``W_2``; in general it lies in :func:`weighted_wasserstein_bounds`.
    """
    if n_segments < 1:
        raise InputError(f"n_segments must be a positive integer; got {n_segments}")
    w2 = wasserstein_sphere(x, y, a=a, b=b, method="exact")
    plan = w2.plan
    assert plan is not None  # the exact method returns its plan
    ip, iq = np.nonzero(plan > 1e-14 * plan.max())
    m = torch.from_numpy(plan[ip, iq] / plan[ip, iq].sum())
    X, Y = _cloud(x, "x"), _cloud(y, "y")
    p0, p1 = torch.from_numpy(X[ip]), torch.from_numpy(Y[iq])
    _, heads, _, w = prepare(p0, A, None, None, head_weights, energy_only=True)
    s = torch.linspace(0.0, 1.0, n_segments + 1, dtype=torch.float64)
    path0 = slerp(p0, p1, s)  # (K+1, n, d)
    logm = torch.log(m)

    def inv_b(z: torch.Tensor) -> torch.Tensor:
        # 1/b = sum_h w_h Z_h; a batch of K+1 measures through the kernel's leading batch dims.
        q, k = heads.factors(z)
        _, logZ = dense_stats(q, k, None, logm.expand(z.shape[0], -1))
        return FieldStats(out=None, logZ=logZ, log_w=torch.log(w)).inverse_mobility()

    def action(inner: torch.Tensor) -> torch.Tensor:
        z = torch.cat([p0[None], retract(inner), p1[None]], dim=0)
        ib = inv_b(z)
        d2 = geodesic_distance_sq(z[:-1], z[1:])
        return n_segments * (m * d2 * 0.5 * (ib[:-1] + ib[1:])).sum()

    inner = path0[1:-1].clone().requires_grad_(True)
    iters = 0
    if n_segments > 1 and max_iter > 0:
        opt = torch.optim.LBFGS(
            [inner],
            lr=1.0,
            max_iter=max_iter,
            tolerance_grad=1e-12,
            tolerance_change=1e-16,
            history_size=20,
            line_search_fn="strong_wolfe",
        )

        def closure():
            opt.zero_grad()
            f = action(inner)
            f.backward()
            return f

        with torch.no_grad():
            start = float(action(inner))
        opt.step(closure)
        iters = int(opt.state[inner].get("n_iter", 0))
    with torch.no_grad():
        val = float(action(inner))
    if n_segments > 1 and max_iter > 0:
        val = min(val, start)
    return DistanceResult(
        float(np.sqrt(val)),
        "particle-action",
        None,
        {"W2": w2.value, "n_segments": n_segments, "iterations": iters, "particles": len(m)},
    )
