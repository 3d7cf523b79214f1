"""Diagnostics of a token cloud at one time: energy, slope, speed, mobility, clustering."""

from __future__ import annotations

import math

import numpy as np
import torch
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components
from scipy.spatial import cKDTree

from attnflow.analysis.grid import (
    CLUSTER_GRID_MAX_DIM,
    GRAM_BLOCK_TOKENS,
    _gram_tolerance,
    component_labels_grid,
)
from attnflow.config import defaults
from attnflow.core.descriptions import DIAGNOSTICS
from attnflow.core.heads import Heads
from attnflow.dynamics.fields import FieldStats, bulk_field_stats, field_stats
from attnflow.kernels.dispatch import KernelOptions


def order_parameter(x: torch.Tensor, a: torch.Tensor) -> float:
    """``|sum_i a_i x_i|``: 1 for a single point mass, near 0 for a spread-out cloud."""
    return float(torch.linalg.vector_norm((a[:, None] * x).sum(0)))


#: Most entries of one Gram block formed by the blocked fallbacks: ``rows = GRAM_BLOCK_ENTRIES // N``.
GRAM_BLOCK_ENTRIES = 2**22
#: Largest number of graph edges collected for the sparse cluster count (beyond: label propagation).
GRAM_EDGE_BUDGET = 20_000_000
KDTREE_MAX_DIM = 8


def _rows_per_block(n: int, block: int) -> int:
    """Rows of a memory-bounded Gram block ``rows x n`` (at most ``GRAM_BLOCK_ENTRIES`` entries)."""
    return max(1, min(block, GRAM_BLOCK_ENTRIES // max(n, 1)))


def _as_numpy(x: torch.Tensor) -> np.ndarray | None:
    """``x`` as a NumPy array of its own dtype (float32/float64), else None (no fast path)."""
    if x.dtype not in (torch.float32, torch.float64):
        return None
    xn = x.detach().cpu().numpy()
    return xn if np.isfinite(xn).all() else None


def count_clusters(x: torch.Tensor, eps: float = 1e-3, *, block: int | None = None) -> int:
    """Number of connected components of the graph with edges ``<x_i, x_j> > 1 - eps``.

    ``N <= block`` (default :data:`GRAM_BLOCK_TOKENS`): one ``N x N`` Gram matrix. Larger ``N`` with
    ``d <= CLUSTER_GRID_MAX_DIM`` (unit vectors, float32/64): an exact grid method (see
    :func:`_count_clusters_grid`), about ``O(N log N)`` plus the cell pairs it must check; it never
    lists the edges of a dense cluster. Otherwise (large ``d``, or points too far off the sphere for
    the grid's guarantees): Gram blocks of at most ``GRAM_BLOCK_ENTRIES`` entries, ``O(N^2 d)``.
    All paths give the dense count (edges decided by the inner product, up to its rounding).
    """
    n, d = x.shape
    block = GRAM_BLOCK_TOKENS if block is None else block
    if n <= block:
        return _components_dense(x @ x.T > 1.0 - eps)
    if d <= CLUSTER_GRID_MAX_DIM:
        xn = _as_numpy(x)
        k = None if xn is None else _count_clusters_grid(xn, eps)
        if k is not None:
            return k
    return _count_clusters_blocked(x, eps, _rows_per_block(n, block))


#: A dense adjacency with at most this many edges per token goes to scipy as a sparse graph;
#: beyond, a breadth-first search over its rows (``O(N^2)`` in all, never lists the edges).
_SPARSE_EDGES_PER_TOKEN = 8


def _components_dense(adjacency: torch.Tensor) -> int:
    """Connected components of the symmetric graph of an ``N x N`` boolean matrix."""
    n = adjacency.shape[0]
    if int(adjacency.sum()) <= (_SPARSE_EDGES_PER_TOKEN + 1) * n:
        i, j = (t.cpu().numpy() for t in torch.nonzero(adjacency, as_tuple=True))
        graph = csr_matrix((np.ones(len(i), dtype=bool), (i, j)), shape=(n, n))
        return int(connected_components(graph, directed=False)[0])
    # Clustered clouds: a breadth-first search per component; each token is in one frontier once.
    unseen = torch.ones(n, dtype=torch.bool, device=adjacency.device)
    count = 0
    while bool(unseen.any()):
        frontier = torch.zeros_like(unseen)
        frontier[int(torch.argmax(unseen.to(torch.uint8)))] = True
        unseen &= ~frontier
        count += 1
        while bool(frontier.any()):
            frontier = adjacency[frontier].any(0) & unseen
            unseen &= ~frontier
    return count


def gram_diagnostics(x: torch.Tensor, eps: float, *, out: torch.Tensor | None = None) -> tuple[int, float, float]:
    """``(clusters, min_inner, mean_inner)`` of a cloud of at most :data:`GRAM_BLOCK_TOKENS` tokens
    from one Gram matrix (what :func:`count_clusters` and :func:`pairwise_inner` give, in one pass).

    ``out``: an ``(N, N)`` tensor of ``x``'s dtype and device that receives the Gram matrix (its
    contents are overwritten; one that does not fit is not used). A run passes the same one at every
    save (:func:`gram_buffer`): a fresh ``N x N`` matrix costs more than its product (0.66 against
    0.45 ms at ``N = 1024``, ``d = 16``, float32, measured after field evaluations).
    """
    n = x.shape[0]
    G = torch.mm(x, x.T, out=out) if _fits(out, x) else x @ x.T
    if n < 2:
        return _components_dense(G > 1.0 - eps), 1.0, 1.0
    # The diagonal takes the value of an off-diagonal entry, so one pass gives the off-diagonal min
    # and max; a self-loop never joins two components, so the count is unchanged. When no
    # off-diagonal entry passes the threshold (a spread-out cloud) every token is its own component.
    G.fill_diagonal_(float(G[0, 1]))
    mn, mx = torch.aminmax(G)
    clusters = _components_dense(G > 1.0 - eps) if bool(mx > 1.0 - eps) else n
    return clusters, float(mn), mean_inner(x)


def _fits(buf: torch.Tensor | None, x: torch.Tensor) -> bool:
    n = x.shape[0]
    return buf is not None and buf.shape == (n, n) and buf.dtype == x.dtype and buf.device == x.device


def gram_buffer(x: torch.Tensor, buf: torch.Tensor | None) -> torch.Tensor | None:
    """A buffer for :func:`gram_diagnostics` at ``x``: ``buf`` when it fits, else a new one; ``None``
    when :func:`state_diagnostics` takes no Gram matrix (more than :data:`GRAM_BLOCK_TOKENS` tokens)."""
    if x.shape[0] > GRAM_BLOCK_TOKENS:
        return None
    return buf if _fits(buf, x) else torch.empty((x.shape[0],) * 2, dtype=x.dtype, device=x.device)


def mean_inner(x: torch.Tensor) -> float:
    """``mean_{i < j} <x_i, x_j> = (|sum_i x_i|^2 - sum_i |x_i|^2) / (N (N - 1))`` (1 for ``N < 2``), ``O(N d)``,
    summed in float64."""
    n = x.shape[0]
    if n < 2:
        return 1.0
    x64 = x.to(torch.float64)
    tot = x64.sum(0)
    return (float(tot @ tot) - float((x64 * x64).sum())) / (n * (n - 1))


def _count_clusters_blocked(x: torch.Tensor, eps: float, rows_per_block: int) -> int:
    """Cluster count from Gram blocks ``rows_per_block x N``: ``O(N^2 d)`` per sweep, any ``d``."""
    n = x.shape[0]
    # Sparse graphs (spread-out clouds): collect the edges block by block while they stay few.
    rows, cols, edges = [], [], 0
    for s in range(0, n, rows_per_block):
        i, j = torch.nonzero(x[s : s + rows_per_block] @ x.T > 1.0 - eps, as_tuple=True)
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
        for s in range(0, n, rows_per_block):
            adj = x[s : s + rows_per_block] @ x.T > 1.0 - eps
            cand = torch.where(adj, labels[None, :], n).amin(dim=1)
            new[s : s + rows_per_block] = torch.minimum(new[s : s + rows_per_block], cand)
        new = new[new]  # pointer jumping: follow labels to their own labels
        if torch.equal(new, labels):
            return int(torch.unique(labels).numel())
        labels = new


def _count_clusters_grid(xn: np.ndarray, eps: float) -> int | None:
    """Exact component count on a grid (:func:`component_labels_grid`), or None when it does not apply."""
    labels = component_labels_grid(xn, eps)
    return None if labels is None else (int(labels.max()) + 1 if len(labels) else 0)


def pairwise_inner(x: torch.Tensor, *, block: int | None = None) -> tuple[float, float]:
    """``(min_{i != j} <x_i, x_j>, mean_{i < j} <x_i, x_j>)``.

    The mean is closed form (:func:`mean_inner`), ``O(N d)``. The minimum: ``N <= block`` (default
    :data:`GRAM_BLOCK_TOKENS`): one Gram matrix. Larger ``N`` with ``d <= KDTREE_MAX_DIM`` (float32/64): the point farthest from ``x_i`` is the nearest to ``-x_i``,
    one KD-tree query per token, ``O(N log N)`` (see :func:`_min_inner_kdtree`). Otherwise Gram
    blocks of at most ``GRAM_BLOCK_ENTRIES`` entries, ``O(N^2 d)``.
    """
    n, d = x.shape
    if n < 2:
        return 1.0, 1.0
    block = GRAM_BLOCK_TOKENS if block is None else block
    if n > block:
        mn = None
        if d <= KDTREE_MAX_DIM:
            xn = _as_numpy(x)
            mn = None if xn is None else _min_inner_kdtree(xn)
        if mn is None:
            mn, rows = math.inf, _rows_per_block(n, block)
            for s in range(0, n, rows):
                G = x[s : s + rows] @ x.T
                r = torch.arange(G.shape[0], device=x.device)
                G[r, r + s] = math.inf
                mn = min(mn, float(G.min()))
        return mn, mean_inner(x)
    G = x @ x.T
    off = ~torch.eye(n, dtype=torch.bool, device=x.device)
    return float(G[off].min()), mean_inner(x)


#: The KD-tree minimum re-checks pairs near its candidate for at most this many tokens, and at most
#: this many pairs in all; more means many near-ties (a cloud collapsed onto antipodal points).
_MIN_VERIFY_TOKENS = 64
_MIN_VERIFY_PAIRS = 1_000_000


def _min_inner_kdtree(xn: np.ndarray) -> float | None:
    """``min_{i != j} <x_i, x_j>`` with a KD-tree, or None when its check would be too large.

    For unit vectors ``|-x_i - x_j|^2 = 2 + 2 <x_i, x_j>``, so the nearest neighbour of ``-x_i``
    among the distinct points minimises ``<x_i, .>``; its inner product (computed from the pair,
    like the Gram entry) is a candidate ``m``. Rounding and norms off 1 can make distance and
    computed inner product disagree near ties, so every pair whose distance allows an inner product
    ``<= m`` (a ball of radius ``sqrt(2 + 2 m + 2 tol)``, a handful of pairs) is re-computed; when
    there are very many (near-ties at the rounding level) ``m`` is kept, within ``2 tol`` (a few
    units in the last place) of the Gram minimum. Identical tokens contribute ``<x_i, x_i>``
    (``i != j``, same vector); they are merged first (``np.unique``), which also keeps the queries
    of a cloud collapsed onto a few points cheap.
    """
    u, cnt = np.unique(xn, axis=0, return_counts=True)
    dup = u[cnt > 1]
    mn = float(np.einsum("ij,ij->i", dup, dup).min()) if len(dup) else math.inf
    if len(u) < 2:
        return mn
    u64 = u.astype(np.float64)
    # Sliding-midpoint splits, uncompacted boxes: the balanced, compacted default is up to 100x slower
    # for queries far from the data (every -x_i here) when the cloud is a few tight clusters.
    tree = cKDTree(u64, balanced_tree=False, compact_nodes=False)
    dist, idx = tree.query(-u64, k=2)
    me = np.arange(len(u))
    # idx[:, 0] == i only when every point equals x_i (distance 2 from -x_i), then take the second.
    j = np.where(idx[:, 0] != me, idx[:, 0], idx[:, 1])
    dj = np.where(idx[:, 0] != me, dist[:, 0], dist[:, 1])
    m = float(np.einsum("ij,ij->i", u, u[j]).min())
    tol = _gram_tolerance(u)
    r2 = (2.0 + 2.0 * m + 2.0 * tol) * (1.0 + 1e-12) + 1e-15
    cand = np.flatnonzero(dj * dj <= r2)
    r = math.sqrt(max(r2, 0.0))
    if len(cand) > _MIN_VERIFY_TOKENS or (
        int(tree.query_ball_point(-u64[cand], r, return_length=True).sum()) > _MIN_VERIFY_PAIRS
    ):
        # Many pairs within the rounding bound of m: all of them are the minimum to rounding (|error|
        # <= 2 tol) when the tokens are unit vectors; off the sphere the blocked Gram path decides.
        return min(m, mn) if tol < 1e-12 else None
    for i, lst in zip(cand, tree.query_ball_point(-u64[cand], r)):
        lst = [v for v in lst if v != i]
        if lst:
            m = min(m, float((u[lst] @ u[i]).min()))
    return min(m, mn)


def _safe_exp(v: float) -> float:
    return math.exp(v) if v < 709.0 else math.inf


def _safe_exps(vs: list[float]) -> list[float]:
    """:func:`_safe_exp` of each value (one comprehension: the bulk diagnostics' columns)."""
    return [math.exp(v) if v < 709.0 else math.inf for v in vs]


def energy_and_slope(log_abs_energy: np.ndarray, log_slope: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``F = -exp(log |F|)`` and ``|dF| = exp(log |dF|)`` from their logs (arrays of any shape, e.g. an ensemble's
    ``(S, B)`` diagnostics), converted as a trajectory's ``energy`` and ``slope`` are (:func:`_safe_exps`: ``inf``
    past the float range, not an overflow)."""
    F, s = np.asarray(log_abs_energy, dtype=np.float64), np.asarray(log_slope, dtype=np.float64)
    energy = -np.array(_safe_exps(F.ravel().tolist()), dtype=np.float64).reshape(F.shape)
    return energy, np.array(_safe_exps(s.ravel().tolist()), dtype=np.float64).reshape(s.shape)


def state_diagnostics(
    x: torch.Tensor,
    heads: Heads,
    a: torch.Tensor,
    w: torch.Tensor,
    v: torch.Tensor,
    *,
    cluster_eps: float = defaults.CLUSTER_EPS,
    options: KernelOptions | None = None,
    stats: FieldStats | None = None,
    gram_out: torch.Tensor | None = None,
) -> dict[str, float]:
    """All of :data:`DIAGNOSTICS` for tokens ``x``, heads at the current time and field ``v``.

    ``F``, ``b`` and ``|dF|`` use ``A`` alone (docs/model.md defines them for symmetric ``A``; for other
    heads they are the same formulas, reported for comparison). ``stats``: the kernel pass of the
    heads' ``A`` alone at ``x`` (``out_h`` with ``V = A`` and ``log Z_h``) when the caller already has
    it (the simulation loop gets it from the field's own pass); otherwise it is computed here.
    ``gram_out``: the Gram matrix's buffer of :func:`gram_diagnostics` (used when it fits).
    """
    st: FieldStats = stats if stats is not None else field_stats(x, heads.without_values(), a, w, options=options)
    log_abs_F = float(st.log_abs_energy(a))
    log_b = st.log_mobility()
    speed2 = float(st.speed_sq(v, a))
    if x.shape[0] <= GRAM_BLOCK_TOKENS:
        clusters, mn, mean = gram_diagnostics(x, cluster_eps, out=gram_out)
    else:
        clusters = count_clusters(x, cluster_eps)
        mn, mean = pairwise_inner(x)
    return {
        "energy": -_safe_exp(log_abs_F),
        "log_abs_energy": log_abs_F,
        "slope": _safe_exp(float(st.log_slope(x, a))),
        "metric_speed": math.sqrt(speed2) if math.isfinite(speed2) else math.inf,
        "mobility_min": _safe_exp(float(log_b.min())),
        "mobility_max": _safe_exp(float(log_b.max())),
        "order_parameter": order_parameter(x, a),
        "clusters": float(clusters),
        "min_inner": mn,
        "mean_inner": mean,
    }


def as_numpy_table(rows: list[dict[str, float]]) -> dict[str, np.ndarray]:
    return {k: np.array([r[k] for r in rows], dtype=np.float64) for k in DIAGNOSTICS}


#: Most kernel values ``(states x heads x N^2)`` one chunk of :func:`bulk_state_diagnostics` forms.
BULK_CHUNK_VALUES = 2**22


def bulk_state_diagnostics(
    X: torch.Tensor,
    A: torch.Tensor,
    V: torch.Tensor | None,
    a: torch.Tensor,
    w: torch.Tensor,
    model: str,
    *,
    cluster_eps: float = defaults.CLUSTER_EPS,
) -> list[dict[str, float]]:
    """:func:`state_diagnostics` of ``S`` saved states at once: ``X`` ``(S, N, d)``, the plain heads'
    ``A`` and values ``V`` ``(S, H, d, d)`` (``None``: ``V = A``), the field of ``model`` made here.

    The same formulas (:class:`~attnflow.dynamics.fields.FieldStats`), batched over the states: one
    dense kernel pass gives the means ``m_hi = sum_j p_hij x_j``, whence ``out_h = A_h m_h`` (the
    ``A``-only statistics) and ``V_h m_h`` (the field); one batched Gram product the pairwise
    diagnostics; one scipy call the cluster counts of every clustered state (their graphs as one
    block-diagonal graph). Equal to the per-state values to rounding, the cluster counts exactly
    (``tests/analysis/test_bulk_diagnostics.py``). Dense kernel only: for clouds of
    :data:`GRAM_BLOCK_TOKENS` tokens or fewer, with ``N >= 2``, in chunks of
    :data:`BULK_CHUNK_VALUES` kernel values.
    """
    columns = _bulk_columns(X, A, V, a, w, model, cluster_eps)
    return [dict(zip(_BULK_KEYS, vals)) for vals in zip(*columns)]


def bulk_state_table(
    X: torch.Tensor,
    A: torch.Tensor,
    V: torch.Tensor | None,
    a: torch.Tensor,
    w: torch.Tensor,
    model: str,
    *,
    cluster_eps: float = defaults.CLUSTER_EPS,
) -> dict[str, np.ndarray]:
    """:func:`bulk_state_diagnostics` as columns, ``{name: (S,) float64}`` (the same numbers; no row
    dictionaries: what a trajectory keeps)."""
    columns = _bulk_columns(X, A, V, a, w, model, cluster_eps)
    table = {k: np.array(c, dtype=np.float64) for k, c in zip(_BULK_KEYS, columns)}
    return {k: table[k] for k in DIAGNOSTICS}


def _bulk_columns(
    X: torch.Tensor, A: torch.Tensor, V: torch.Tensor | None, a: torch.Tensor, w: torch.Tensor, model: str, eps: float
) -> list[list[float]]:
    """The columns of :data:`_BULK_KEYS` for every state, chunk by chunk."""
    S, N, d = X.shape
    H = A.shape[1]
    if N < 2 or N > GRAM_BLOCK_TOKENS:
        raise ValueError(f"bulk diagnostics take 2 to {GRAM_BLOCK_TOKENS} tokens; got N={N}")
    step = max(1, BULK_CHUNK_VALUES // (H * N * N))
    columns: list[list[float]] = [[] for _ in _BULK_KEYS]
    for s0 in range(0, S, step):
        chunk = _bulk_chunk(
            X[s0 : s0 + step], A[s0 : s0 + step], None if V is None else V[s0 : s0 + step], a, w, model, eps
        )
        for col, part in zip(columns, chunk):
            col += part
    return columns


def _bulk_chunk(
    X: torch.Tensor, A: torch.Tensor, V: torch.Tensor | None, a: torch.Tensor, w: torch.Tensor, model: str, eps: float
) -> tuple[list[float], ...]:
    """The columns of :data:`_BULK_KEYS` for the states ``X``."""
    from attnflow.kernels import small as _small  # numba: loaded when a run saves, not with the module
    from attnflow.kernels.announce import prepare

    S, N, d = X.shape
    if _small.AVAILABLE and X.dtype == torch.float64:  # compiled in a child when cold: the cached bits
        prepare("the small-cloud steps", _small.RUN_KERNELS, "small")
    if _small.AVAILABLE and X.dtype == torch.float64 and model in ("mha", "gf"):
        # The FieldStats formulas compiled state by state (kernels.small.bulk_stats, tested against them).
        res = _small.bulk_stats(X.numpy(), A.numpy(), (A if V is None else V).numpy(), w.numpy(), a.numpy(), model)
        log_abs_F, b_min, b_max, speed2, slope = (res[:, k].tolist() for k in range(5))
    else:
        log_abs_F, b_min, b_max, speed2, slope = bulk_field_stats(X, A, V, a, w, model)
    order = torch.linalg.vector_norm((a[:, None] * X).sum(-2), dim=-1).tolist()
    x64 = X.to(torch.float64)
    tot = x64.sum(-2)
    mean = (((tot * tot).sum(-1) - (x64 * x64).sum((-1, -2))) / (N * (N - 1))).tolist()
    if _small.AVAILABLE and X.dtype == torch.float64:
        mn_np, counts_np = _small.gram_batch(np.ascontiguousarray(X.numpy()), 1.0 - eps)
        mn_l, clusters = mn_np.tolist(), [float(c) for c in counts_np]
    else:
        mn_l, clusters = _gram_torch(X, eps)
    # Column by column (one comprehension each, no call per value).
    return (
        [-v for v in _safe_exps(log_abs_F)], log_abs_F, _safe_exps(slope),
        [math.sqrt(v) if math.isfinite(v) else math.inf for v in speed2], _safe_exps(b_min), _safe_exps(b_max),
        order, clusters, mn_l, mean,
    )  # fmt: skip


#: The order of :func:`_bulk_chunk`'s columns.
_BULK_KEYS = (
    "energy", "log_abs_energy", "slope", "metric_speed", "mobility_min", "mobility_max", "order_parameter",
    "clusters", "min_inner", "mean_inner",
)  # fmt: skip


def _gram_torch(X: torch.Tensor, eps: float) -> tuple[list[float], list[float]]:
    """``(min_inner, clusters)`` of each state from one batched Gram product (any dtype)."""
    S, N, _ = X.shape
    G = X @ X.transpose(-1, -2)
    r = torch.arange(N)
    G[:, r, r] = G[:, 0, 1].clone().unsqueeze(-1)  # as gram_diagnostics: the diagonal takes an off-diagonal value
    mn, mx = torch.aminmax(G.reshape(S, -1), dim=-1)
    clusters = [float(N)] * S
    close = torch.nonzero(mx > 1.0 - eps).flatten().tolist()
    if close:
        counts = _component_counts_py(np.ascontiguousarray((G[close] > 1.0 - eps).numpy()))
        for k, s in enumerate(close):
            clusters[s] = float(counts[k])
    return mn.tolist(), clusters


def _component_counts_py(adj: np.ndarray) -> np.ndarray:
    """Connected components of each symmetric graph ``adj[s]`` ``(N, N)`` (scipy, one block-diagonal graph)."""
    S, N, _ = adj.shape
    blk, i, j = np.nonzero(adj)
    graph = csr_matrix((np.ones(len(i), dtype=bool), (blk * N + i, blk * N + j)), shape=(S * N, S * N))
    labels = np.sort(connected_components(graph, directed=False)[1].reshape(S, N), axis=1)
    return 1 + (np.diff(labels, axis=1) != 0).sum(axis=1)
