"""Diagnostics of a token cloud at one time: energy, slope, speed, mobility, clustering."""

from __future__ import annotations

import math

import numpy as np
import torch
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components

from .fields import FieldStats, _log_abs_energy, _log_slope, field_stats
from .heads import Heads

DIAGNOSTICS: dict[str, str] = {
    "energy": "interaction energy F(mu, t)",
    "log_abs_energy": "log |F(mu, t)| (finite at any beta)",
    "slope": "metric slope |dF|(mu, t)",
    "metric_speed": "metric speed ||v||_mu of the simulated field",
    "mobility_min": "min_i b(x_i)",
    "mobility_max": "max_i b(x_i)",
    "order_parameter": "|sum_i a_i x_i|",
    "clusters": "connected components of the graph <x_i, x_j> > 1 - eps",
    "min_inner": "min_{i != j} <x_i, x_j>",
    "mean_inner": "mean_{i < j} <x_i, x_j>",
}


def order_parameter(x: torch.Tensor, a: torch.Tensor) -> float:
    """``|sum_i a_i x_i|``: 1 for a single point mass, near 0 for a spread-out cloud."""
    return float(torch.linalg.vector_norm((a[:, None] * x).sum(0)))


#: Above this many tokens the Gram-matrix diagnostics run over row blocks (never ``N x N`` at once).
GRAM_BLOCK_TOKENS = 4096
#: Largest number of graph edges collected for the sparse cluster count (beyond: label propagation).
GRAM_EDGE_BUDGET = 20_000_000


def count_clusters(x: torch.Tensor, eps: float = 1e-3, *, block: int | None = None) -> int:
    """Number of connected components of the graph with edges ``<x_i, x_j> > 1 - eps``."""
    n = x.shape[0]
    block = GRAM_BLOCK_TOKENS if block is None else block
    if n <= block:
        G = (x @ x.T > 1.0 - eps).cpu().numpy()
        ncomp, _ = connected_components(csr_matrix(G), directed=False)
        return int(ncomp)
    # Sparse graphs (spread-out clouds): collect the edges block by block while they stay few.
    rows, cols, edges = [], [], 0
    for s in range(0, n, block):
        i, j = torch.nonzero(x[s : s + block] @ x.T > 1.0 - eps, as_tuple=True)
        edges += int(i.numel())
        if edges > GRAM_EDGE_BUDGET:
            break
        rows.append((i + s).cpu().numpy())
        cols.append(j.cpu().numpy())
    else:
        r, c = np.concatenate(rows), np.concatenate(cols)
        ncomp, _ = connected_components(csr_matrix((np.ones(len(r), dtype=bool), (r, c)), shape=(n, n)), directed=False)
        return int(ncomp)
    # Dense graphs (clustered clouds): min-label propagation over row blocks; each sweep gives every
    # token the smallest label among its neighbours, a few sweeps when clusters are cliques.
    labels = torch.arange(n, device=x.device)
    while True:
        new = labels.clone()
        for s in range(0, n, block):
            adj = x[s : s + block] @ x.T > 1.0 - eps
            cand = torch.where(adj, labels[None, :], n).amin(dim=1)
            new[s : s + block] = torch.minimum(new[s : s + block], cand)
        new = new[new]  # pointer jumping: follow labels to their own labels
        if torch.equal(new, labels):
            return int(torch.unique(labels).numel())
        labels = new


def pairwise_inner(x: torch.Tensor, *, block: int | None = None) -> tuple[float, float]:
    """``(min_{i != j} <x_i, x_j>, mean_{i < j} <x_i, x_j>)``."""
    n = x.shape[0]
    if n < 2:
        return 1.0, 1.0
    block = GRAM_BLOCK_TOKENS if block is None else block
    if n > block:
        mn = math.inf
        for s in range(0, n, block):
            G = x[s : s + block] @ x.T
            rows = torch.arange(G.shape[0], device=x.device)
            G[rows, rows + s] = math.inf
            mn = min(mn, float(G.min()))
        tot = x.sum(0)
        return mn, (float(tot @ tot) - float((x * x).sum())) / (n * (n - 1))
    G = x @ x.T
    off = ~torch.eye(n, dtype=torch.bool, device=x.device)
    s = float(G.sum() - G.diagonal().sum())
    return float(G[off].min()), s / (n * (n - 1))


def _safe_exp(v: float) -> float:
    return math.exp(v) if v < 709.0 else math.inf


def state_diagnostics(
    x: torch.Tensor,
    heads: Heads,
    a: torch.Tensor,
    w: torch.Tensor,
    v: torch.Tensor,
    *,
    cluster_eps: float = 1e-3,
) -> dict[str, float]:
    """All of :data:`DIAGNOSTICS` for tokens ``x``, heads at the current time and field ``v``.

    ``F``, ``b`` and ``|dF|`` use ``A`` alone (MODEL.md defines them for symmetric ``A``; for other
    heads they are the same formulas, reported for comparison).
    """
    st: FieldStats = field_stats(x, Heads(K=heads.K, Q=heads.Q), a, w)
    log_abs_F = float(_log_abs_energy(st, a))
    log_b = -st.log_S
    speed2 = float((a * (v * v).sum(-1) * torch.exp(st.log_S)).sum())
    mn, mean = pairwise_inner(x)
    return {
        "energy": -_safe_exp(log_abs_F),
        "log_abs_energy": log_abs_F,
        "slope": _safe_exp(float(_log_slope(x, st, a))),
        "metric_speed": math.sqrt(speed2) if math.isfinite(speed2) else math.inf,
        "mobility_min": _safe_exp(float(log_b.min())),
        "mobility_max": _safe_exp(float(log_b.max())),
        "order_parameter": order_parameter(x, a),
        "clusters": float(count_clusters(x, cluster_eps)),
        "min_inner": mn,
        "mean_inner": mean,
    }


def as_numpy_table(rows: list[dict[str, float]]) -> dict[str, np.ndarray]:
    return {k: np.array([r[k] for r in rows], dtype=np.float64) for k in DIAGNOSTICS}
