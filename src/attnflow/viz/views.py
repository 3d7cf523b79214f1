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

from attnflow.analysis.grid import CLUSTER_GRID_MAX_DIM, GRAM_BLOCK_TOKENS, component_labels_grid
from attnflow.config import defaults
from attnflow.core.trajectory import Trajectory

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


def cluster_eps_of(traj: Trajectory, default: float = defaults.CLUSTER_EPS) -> float:
    """The ``cluster_eps`` the run's diagnostics used (its spec, else its config), else ``default`` (also
    when the recorded value is not a positive finite number: a folder's config is data, checked before use)."""
    spec = traj.spec
    if spec is not None:
        return float(spec.cluster_eps)
    cfg = traj.config if isinstance(traj.config, dict) else {}
    diag = cfg.get("diagnostics")
    eps = diag.get("cluster_eps", default) if isinstance(diag, dict) else default
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps < float("inf"):
        return default
    return float(eps)


def distinct_colours(n: int) -> list[str]:
    """``n`` colours that stay distinguishable: :data:`PALETTE` first, then hues spaced by the golden
    angle at three lightness levels (never a repeat, so 235 clusters get 235 colours)."""
    import colorsys

    out = list(PALETTE[: min(n, len(PALETTE))])
    k = 0
    while len(out) < n:
        h = (0.11 + 0.618033988749895 * k) % 1.0
        light, sat = ((0.45, 0.75), (0.32, 0.85), (0.6, 0.6))[k % 3]
        r, g, b = colorsys.hls_to_rgb(h, light, sat)
        out.append(f"#{round(255 * r):02x}{round(255 * g):02x}{round(255 * b):02x}")
        k += 1
    return out


@dataclass(frozen=True)
class ClusterColouring:
    """The one colouring rule of every figure: a token's colour is that of its *final* cluster.

    ``final`` ``(N,)``: the final cluster of each token, numbered by decreasing mass (ties: the
    smallest token index first), so colour 0 is the heaviest cluster; ``mass`` ``(K,)`` the final
    clusters' masses; ``colours`` ``K`` hex colours (:func:`distinct_colours`); ``eps`` the
    clustering threshold (``<x_i, x_j> > 1 - eps``).
    """

    final: np.ndarray
    mass: np.ndarray
    colours: list[str]
    eps: float

    @property
    def token_colours(self) -> list[str]:
        return [self.colours[k] for k in self.final]


def cluster_colouring(traj: Trajectory, eps: float | None = None) -> ClusterColouring:
    """The :class:`ClusterColouring` of a run (clusters of its last saved state)."""
    eps = cluster_eps_of(traj) if eps is None else eps
    lab = cluster_labels(traj.x[-1], eps)
    a = np.asarray(traj.token_weights, dtype=np.float64)
    mass = np.bincount(lab, weights=a)
    first = np.full(len(mass), len(lab))
    np.minimum.at(first, lab, np.arange(len(lab)))
    order = np.lexsort((first, -mass))  # heaviest first, then by first token
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    return ClusterColouring(rank[lab], mass[order], distinct_colours(len(mass)), eps)


def merged_markers(labels: np.ndarray, a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One marker per current cluster: ``(tokens, mass)``, the first token of each cluster (where it
    is drawn: its members lie within ``arccos(1 - eps)`` of each other) and the cluster's mass."""
    mass = np.bincount(labels, weights=np.asarray(a, dtype=np.float64))
    first = np.full(len(mass), len(labels))
    np.minimum.at(first, labels, np.arange(len(labels)))
    return first, mass


def marker_area(mass: np.ndarray, n_tokens: int, base: float) -> np.ndarray:
    """Marker area (points^2) of a cluster of mass ``m``: ``base * sqrt(N m)``, so a lone token of
    mass ``1/N`` gets ``base`` and a merged cluster grows with the square root of its mass."""
    return base * np.sqrt(np.maximum(np.asarray(mass, dtype=np.float64) * n_tokens, 1e-12))


def camera(elevation: float, azimuth: float) -> np.ndarray:
    """Orthographic camera ``(3, 3)``: rows are screen right, screen up and the direction to the viewer
    (angles in degrees, ``azimuth`` about the ``x3`` axis, as in matplotlib's ``view_init``)."""
    el, az = np.deg2rad(elevation), np.deg2rad(azimuth)
    towards = np.array([np.cos(el) * np.cos(az), np.cos(el) * np.sin(az), np.sin(el)])
    right = np.array([-np.sin(az), np.cos(az), 0.0])
    return np.stack([right, np.cross(towards, right), towards])


def sphere_wireframe(n_lat: int = 9, n_lon: int = 12, pts: int = 73) -> list[np.ndarray]:
    """Parallels and meridians of the unit sphere, each a closed polyline ``(pts, 3)``."""
    lines = []
    s = np.linspace(0, 2 * np.pi, pts)
    for lat in np.linspace(-np.pi / 2, np.pi / 2, n_lat)[1:-1]:
        lines.append(np.stack([np.cos(lat) * np.cos(s), np.cos(lat) * np.sin(s), np.full(pts, np.sin(lat))], -1))
    for lon in np.linspace(0, np.pi, n_lon // 2, endpoint=False):
        lines.append(np.stack([np.cos(s) * np.cos(lon), np.cos(s) * np.sin(lon), np.sin(s)], -1))
    return lines


def fade(colour: str, amount: float = 0.65) -> tuple[float, float, float]:
    """``colour`` mixed with white (``amount`` of white): the far side of the sphere."""
    from matplotlib.colors import to_rgb

    r, g, b = to_rgb(colour)
    return (r + amount * (1 - r), g + amount * (1 - g), b + amount * (1 - b))


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


def speed_equals_slope(traj: Trajectory) -> bool:
    """True when the metric speed and the slope coincide by construction (model ``gf``: the velocity
    is the gradient of ``F`` in the mobility metric, ``|mu'| = |dF|``), checked on the data."""
    d = traj.diagnostics
    s, v = np.asarray(d["slope"], dtype=np.float64), np.asarray(d["metric_speed"], dtype=np.float64)
    ok = np.isfinite(s) & np.isfinite(v)
    return traj.model == "gf" and bool(np.allclose(s[ok], v[ok], rtol=1e-6, atol=0))
