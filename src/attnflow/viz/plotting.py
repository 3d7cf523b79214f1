"""Static figures of a run (matplotlib, Agg): sphere snapshots and diagnostic curves, each written
as PNG and as vector PDF.

Snapshots follow the rule every attnflow figure uses (:func:`attnflow.viz.views.cluster_colouring`):
a token has the colour of its *final* cluster; merged tokens are one marker whose area grows with
the cluster's mass (:func:`~attnflow.viz.views.marker_area`); on the sphere the far hemisphere is
drawn faded behind the near one (orthographic view, the same camera as the movie's).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import BoundaryNorm, ListedColormap
from matplotlib.lines import Line2D

from attnflow.core.figures import FIGURE_DPI
from attnflow.core.text import plain_label
from attnflow.core.trajectory import Trajectory
from attnflow.io.safety import atomic_write, refuse_link
from attnflow.viz.views import (
    camera,
    cluster_colouring,
    cluster_eps_of,
    cluster_labels,
    fade,
    marker_area,
    merged_markers,
    pca_basis,
    speed_equals_slope,
    sphere_wireframe,
)

#: Camera of the sphere snapshots (degrees), as matplotlib's ``view_init(elev, azim)``.
ELEVATION, AZIMUTH = 20.0, -60.0
#: Marker area (points^2) of a lone token of mass ``1/N``.
BASE_AREA = 9.0
#: Above this many tokens, markers are rasterised inside the PDF (axes and text stay vector).
RASTER_TOKENS = 2000
#: Most final clusters named one by one in a legend (beyond: a colourbar of cluster ranks).
LEGEND_CLUSTERS = 8


def snapshot_indices(n_saved: int, count: int = 4) -> list[int]:
    return sorted(set(np.linspace(0, n_saved - 1, min(count, n_saved)).round().astype(int).tolist()))


def vector_path(path: Path) -> Path:
    """The PDF written beside a figure's PNG."""
    return Path(path).with_suffix(".pdf")


def _save(fig, path: Path, dpi: int = FIGURE_DPI) -> Path:
    """Write ``path`` (PNG) and the same figure as PDF beside it (:func:`vector_path`)."""
    path = Path(path)
    try:
        for target in (path, vector_path(path)):  # never drawn through a link (it would overwrite its target)
            refuse_link(target.parent, "figures folder")
            with atomic_write(target, "wb") as fh:
                fig.savefig(fh, dpi=dpi, format=target.suffix.lstrip(".").lower() or "png")
    finally:
        plt.close(fig)
    return path


def _axis_triad(ax, P: np.ndarray) -> None:
    """The projected coordinate axes x1, x2, x3 as short arrows in the panel's lower left corner."""
    origin = np.array([-0.98, -0.98])
    for i in range(3):
        v = 0.22 * P[:2, i]
        ax.annotate(
            "",
            xy=origin + v,
            xytext=origin,
            arrowprops=dict(arrowstyle="-|>", lw=0.8, color="0.35", shrinkA=0, shrinkB=0, mutation_scale=7),
        )
        ax.text(*(origin + 1.35 * v), f"$x_{i + 1}$", fontsize=7, color="0.25", ha="center", va="center")


def _sphere_panel(ax, p: np.ndarray, colours: list[str], areas: np.ndarray, raster: bool) -> None:
    """Tokens ``p`` ``(M, 3)`` on the unit sphere seen by the snapshot camera: near side full colour,
    far side faded behind it; wireframe likewise."""
    P = camera(ELEVATION, AZIMUTH)
    ax.add_artist(plt.Circle((0, 0), 1.0, fill=False, lw=0.9, color="0.45", zorder=1))
    for line in sphere_wireframe():
        g = line @ P.T
        near = g[:, 2] >= 0
        ax.plot(np.where(near, g[:, 0], np.nan), np.where(near, g[:, 1], np.nan), lw=0.45, color="0.72", zorder=1)
        ax.plot(np.where(near, np.nan, g[:, 0]), np.where(near, np.nan, g[:, 1]), lw=0.35, color="0.9", zorder=0)
    q = p @ P.T
    near = q[:, 2] >= 0
    order = np.argsort(q[:, 2])  # far to near: nearer markers on top
    far_o, near_o = order[~near[order]], order[near[order]]
    ax.scatter(
        q[far_o, 0], q[far_o, 1], s=areas[far_o], c=[fade(colours[i]) for i in far_o], lw=0, zorder=2, rasterized=raster
    )
    ax.scatter(
        q[near_o, 0],
        q[near_o, 1],
        s=areas[near_o],
        c=[colours[i] for i in near_o],
        lw=0.3,
        edgecolors="white",
        zorder=3,
        rasterized=raster,
    )
    ax.set_xlim(-1.06, 1.06)
    ax.set_ylim(-1.06, 1.06)
    ax.set_aspect("equal")
    ax.set_axis_off()
    _axis_triad(ax, P)


def plot_snapshots(traj: Trajectory, path: Path, count: int = 4) -> Path:
    """Write :func:`snapshots_figure` as PNG and PDF; returns the PNG's path."""
    return _save(snapshots_figure(traj, count), path)


def snapshots_figure(traj: Trajectory, count: int = 4):
    """Token clouds at ``count`` times: on the sphere for ``d <= 3`` (orthographic view, far
    hemisphere faded), in PCA coordinates otherwise; coloured by final cluster, one marker per
    current cluster with area growing with its mass; a legend (or colourbar) of the final clusters
    and of the marker sizes. Returns the matplotlib figure."""
    idx = snapshot_indices(len(traj.t), count)
    col = cluster_colouring(traj)
    a = np.asarray(traj.token_weights, dtype=np.float64)
    raster = traj.N > RASTER_TOKENS
    n = len(idx)
    fig, axes = plt.subplots(1, n, figsize=(2.9 * n + 1.9, 3.35), squeeze=False)
    axes = axes[0]
    if traj.d > 3:
        basis, var = pca_basis(traj.x, 2)
    for ax, k in zip(axes, idx):
        labels = cluster_labels(traj.x[k], col.eps)
        rep, mass = merged_markers(labels, a)
        colours = [col.colours[col.final[i]] for i in rep]
        areas = marker_area(mass, traj.N, BASE_AREA)
        if traj.d <= 3:
            p = traj.x[k][rep]
            if traj.d == 2:
                p = np.c_[p, np.zeros(len(p))]
            _sphere_panel(ax, p, colours, areas, raster)
        else:
            q = traj.x[k][rep] @ basis.T
            ax.scatter(q[:, 0], q[:, 1], s=areas, c=colours, lw=0.3, edgecolors="white", rasterized=raster)
            ax.set_aspect("equal")
            ax.set_xlim(-1.05, 1.05)
            ax.set_ylim(-1.05, 1.05)
            ax.set_xlabel(f"PC$_1$ ({100 * var[0]:.0f}% var.)", fontsize=8)
            ax.set_ylabel(f"PC$_2$ ({100 * var[1]:.0f}% var.)", fontsize=8)
            ax.tick_params(labelsize=7)
        ax.set_title(f"$t$ = {traj.t[k]:.3g},  $K$ = {len(mass)} cluster{'s' if len(mass) != 1 else ''}", fontsize=9)
    where = f"on $S^{{{traj.d - 1}}}$ (far side faded)" if traj.d <= 3 else f"in a PCA view of $S^{{{traj.d - 1}}}$"
    fig.suptitle(
        f"tokens {where}: model {plain_label(traj.model)}, $N$ = {traj.N}, $d$ = {traj.d}, $H$ = {traj.H}; "
        f"colour: final cluster, area $\\propto\\sqrt{{\\mathrm{{mass}}}}$",
        fontsize=9,
    )
    fig.tight_layout(rect=(0, 0, 1 - 1.8 / fig.get_figwidth(), 0.94))
    _cluster_key(fig, col, traj.N)
    return fig


def _cluster_key(fig, col, n_tokens: int) -> None:
    """Legend of the final clusters (or a colourbar of their mass ranks when there are many) and of
    the marker sizes, in the figure's right margin."""
    left = 1 - 1.75 / fig.get_figwidth()
    K = len(col.colours)
    if K <= LEGEND_CLUSTERS:
        handles = [
            Line2D([], [], ls="none", marker="o", ms=6, mew=0, color=c, label=f"{k + 1}: mass {m:.2g}")
            for k, (c, m) in enumerate(zip(col.colours, col.mass))
        ]
        fig.legend(
            handles=handles,
            title="final cluster",
            fontsize=7,
            title_fontsize=7.5,
            frameon=False,
            loc="upper left",
            bbox_to_anchor=(left, 0.9),
        )
    else:
        cax = fig.add_axes((left + 0.01, 0.42, 0.012, 0.45))
        cmap = ListedColormap(col.colours)
        sm = plt.cm.ScalarMappable(norm=BoundaryNorm(np.arange(K + 1) + 0.5, K), cmap=cmap)
        cb = fig.colorbar(sm, cax=cax)
        cb.set_label(f"final cluster (1 = heaviest; {K} in all)", fontsize=7)
        cb.ax.tick_params(labelsize=6)
    counts = sorted({1, max(1, n_tokens // 10), n_tokens})
    sizes = [
        Line2D(
            [],
            [],
            ls="none",
            marker="o",
            color="0.5",
            mew=0,
            ms=float(np.sqrt(marker_area(np.array([c / n_tokens]), n_tokens, BASE_AREA)[0])),
            label=f"{c} token{'s' if c > 1 else ''}",
        )
        for c in counts
    ]
    fig.legend(
        handles=sizes,
        title="merged (uniform masses)",
        fontsize=7,
        title_fontsize=7.5,
        frameon=False,
        loc="lower left",
        bbox_to_anchor=(left, 0.04),
        labelspacing=1.2,
    )


def plot_diagnostics(traj: Trajectory, path: Path) -> Path:
    """Write :func:`diagnostics_figure` as PNG and PDF; returns the PNG's path."""
    return _save(diagnostics_figure(traj), path)


def diagnostics_figure(traj: Trajectory):
    """Energy ``F``, slope ``|dF|`` and metric speed ``|mu'|``, cluster count ``K`` and order
    parameter against time, every panel with a labelled y axis and a legend; for ``gf`` slope and
    speed are one curve (:func:`~attnflow.viz.views.speed_equals_slope`). Returns the figure."""
    d = traj.diagnostics
    t = traj.t
    fig, axes = plt.subplots(1, 4, figsize=(15, 3.4))
    pos = lambda a: np.where(a > 0, a, np.nan)
    axes[0].plot(t, d["energy"], color="C0", label=r"$F(\mu_t, t)$")
    axes[0].set_ylabel(r"energy $F(\mu_t, t)$")
    axes[0].set_title("energy")
    if speed_equals_slope(traj):
        axes[1].semilogy(t, pos(d["slope"]), color="C3", label=r"$|\partial F| = |\mu'|$ (equal for gf)")
        axes[1].set_ylabel(r"$|\partial F|(\mu_t, t) = |\mu'|(t)$")
    else:
        axes[1].semilogy(t, pos(d["slope"]), color="C3", label=r"slope $|\partial F|(\mu_t, t)$")
        axes[1].semilogy(t, pos(d["metric_speed"]), "--", color="C9", label=r"metric speed $|\mu'|(t)$")
        axes[1].set_ylabel(r"$|\partial F|$, $|\mu'|$")
    axes[1].set_title("slope and speed")
    axes[2].plot(t, d["clusters"], drawstyle="steps-post", color="C4", label=r"$K(t)$")
    axes[2].set_yscale("log")
    axes[2].set_ylabel(r"clusters $K(t)$")
    axes[2].set_title(
        f"clusters ($\\langle x_i, x_j\\rangle > 1 - \\varepsilon$, $\\varepsilon$ = {cluster_eps_of(traj):g})"
    )
    axes[3].plot(t, d["order_parameter"], color="C2", label=r"$|\sum_i a_i x_i|$")
    axes[3].plot(t, d["mean_inner"], color="C1", label=r"mean $\langle x_i, x_j\rangle$")
    axes[3].set_ylim(-1.05, 1.05)
    axes[3].set_ylabel("order")
    axes[3].set_title("order parameter and mean inner product")
    for ax in axes:
        ax.set_xlabel(r"time $t$ (depth)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        ax.title.set_fontsize(9)
    fig.suptitle(
        f"diagnostics: model {plain_label(traj.model)}, $N$ = {traj.N}, $d$ = {traj.d}, $H$ = {traj.H}, "
        f"{plain_label(traj.method)}, $\\Delta t$ = {traj.dt:g}",
        fontsize=10,
    )
    fig.tight_layout()
    return fig


#: The files :func:`plot_run` writes into its folder.
FIGURE_FILES = ("snapshots.png", "snapshots.pdf", "diagnostics.png", "diagnostics.pdf")


def plot_run(traj: Trajectory, outdir: str | Path) -> list[Path]:
    """Write ``snapshots.png``/``.pdf`` and ``diagnostics.png``/``.pdf`` into ``outdir``."""
    out = Path(outdir)
    refuse_link(out, "figures folder")
    out.mkdir(parents=True, exist_ok=True)
    pngs = [plot_snapshots(traj, out / "snapshots.png"), plot_diagnostics(traj, out / "diagnostics.png")]
    return [p for png in pngs for p in (png, vector_path(png))]
