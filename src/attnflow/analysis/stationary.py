"""Stationary points of the energy, classified: index, minimiser or saddle, and the escape direction.

The energy ``F(x) = -1/2 sum_h w_h sum_{i,j} a_i a_j exp(x_i^T A_h x_j)`` on ``(S^{d-1})^N`` is the one of
:mod:`attnflow.dynamics.fields` (:meth:`~attnflow.dynamics.fields.FieldStats.energy`); torch autograd gives
its Euclidean gradient ``G_i`` and Hessian, and the Riemannian Hessian on the tangent spaces is

    Hess F [u]_i = P_{x_i} (D^2 F u)_i - <G_i, x_i> u_i,      u_i in T_{x_i} S^{d-1}

(the projected Euclidean Hessian plus the sphere's curvature term). Eigenvalues are taken in the mass
metric ``<u, u> = sum_i a_i |u_i|^2`` (the particles' Wasserstein metric); the *index* (their number of
negative values) does not depend on the metric at a critical point (Sylvester's law of inertia).

Tokens that have merged (``<x_i, x_j> > 1 - cluster_eps``) are grouped into clusters with centres
``c_k`` and masses ``m_k``. The token-level Hessian at a cluster configuration splits into the *rigid*
block (each cluster moving as one: the Hessian of ``F`` on ``(S^{d-1})^K`` with masses ``m_k``) and, per
cluster, one *splitting* block ``Hess_S (dF/dmu)(c_k)`` repeated ``n_k - 1`` times (docs/model.md,
"Stationary points"). Both come from one autograd Hessian of ``F`` at the configuration with every
cluster doubled into two half-mass copies. The index counts the rigid block's negative eigenvalues
beyond the symmetry directions (the orbit of the rotations ``W`` that commute with every ``A_h``) plus
each merged cluster's unstable splitting directions (counted once per cluster).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from scipy.sparse.csgraph import connected_components

from attnflow.analysis.diagnostics import CLUSTER_GRID_MAX_DIM, component_labels_grid
from attnflow.config import defaults
from attnflow.core.arrays import ArrayLike, like, to_tensor
from attnflow.core.errors import InputError
from attnflow.core.heads import Heads
from attnflow.dynamics.fields import MODELS, field_stats, masses
from attnflow.weights.processes import as_process

#: The most rigid-space coordinates (2 K d for K clusters in R^d) the dense autograd Hessian takes.
MAX_HESSIAN_SIZE = 4000

KINDS = ("minimiser", "saddle")


@dataclass(frozen=True)
class StationaryPoint:
    """What :func:`classify_stationary` finds at a state (eigenvalues in the mass metric ``sum a_i |u_i|^2``).

    ``index``: descent directions beyond symmetry, ``rigid_index + split_index``; ``kind``: ``"saddle"``
    when ``index > 0``, else ``"minimiser"`` (second order: ``degenerate > 0`` zero modes beyond the
    symmetry directions leave it undecided at that order); ``escape``: a tangent direction of unit
    Frobenius norm, shaped like ``x`` (each token moves with its cluster, or a cluster's two halves
    move apart), along the most negative eigenvalue; ``None`` at a minimiser.
    """

    index: int
    kind: str
    escape: ArrayLike | None
    stable: ArrayLike | None  # the same for the most positive eigenvalue: a direction the flow returns from
    eigenvalues: np.ndarray  # the rigid block beyond the symmetry directions, ascending
    split_eigenvalues: dict[int, np.ndarray]  # cluster -> its splitting block's eigenvalues (clusters of >= 2)
    rigid_index: int
    split_index: int
    degenerate: int  # |eigenvalue| <= zero_tol beyond the symmetry directions
    symmetry_directions: int  # dimension of the rotation orbit removed
    symmetry_generators: int  # dimension of {W skew: W A_h = A_h W for all h}
    zero_tol: float
    gradient_norm: float  # (sum_i |P G_i|^2 / a_i)^(1/2): the Riemannian gradient in the mass metric
    relative_gradient: float  # gradient_norm over the same norm of the whole Euclidean gradient
    newton_distance: float  # length of the Newton step to the critical point (radians, mass metric)
    stationary: bool  # newton_distance <= stationary_tol
    energy: float
    centres: np.ndarray  # (K, d)
    cluster_masses: np.ndarray  # (K,)
    labels: np.ndarray  # (N,) cluster of each token
    model: str
    t: float
    notes: list[str] = field(default_factory=list)

    @property
    def clusters(self) -> int:
        return int(len(self.cluster_masses))

    def summary(self) -> dict[str, Any]:
        """JSON-ready summary (no arrays of token size)."""
        return {
            "index": self.index,
            "kind": self.kind,
            "rigid_index": self.rigid_index,
            "split_index": self.split_index,
            "degenerate": self.degenerate,
            "stationary": self.stationary,
            "newton_distance": self.newton_distance,
            "relative_gradient": self.relative_gradient,
            "clusters": self.clusters,
            "cluster_masses": [float(m) for m in self.cluster_masses],
            "symmetry_directions": self.symmetry_directions,
            "lowest_eigenvalue": float(self.lowest_eigenvalue) if math.isfinite(self.lowest_eigenvalue) else None,
            "energy": self.energy,
            "model": self.model,
            "t": self.t,
        }

    @property
    def lowest_eigenvalue(self) -> float:
        vals = [*self.eigenvalues.tolist(), *(v for s in self.split_eigenvalues.values() for v in s.tolist())]
        return min(vals) if vals else math.inf


# ---------------------------------------------------------------------------------------------
# Pieces (public for tests and for users who want the matrices).
# ---------------------------------------------------------------------------------------------


def tangent_bases(x: torch.Tensor) -> torch.Tensor:
    """Orthonormal bases ``B_i`` ``(N, d, d-1)`` of the tangent spaces ``x_i^perp`` (unit rows ``x``)."""
    n, d = x.shape
    # The last d-1 left singular vectors of P_x = I - x x^T span x^perp.
    P = torch.eye(d, dtype=x.dtype, device=x.device) - x[:, :, None] * x[:, None, :]
    U, _, _ = torch.linalg.svd(P)
    return U[:, :, : d - 1]


#: Memory one batch of Hessian rows may take (the batched backward pass keeps ``(rows, H, N, N)``
#: temporaries): the whole Hessian at once took 17.7 GB for 256 unclustered tokens in d = 3.
HESSIAN_BATCH_BYTES = 1 << 30


def _hessian_rows(g: torch.Tensor, y: torch.Tensor, H: int) -> torch.Tensor:
    """``D^2 F`` ``(m, m)`` from the gradient ``g = dF/dy`` (made with ``create_graph``), a batch of rows
    at a time (vector-Jacobian products of ``g``), each batch within :data:`HESSIAN_BATCH_BYTES`."""
    m, n = g.numel(), y.shape[0]
    per_row = 64 * H * n * n  # bytes: about eight (H, N, N) float64 temporaries per row of the batch
    batch = int(max(1, min(m, HESSIAN_BATCH_BYTES // max(per_row, 1))))
    eye = torch.eye(m, dtype=y.dtype, device=y.device)
    rows = []
    for s in range(0, m, batch):
        (h,) = torch.autograd.grad(g, y, grad_outputs=eye[s : s + batch], is_grads_batched=True, retain_graph=True)
        rows.append(h.reshape(-1, m).detach())
    return torch.cat(rows)


def riemannian_hessian(
    x: torch.Tensor, heads: Heads, a: torch.Tensor, w: torch.Tensor, bases: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float]:
    """``(G, R, B, F)``: the Euclidean gradient ``G`` ``(N, d)`` of ``F``, the Riemannian Hessian ``R``
    ``(N(d-1), N(d-1))`` in the tangent bases ``B`` (:func:`tangent_bases`), and ``F`` itself.

    ``R = B^T (D^2 F - diag(<G_i, x_i>) I) B``; plain (unweighted) coordinates: divide by
    ``sqrt(a_i a_j)`` for the mass metric. ``F`` is :meth:`FieldStats.energy` (the one formula).
    """
    n, d = x.shape
    x = x.detach()

    def energy_of(y: torch.Tensor) -> torch.Tensor:
        return field_stats(y, heads, a, w, values=False, backend="flash").energy(a)

    y = x.clone().requires_grad_(True)
    F = energy_of(y)
    (G,) = torch.autograd.grad(F, y, create_graph=True)
    D2 = _hessian_rows(G.reshape(-1), y, heads.H)
    G = G.detach()
    curv = (G * x).sum(-1)  # <G_i, x_i>
    D2 = D2 - torch.diag(curv.repeat_interleave(d))
    B = tangent_bases(x) if bases is None else bases
    Bbig = torch.block_diag(*B)  # (N d, N (d-1))
    R = Bbig.T @ D2 @ Bbig
    return G.detach(), 0.5 * (R + R.T), B, float(F.detach())


def symmetry_generators(heads: Heads, rtol: float = 1e-9) -> np.ndarray:
    """A basis ``(S, d, d)`` of the skew matrices ``W`` with ``W^T A_h + A_h W = 0`` for every head
    (``W A_h = A_h W``, and ``W V_h = V_h W`` when values differ): the rotations ``exp(s W)`` that leave
    the dynamics unchanged. ``S = d(d-1)/2`` for ``A_h = beta I``, ``0`` for generic anisotropic heads."""
    d = heads.d
    mats = [heads.A.detach().cpu().double().numpy()]
    if heads.V is not None:
        mats.append(heads.V.detach().cpu().double().numpy())
    M = np.concatenate(mats)  # (H', d, d)
    pairs = [(p, q) for p in range(d) for q in range(p + 1, d)]
    if not pairs:
        return np.zeros((0, d, d))
    E = np.zeros((len(pairs), d, d))
    for k, (p, q) in enumerate(pairs):
        E[k, p, q], E[k, q, p] = 1.0, -1.0
    # Columns: vec(W^T A + A W) = vec(A E - E A) for each basis element (W^T = -W).
    L = np.stack([(M @ Ek - Ek @ M).ravel() for Ek in E], axis=1)
    scale = max(1.0, float(np.abs(M).max()))
    _, s, Vt = np.linalg.svd(L, full_matrices=True)
    rank = int((s > rtol * scale).sum())
    null = Vt[rank:]  # (S, len(pairs))
    return np.einsum("sk,kij->sij", null, E)


#: Tokens grouped with one dense ``N x N`` comparison; above, the exact grid method of the diagnostics.
DENSE_CLUSTER_TOKENS = 4096


def token_clusters(x: torch.Tensor, cluster_eps: float) -> np.ndarray:
    """Cluster label of each token: connected components of ``<x_i, x_j> > 1 - cluster_eps`` (as
    :func:`attnflow.analysis.diagnostics.count_clusters` counts them). Large clouds use the diagnostics'
    exact grid method (``d <= 5``); a large cloud in higher dimension is refused (:class:`InputError`)."""
    X = x.detach().cpu().double().numpy()
    if len(X) > DENSE_CLUSTER_TOKENS:
        labels = component_labels_grid(X, cluster_eps) if X.shape[1] <= CLUSTER_GRID_MAX_DIM else None
        if labels is None:
            raise InputError(
                f"grouping {len(X)} tokens in d={X.shape[1]} into clusters needs an N x N comparison; classify "
                f"at most {DENSE_CLUSTER_TOKENS} tokens (or d <= {CLUSTER_GRID_MAX_DIM})"
            )
        return np.asarray(labels, dtype=np.int64)
    adj = X @ X.T > 1.0 - cluster_eps
    _, labels = connected_components(adj, directed=False)
    return labels.astype(np.int64)


def _heads_for(weights: Any, t: float, seed: int | None, model: str) -> Heads:
    if model not in MODELS:
        raise InputError(f"model must be one of {MODELS}; got {model!r}")
    try:
        process = as_process(weights)
        heads = process.sampler(seed)(float(t))
    except InputError:
        raise
    except (ValueError, TypeError) as e:
        raise InputError(f"weights: {e}") from None
    heads = heads.to(dtype=torch.float64)
    if model == "mha":
        # H = 1 with V = A symmetric: mha is gf. Otherwise mha is not the gradient of any energy.
        single_gf = heads.H == 1 and heads.plain and heads.V is None
        if single_gf:
            A = heads.A
            single_gf = bool((A - A.transpose(1, 2)).abs().max() <= 1e-10 * max(1.0, float(A.abs().max())))
        if not single_gf:
            raise InputError(
                "model 'mha' (here with several heads or V != A) is not a gradient flow, so no energy's Hessian "
                "classifies its zeros; classify the heads' gradient-flow model with model='gf' (V = A symmetric)."
            )
    else:
        try:
            heads.check_gradient_flow()
        except ValueError as e:
            raise InputError(f"classify_stationary(model={model!r}) needs the energy F: {e}") from None
    return heads.without_values()


def classify_stationary(
    x: ArrayLike,
    weights: Any,
    *,
    t: float = 0.0,
    model: str = "gf",
    token_weights: ArrayLike | None = None,
    head_weights: ArrayLike | None = None,
    cluster_eps: float = defaults.CLUSTER_EPS,
    zero_rtol: float = 1e-6,
    stationary_tol: float = 1e-3,
    seed: int | None = None,
    orbit_rtol: float = 1e-8,
) -> StationaryPoint:
    """Classify the state ``x`` ``(N, d)`` as a critical point of ``F(., Theta_t)`` on ``(S^{d-1})^N``.

    ``weights``: anything :func:`attnflow.simulate` takes (a process, ``(H, d, d)`` array, :class:`Heads`,
    callable), evaluated at time ``t`` (``seed`` for stochastic processes). ``model``: ``gf`` or ``usa``
    (the same zeros and the same energy: their fields are ``-P g`` times a positive scalar per token);
    ``mha`` only where it is ``gf`` (one head, ``V = A`` symmetric) - otherwise an :class:`InputError`.
    Eigenvalues below ``zero_rtol`` times the largest in magnitude count as zero; the state is called
    stationary when the Newton step to the critical point is shorter than ``stationary_tol`` radians.
    ``orbit_rtol``: a rotation of the symmetry group counts as a symmetry direction when it moves the
    configuration by more than this fraction of the largest such motion (mass metric). Near a configuration
    with a larger stabiliser (an antipodal pair: rotations about its axis fix it) a state a small angle
    ``delta`` off it has one more orbit direction, of size about ``delta``, which would take a descent
    direction out of the count; a caller that knows the state only to within ``delta`` (its noise) passes
    that resolution here, so that the index is the nearby stationary point's.
    Returns a :class:`StationaryPoint` (``index``, ``kind``, ``escape`` and the pieces behind them).
    """
    heads = _heads_for(weights, t, seed, model)
    xt = to_tensor(x, dtype=torch.float64)
    if xt.ndim != 2 or xt.shape[1] != heads.d:
        raise InputError(f"x must have shape (N, {heads.d}) to match the heads; got {tuple(xt.shape)}")
    if not bool(torch.isfinite(xt).all()):
        raise InputError("x contains NaN or inf")
    dev = float((torch.linalg.vector_norm(xt, dim=-1) - 1.0).abs().max())
    if dev > 1e-6:
        raise InputError(f"x must hold unit vectors (tokens on the sphere); the largest | |x_i| - 1 | is {dev:.3g}")
    if not cluster_eps >= 0.0 or not zero_rtol > 0.0 or not stationary_tol > 0.0 or not 0.0 < orbit_rtol < 1.0:
        raise InputError("cluster_eps must be >= 0, zero_rtol and stationary_tol > 0, orbit_rtol in (0, 1)")
    xt = xt / torch.linalg.vector_norm(xt, dim=-1, keepdim=True)
    n, d = xt.shape
    try:
        a = masses(token_weights, n, "token_weights", xt)
        w = masses(head_weights, heads.H, "head_weights", xt)
    except ValueError as e:
        raise InputError(str(e)) from None

    labels = token_clusters(xt, cluster_eps)
    K = int(labels.max()) + 1
    if 2 * K * d > MAX_HESSIAN_SIZE:
        raise InputError(
            f"the state has {K} distinct clusters in d={d}: a dense Hessian of {2 * K * d} coordinates exceeds "
            f"{MAX_HESSIAN_SIZE}; classify a state that has clustered further (or raise cluster_eps)."
        )
    lab = torch.from_numpy(labels)
    m = torch.zeros(K, dtype=torch.float64).index_add_(0, lab, a)
    sums = torch.zeros(K, d, dtype=torch.float64).index_add_(0, lab, a[:, None] * xt)
    c = sums / torch.linalg.vector_norm(sums, dim=-1, keepdim=True)
    counts = np.bincount(labels, minlength=K)

    # Gradient at the tokens themselves (the state as given).
    y = xt.clone().requires_grad_(True)
    (G,) = torch.autograd.grad(field_stats(y, heads, a, w, values=False, backend="flash").energy(a), y)
    Gt = G - xt * (G * xt).sum(-1, keepdim=True)
    gnorm = float(torch.sqrt(((Gt * Gt).sum(-1) / a).sum()))
    gfull = float(torch.sqrt(((G * G).sum(-1) / a).sum()))

    # One Hessian at the doubled configuration: cluster k -> copies 2k, 2k+1 of mass m_k / 2.
    c2 = c.repeat_interleave(2, dim=0)
    m2 = m.repeat_interleave(2) / 2.0
    B = tangent_bases(c)
    _, R2, _, F = riemannian_hessian(c2, heads, m2, w, bases=B.repeat_interleave(2, dim=0))
    q = d - 1
    R4 = R2.reshape(K, 2, q, K, 2, q)
    rigid = R4.sum(dim=(1, 4)).reshape(K * q, K * q)  # (u, u) on both copies
    sm = torch.sqrt(m).repeat_interleave(q)
    Hm = rigid / sm[:, None] / sm[None, :]  # mass metric
    Hm = 0.5 * (Hm + Hm.T)

    # Symmetry: orbit directions (W c_k)_k in tangent coordinates, mass-scaled.
    gens = symmetry_generators(heads)
    if len(gens):
        Wt = torch.from_numpy(gens)
        orbit = torch.einsum("sij,kj->ski", Wt, c)  # (S, K, d)
        coords = torch.einsum("kdq,skd->skq", B, orbit).reshape(len(gens), K * q) * sm[None, :]
        U, s, _ = torch.linalg.svd(coords.T, full_matrices=True)
        r = int((s > orbit_rtol * max(1.0, float(s.max()) if len(s) else 1.0)).sum())
    else:
        U = torch.eye(K * q, dtype=torch.float64)
        r = 0
    Q = U[:, r:]  # complement of the orbit
    Hr = Q.T @ Hm @ Q
    evals, evecs = torch.linalg.eigh(0.5 * (Hr + Hr.T))

    splits: dict[int, np.ndarray] = {}
    split_vecs: dict[int, torch.Tensor] = {}
    for k in np.nonzero(counts >= 2)[0].tolist():
        blk = R4[k, 0, :, k, 0, :] - R4[k, 0, :, k, 1, :] - R4[k, 1, :, k, 0, :] + R4[k, 1, :, k, 1, :]
        ev, vec = torch.linalg.eigh(0.5 * (blk + blk.T) / m[k])
        splits[k], split_vecs[k] = ev.numpy(), vec

    # Zero is relative to each block's own scale (split blocks are often e^beta larger than the rigid one),
    # with a floor at the rounding of the doubled Hessian's entries (the rigid sums cancel its self terms).
    floor = 1e-12 * float(R2.abs().max()) if R2.numel() else 0.0
    rigid_scale = float(torch.linalg.eigvalsh(Hm).abs().max()) if K * q else 0.0
    zero_tol = max(zero_rtol * rigid_scale, floor / float(m.min()))
    split_tols = {k: max(zero_rtol * float(np.abs(s_).max()), floor / float(m[k])) for k, s_ in splits.items()}
    rigid_index = int((evals < -zero_tol).sum())
    degenerate = int((evals.abs() <= zero_tol).sum())
    split_index = int(sum(int((s_ < -split_tols[k]).sum()) for k, s_ in splits.items()))
    index = rigid_index + split_index

    # Newton step beyond symmetry at the centres (the gradient there, mass metric coordinates).
    yc = c.clone().requires_grad_(True)
    (Gc,) = torch.autograd.grad(field_stats(yc, heads, m, w, values=False, backend="flash").energy(m), yc)
    gc = torch.einsum("kdq,kd->kq", B, Gc).reshape(K * q) / sm
    gq = Q.T @ gc
    keep = evals.abs() > zero_tol
    proj = evecs.T @ gq
    step = torch.where(keep, proj / torch.where(keep, evals, torch.ones_like(evals)), torch.zeros_like(proj))
    newton = float(torch.linalg.vector_norm(step))
    # The tokens' own spread around their centres is a distance to the cluster configuration too.
    spread = float(torch.sqrt((a * ((xt - c[lab]) ** 2).sum(-1)).sum()))
    newton = max(newton, spread)

    def direction(sign: int) -> ArrayLike | None:
        # The direction of the most negative (sign -1) or most positive (sign +1) eigenvalue, rigid or split.
        rigid_val = float(evals[0 if sign < 0 else -1]) if len(evals) else None
        cands: list[tuple[float, int]] = []
        if rigid_val is not None and sign * rigid_val > zero_tol:
            cands.append((sign * rigid_val, -1))
        for k, s_ in splits.items():
            v = float(s_[0 if sign < 0 else -1])
            if sign * v > split_tols[k]:
                cands.append((sign * v, k))
        if not cands:
            return None
        _, k = max(cands)
        u = torch.zeros(n, d, dtype=torch.float64)
        if k < 0:
            coords_vec = (Q @ evecs[:, 0 if sign < 0 else -1]) / sm  # back from the mass metric
            u = torch.einsum("kdq,kq->kd", B, coords_vec.reshape(K, q))[lab].clone()
        else:
            dirv = B[k] @ split_vecs[k][:, 0 if sign < 0 else -1]
            members = np.nonzero(labels == k)[0]
            plus, minus = members[: len(members) // 2], members[len(members) // 2 :]
            # Two halves moving apart with sum_i a_i u_i = 0: a splitting mode, the cluster's centre fixed.
            u[plus] = dirv / float(a[plus].sum())
            u[minus] = -dirv / float(a[minus].sum())
        u = u - xt * (u * xt).sum(-1, keepdim=True)
        return like(u / torch.linalg.vector_norm(u), x)

    escape = direction(-1) if index > 0 else None
    notes: list[str] = []
    if degenerate:
        notes.append(f"{degenerate} zero mode(s) beyond the symmetry directions: second order does not decide")
    return StationaryPoint(
        index=index,
        kind=KINDS[index > 0],
        escape=escape,
        stable=direction(+1),
        eigenvalues=evals.numpy(),
        split_eigenvalues=splits,
        rigid_index=rigid_index,
        split_index=split_index,
        degenerate=degenerate,
        symmetry_directions=r,
        symmetry_generators=len(gens),
        zero_tol=zero_tol,
        gradient_norm=gnorm,
        relative_gradient=gnorm / gfull if gfull > 0 else 0.0,
        newton_distance=newton,
        stationary=newton <= stationary_tol,
        energy=F,
        centres=c.numpy(),
        cluster_masses=m.numpy(),
        labels=labels,
        model=model,
        t=float(t),
        notes=notes,
    )


def check_index(point: StationaryPoint, expected: int) -> None:
    """Raise :class:`InputError` unless ``point.index == expected`` (a claimed index is checked, not trusted)."""
    if point.index != expected:
        raise InputError(
            f"claimed index {expected} but the Hessian has index {point.index} "
            f"(rigid {point.rigid_index}, splitting {point.split_index}; eigenvalues {np.round(point.eigenvalues, 6)})"
        )


#: ``show`` and the report classify a run's end only up to this Hessian size (2 K d coordinates), to stay fast.
ENDED_AT_MAX_SIZE = 1200
#: ... and up to this much Hessian work, ``2 K d`` rows times ``H (2 K)^2`` pairs: about a second on one
#: core (measured: 3.8 s for 5e7 on a loaded core). Above it the sentence points to ``attnflow stationary``
#: (the summary of every ``run`` of an unclustered cloud of 128 tokens and 8 heads spent 58 s here).
ENDED_AT_MAX_WORK = 1 << 24


#: Longest Newton step (radians) at which a state is still described by its local classification. The
#: Hessian's kind and index speak of the critical point the Newton step reaches; once that step is a
#: sizeable fraction of the unit sphere's radius (half a radian, about 29 degrees) the quadratic model
#: is far outside where it describes anything, and the state is called not near a stationary point.
LOCAL_NEWTON_RAD = 0.5


def describe(point: StationaryPoint) -> str:
    """One sentence: what the state is (kind, index, clusters, stationary or not); a state whose Newton
    step exceeds :data:`LOCAL_NEWTON_RAD` is "not near a stationary point" instead of a kind and index."""
    s = "s" if point.clusters != 1 else ""
    if point.newton_distance > LOCAL_NEWTON_RAD:
        return (
            f"not near a stationary point ({point.clusters} cluster{s}; the Newton step is "
            f"{point.newton_distance:.2g} rad, beyond the {LOCAL_NEWTON_RAD:g} rad where a local classification "
            "means anything)"
        )
    what = "minimiser" if point.kind == "minimiser" else f"saddle of index {point.index}"
    parts = [f"{what} ({point.clusters} cluster{s}"]
    if point.split_index:
        parts.append(f", {point.split_index} splitting direction{'s' if point.split_index != 1 else ''}")
    if point.degenerate:
        parts.append(f", {point.degenerate} zero mode{'s' if point.degenerate != 1 else ''} beyond symmetry")
    parts.append(")")
    text = "".join(parts)
    if not point.stationary:
        text += f", not yet stationary (Newton step {point.newton_distance:.2g} rad)"
    return text


def ended_at(
    traj: Any, *, cluster_eps: float | None = None, max_size: int = ENDED_AT_MAX_SIZE
) -> tuple[dict | None, str]:
    """Classify a trajectory's final state: ``(summary or None, one sentence)``.

    The final saved tokens, heads and masses of ``traj`` (a :class:`attnflow.Trajectory`), under the
    run's model (``mha`` only where it is ``gf``). ``None`` with the reason when it cannot be classified
    (a non-gradient model, or more clusters than ``max_size`` allows: ``2 K d`` Hessian coordinates).
    """
    eps = cluster_eps
    if eps is None:
        eps = float(((traj.config or {}).get("diagnostics") or {}).get("cluster_eps", 1e-3))
    if traj.N > DENSE_CLUSTER_TOKENS:  # the gradient at every token is an N^2 pass: not for a summary
        return None, f"not classified here: {traj.N} tokens (attnflow stationary classifies it)"
    x = np.asarray(traj.x[-1], dtype=np.float64)
    x = x / np.linalg.norm(x, axis=-1, keepdims=True)
    try:
        K = int(token_clusters(torch.from_numpy(x), eps).max()) + 1
    except InputError as e:
        return None, f"not classified: {e}"
    if 2 * K * traj.d > max_size:
        return None, f"not classified: {K} clusters in d = {traj.d} (a Hessian above {max_size} coordinates)"
    if 2 * K * traj.d * traj.H * (2 * K) ** 2 > ENDED_AT_MAX_WORK:
        return None, (
            f"not classified here: {K} clusters in d = {traj.d} with {traj.H} heads (attnflow stationary classifies it)"
        )
    try:
        point = classify_stationary(
            x,
            traj.heads_at(len(traj.t) - 1),
            t=float(traj.t[-1]),
            model=traj.model,
            token_weights=np.asarray(traj.token_weights, dtype=np.float64),
            head_weights=np.asarray(traj.head_weights, dtype=np.float64),
            cluster_eps=eps,
        )
    except InputError as e:
        return None, f"not classified: {e}"
    return point.summary(), describe(point)
