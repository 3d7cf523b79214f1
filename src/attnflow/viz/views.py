"""What the report and the movie show of a run: 3D coordinates, cluster labels, head norms.

Both the interactive report (:mod:`attnflow.report`) and the movie (:mod:`attnflow.movie`) draw
the same picture, so the choices live here once: tokens on ``S^2`` are drawn as they are; for
``d > 3`` they are projected on the top three principal directions of all saved tokens (the
explained variance is shown); ``d = 2`` is drawn in the plane ``z = 0``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components

from attnflow.analysis.diagnostics import CLUSTER_GRID_MAX_DIM, GRAM_BLOCK_TOKENS, component_labels_grid
from attnflow.io.trajectory import Trajectory

# Okabe-Ito-like qualitative palette, readable on white and for colour-blind viewers.
PALETTE: tuple[str, ...] = (
    "#0072B2",
    "#E69F00",
    "#009E73",
    "#D55E00",
    "#CC79A7",
    "#56B4E9",
    "#F0E442",
    "#000000",
    "#8C564B",
    "#7F7F7F",
)


@dataclass(frozen=True)
class View3D:
    """Tokens in the 3D coordinates that are drawn.

    ``xyz`` ``(S, N, 3)``; ``on_sphere`` is true when the coordinates are the tokens themselves
    (``d <= 3``), false for a PCA projection; ``explained`` the variance ratio of each drawn axis
    (``None`` on the sphere); ``axis_titles`` label the three axes.
    """

    xyz: np.ndarray
    on_sphere: bool
    explained: np.ndarray | None
    axis_titles: tuple[str, str, str]


def pca_basis(x: np.ndarray, k: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """Top-``k`` principal directions ``(k, d)`` of all saved tokens and their explained variance ratios."""
    flat = x.reshape(-1, x.shape[-1])
    centered = flat - flat.mean(0)
    _, s, vt = np.linalg.svd(centered, full_matrices=False)
    var = s**2 / max(float((s**2).sum()), 1e-300)
    return vt[:k], var[:k]


def view3d(x: np.ndarray) -> View3D:
    """The drawn coordinates of tokens ``x`` ``(S, N, d)``: themselves for ``d <= 3``, PCA for ``d > 3``."""
    d = x.shape[-1]
    if d == 3:
        return View3D(x, True, None, ("x1", "x2", "x3"))
    if d == 2:
        return View3D(np.concatenate([x, np.zeros(x.shape[:-1] + (1,))], axis=-1), True, None, ("x1", "x2", ""))
    basis, var = pca_basis(x, 3)
    titles = tuple(f"PC{i + 1} ({100 * v:.1f}%)" for i, v in enumerate(var))
    return View3D(x @ basis.T, False, var, titles)  # type: ignore[arg-type]


def cluster_labels(x: np.ndarray, eps: float = 1e-3) -> np.ndarray:
    """Cluster label of each token ``(N,)``: connected components of ``<x_i, x_j> > 1 - eps``.

    The same graph as :func:`attnflow.diagnostics.count_clusters` (and the same exact grid method
    beyond :data:`~attnflow.diagnostics.GRAM_BLOCK_TOKENS` tokens, so a 1e5-token run never forms
    ``N x N``). Components are numbered by their smallest token index, so a cluster keeps its label
    (and colour) while it absorbs others.
    """
    labels = (
        component_labels_grid(x, eps) if len(x) > GRAM_BLOCK_TOKENS and x.shape[1] <= CLUSTER_GRID_MAX_DIM else None
    )
    if labels is None:
        i, j = np.nonzero(x @ x.T > 1.0 - eps)
        G = csr_matrix((np.ones(len(i), dtype=np.int8), (i, j)), shape=(len(x), len(x)))
        _, labels = connected_components(G, directed=False)
    # connected_components numbers components in order of their first node; make that explicit.
    first = np.full(labels.max() + 1, len(labels))
    np.minimum.at(first, labels, np.arange(len(labels)))
    return np.argsort(np.argsort(first))[labels]


def cluster_eps_of(traj: Trajectory, default: float = 1e-3) -> float:
    """The ``cluster_eps`` the run's diagnostics used (from its config), else ``default``."""
    cfg = traj.config or {}
    return float((cfg.get("diagnostics") or {}).get("cluster_eps", default))


def head_norms(traj: Trajectory) -> dict[str, np.ndarray]:
    """The weights' path: Frobenius norms ``||A_h(t)||_F`` (and ``||V_h(t)||_F`` when ``V != A``), each ``(S, H)``."""
    out = {"A": np.linalg.norm(traj.A, axis=(-2, -1))}
    if traj.V is not None:
        out["V"] = np.linalg.norm(traj.V, axis=(-2, -1))
    return out


def interpolate_tokens(x: np.ndarray, t: np.ndarray, times: np.ndarray, *, on_sphere: bool = True) -> np.ndarray:
    """Points ``x`` ``(S, N, k)`` saved at ``t``, at ``times``: linear interpolation (pushed back onto
    the sphere when ``on_sphere``). Only for display (movies with more frames than saved times);
    not a solution of the flow."""
    times = np.clip(times, t[0], t[-1])
    k = np.clip(np.searchsorted(t, times, side="right") - 1, 0, len(t) - 2) if len(t) > 1 else np.zeros(len(times), int)
    if len(t) == 1:
        return np.repeat(x[:1], len(times), axis=0)
    s = ((times - t[k]) / (t[k + 1] - t[k]))[:, None, None]
    y = (1 - s) * x[k] + s * x[k + 1]
    if not on_sphere:
        return y
    n = np.linalg.norm(y, axis=-1, keepdims=True)
    return y / np.where(n > 0, n, 1.0)
