"""Exact connected components of the cluster graph ``<x_i, x_j> > 1 - eps`` on a grid (NumPy and
SciPy only, no torch: the report and the movie label the tokens of a saved run with it, issue 43).
:mod:`attnflow.analysis.diagnostics` counts clusters with it and re-exports its names.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components
from scipy.spatial import cKDTree

#: Above this many tokens the Gram-matrix diagnostics leave the one-matrix path (``block=`` overrides).
GRAM_BLOCK_TOKENS = 4096
#: Largest dimension for the grid cluster count and the KD-tree minimum (beyond: blocked Gram).
CLUSTER_GRID_MAX_DIM = 5  # d = 5 with spread clusters already takes ~10 s at N = 1e5
#: Cell pairs with at most this many point pairs are checked all at once (vectorised); larger ones
#: one by one with a KD-tree and an early exit.
_SMALL_PAIR_WORK = 4096
#: Point pairs evaluated per vectorised chunk (memory: a few arrays of this length).
_PAIR_CHUNK = 1 << 21


def _gram_tolerance(xn: np.ndarray) -> float:
    """Bound on ``|computed <p, q> - (1 - |p - q|^2 / 2)|`` for any two rows, and ``1 - eps`` cast.

    ``<p, q> = (|p|^2 + |q|^2 - |p - q|^2) / 2`` exactly; the norms are off 1 by at most ``delta`` and
    a dot product of length ``d`` in the array's precision rounds by at most ``d`` units (plus one for
    the threshold, compared in that precision as torch does). Doubled for safety.
    """
    d = xn.shape[1]
    x64 = xn.astype(np.float64, copy=False)
    delta = float(np.abs(np.einsum("ij,ij->i", x64, x64) - 1.0).max())
    return 2.0 * delta + 2.0 * (d + 2) * float(np.finfo(xn.dtype).eps) + 1e-15


def _merge(labels: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Component labels after adding edges ``a[k] -- b[k]`` (cells) to components ``labels``."""
    if len(a) == 0:
        return labels
    m = int(labels.max()) + 1
    G = csr_matrix((np.ones(len(a), dtype=bool), (labels[a], labels[b])), shape=(m, m))
    _, lab = connected_components(G, directed=False)
    return lab[labels]


def component_labels_grid(xn: np.ndarray, eps: float) -> np.ndarray | None:
    """Component label ``(N,)`` (``0..k-1``) of every point in the graph ``<x_i, x_j> > 1 - eps``,
    exact, on a grid; None when its guarantees fail (the caller falls back to Gram blocks).

    Cells are cubes of side ``s`` with ``d s^2 / 2`` below ``eps`` by more than the rounding bound of
    :func:`_gram_tolerance`, so every two points of a cell are an edge: a cell is a clique and the
    graph's components are those of the cell graph (cells joined when some cross pair is an edge).
    Pairs at distance ``>= r_hi`` are never edges, so only cells whose boxes are within ``r_hi`` are
    candidates. Each candidate pair is decided by actual inner products: first the two cells' points
    nearest their centres (joins a dense region at once), then, in rounds of growing box gap and
    only for pairs still in different components, all cross pairs (small cells, vectorised) or a
    KD-tree nearest-neighbour search with early exit (large cells). Cost ``O(N log N)`` plus the
    cross pairs of small cells that remain unjoined; the edges of a dense cluster are never listed.
    """
    n, d = xn.shape
    tol = _gram_tolerance(xn)
    if not tol < 0.25 * eps:
        return None  # eps at the rounding level, or points off the sphere: cells could not be cliques
    s = math.sqrt(2.0 * (eps - tol) / d) * (1.0 - 1e-9)
    r_hi = math.sqrt(2.0 * (eps + tol)) * (1.0 + 1e-9) + 1e-12
    if s < 1e-6:
        return None  # the cell index rounding (~1e-16) would eat the safety factor
    x64 = xn.astype(np.float64, copy=False)
    thr = xn.dtype.type(1.0 - eps)  # torch compares a float32 Gram with the threshold in float32

    k = np.floor(x64 / s).astype(np.int64)
    kmin = k.min(0)
    k -= kmin
    span = k.max(0) + 1
    if float(np.prod(span.astype(np.float64))) >= 2.0**62:
        return None
    cell_of = np.ravel_multi_index(tuple(k.T), tuple(int(v) for v in span))
    order = np.argsort(cell_of, kind="stable")
    cell_sorted = cell_of[order]
    first = np.flatnonzero(np.r_[True, cell_sorted[1:] != cell_sorted[:-1]])
    start = np.r_[first, n]
    counts = np.diff(start)
    M = len(first)
    cell = np.repeat(np.arange(M), counts)  # cell of each sorted point
    xs, xs64, ks = xn[order], x64[order], k[order]
    cc = ks[first]  # integer coordinates of the cells

    def edge(i: np.ndarray, j: np.ndarray) -> np.ndarray:
        return np.einsum("ij,ij->i", xs[i], xs[j]) > thr

    # Candidate cell pairs: box gap (in cells) g with g^2 s^2 <= r_hi^2; their centres are then within
    # g + sqrt(d) cells, which a KD-tree on the cell coordinates lists.
    lim = (r_hi / s) ** 2 * (1.0 + 1e-9)
    ab = cKDTree(cc.astype(np.float64)).query_pairs(math.sqrt(lim) + math.sqrt(d) + 1e-6, output_type="ndarray")
    a, b = ab[:, 0].astype(np.int64), ab[:, 1].astype(np.int64)
    gap2 = (np.maximum(np.abs(cc[a] - cc[b]) - 1, 0) ** 2).sum(1)
    keep = gap2 <= lim
    a, b, gap2 = a[keep], b[keep], gap2[keep]

    # Representatives: each cell's point nearest its centre. Joining their pairs first settles
    # dense regions (neighbouring cells' centres are within r) without looking at other points.
    off = ((xs64 - (ks + 0.5) * s) ** 2).sum(1)
    rep = np.lexsort((off, cell))[first]
    hit = edge(rep[a], rep[b])
    labels = _merge(np.arange(M), a[hit], b[hit])
    a, b, gap2 = a[~hit], b[~hit], gap2[~hit]

    lo = (cc + kmin) * s  # lower corner of each cell's box
    for level in np.unique(gap2):  # rounds of growing gap: near pairs join most components first
        sel = (gap2 == level) & (labels[a] != labels[b])
        pa, pb = a[sel], b[sel]
        work = counts[pa] * counts[pb]
        small = work <= _SMALL_PAIR_WORK
        # Small cells: all cross pairs at once, in chunks, dropping pairs joined by earlier chunks.
        sa, sb = pa[small], pb[small]
        while len(sa):
            apart = labels[sa] != labels[sb]
            sa, sb = sa[apart], sb[apart]
            if not len(sa):
                break
            w = counts[sa] * counts[sb]
            m = max(1, int(np.searchsorted(np.cumsum(w), _PAIR_CHUNK, side="right")))
            ca, cb, w = sa[:m], sb[:m], w[:m]
            sa, sb = sa[m:], sb[m:]
            pid = np.repeat(np.arange(len(ca)), w)
            t = np.arange(int(w.sum())) - np.repeat(np.cumsum(w) - w, w)
            mb = counts[cb][pid]
            e = edge(start[ca][pid] + t // mb, start[cb][pid] + t % mb)
            found = np.bincount(pid[e], minlength=len(ca)) > 0
            labels = _merge(labels, ca[found], cb[found])
        # Large cells: one pair at a time, skipped once its cells share a component (union-find).
        parent: dict[int, int] = {}
        ja, jb = [], []
        for c1, c2 in zip(pa[~small].tolist(), pb[~small].tolist()):
            r1, r2 = _find(parent, int(labels[c1])), _find(parent, int(labels[c2]))
            if r1 != r2 and _cells_joined(xs, xs64, start, lo, s, r_hi, thr, c1, c2):
                parent[r1] = r2
                ja.append(c1)
                jb.append(c2)
        labels = _merge(labels, np.array(ja, dtype=np.int64), np.array(jb, dtype=np.int64))
    point_labels = np.empty(n, dtype=np.int64)
    point_labels[order] = labels[cell]
    return point_labels


def _find(parent: dict[int, int], v: int) -> int:
    while parent.get(v, v) != v:
        v = parent[v]
    return v


def _cells_joined(xs, xs64, start, lo, s, r_hi, thr, c1: int, c2: int) -> bool:
    """Whether some ``p`` in cell ``c1`` and ``q`` in cell ``c2`` have ``<p, q> > thr``."""
    rad = r_hi * (1.0 + 1e-9) + 1e-12

    def near(c: int, other: int) -> np.ndarray:
        # Points of c within rad of the other cell's box: only they can have a partner there.
        p = xs64[start[c] : start[c + 1]]
        g = np.maximum(lo[other] - p, 0.0) + np.maximum(p - (lo[other] + s), 0.0)
        return start[c] + np.flatnonzero((g * g).sum(1) <= rad * rad)

    i, j = near(c1, c2), near(c2, c1)
    if len(i) == 0 or len(j) == 0:
        return False
    if len(i) * len(j) <= 1 << 16:
        return bool((xs[i] @ xs[j].T > thr).any())
    if len(i) > len(j):
        i, j = j, i
    tree = cKDTree(xs64[j])
    dist, nn = tree.query(xs64[i], k=1, distance_upper_bound=rad)
    ok = np.isfinite(dist)
    if not ok.any():
        return False
    if bool((np.einsum("ij,ij->i", xs[i[ok]], xs[j[nn[ok]]]) > thr).any()):
        return True
    # The nearest partners all fail, so every partner within rad lies in the thin band where distance
    # and rounded inner product may disagree: check those exactly (few).
    for p, lst in zip(i[ok], tree.query_ball_point(xs64[i[ok]], rad)):
        if lst and bool((xs[j[lst]] @ xs[p] > thr).any()):
            return True
    return False
