"""Static figures of a run (matplotlib, Agg): sphere snapshots and diagnostic curves."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from attnflow.io.trajectory import Trajectory
from attnflow.viz.views import pca_basis


def snapshot_indices(n_saved: int, count: int = 4) -> list[int]:
    return sorted(set(np.linspace(0, n_saved - 1, min(count, n_saved)).round().astype(int).tolist()))


def plot_snapshots(traj: Trajectory, path: Path, count: int = 4) -> Path:
    """Token clouds at ``count`` times: on the sphere for ``d = 3``, in PCA coordinates otherwise."""
    idx = snapshot_indices(len(traj.t), count)
    fig = plt.figure(figsize=(3.6 * len(idx), 3.8))
    if traj.d == 3:
        u, v = np.mgrid[0 : 2 * np.pi : 40j, 0 : np.pi : 20j]
        for n, k in enumerate(idx):
            ax = fig.add_subplot(1, len(idx), n + 1, projection="3d")
            ax.plot_wireframe(np.cos(u) * np.sin(v), np.sin(u) * np.sin(v), np.cos(v), color="0.85", lw=0.3)
            p = traj.x[k]
            ax.scatter(p[:, 0], p[:, 1], p[:, 2], s=6, c=p[:, 2], cmap="viridis", depthshade=False)
            ax.set_box_aspect((1, 1, 1))
            ax.set_axis_off()
            ax.set_title(f"t = {traj.t[k]:.3g}, clusters = {int(traj.diagnostics['clusters'][k])}", fontsize=9)
    else:
        basis, var = pca_basis(traj.x, 2)
        for n, k in enumerate(idx):
            ax = fig.add_subplot(1, len(idx), n + 1)
            p = traj.x[k] @ basis.T
            ax.scatter(p[:, 0], p[:, 1], s=6)
            ax.set_aspect("equal")
            ax.set_xlabel(f"PC1 ({100 * var[0]:.0f}%)")
            ax.set_ylabel(f"PC2 ({100 * var[1]:.0f}%)")
            ax.set_title(f"t = {traj.t[k]:.3g}", fontsize=9)
    fig.suptitle(f"tokens ({traj.model}, N={traj.N}, d={traj.d}, H={traj.H})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_diagnostics(traj: Trajectory, path: Path) -> Path:
    """Energy, slope ``|dF|``, metric speed, cluster count and order parameter against time."""
    d = traj.diagnostics
    fig, axes = plt.subplots(1, 4, figsize=(15, 3.4))
    axes[0].plot(traj.t, d["energy"], color="C0")
    axes[0].set_title("energy F(mu_t, t)")
    pos = lambda a: np.where(a > 0, a, np.nan)
    axes[1].semilogy(traj.t, pos(d["slope"]), label="slope |dF|")
    axes[1].semilogy(traj.t, pos(d["metric_speed"]), "--", label="metric speed |mu'|")
    axes[1].legend(fontsize=8)
    axes[1].set_title("slope and speed")
    axes[2].plot(traj.t, d["clusters"], drawstyle="steps-post", color="C3")
    axes[2].set_yscale("log")
    axes[2].set_title("clusters")
    axes[3].plot(traj.t, d["order_parameter"], color="C2", label="|sum a_i x_i|")
    axes[3].plot(traj.t, d["mean_inner"], color="C4", label="mean <x_i, x_j>")
    axes[3].set_ylim(-1.05, 1.05)
    axes[3].legend(fontsize=8)
    axes[3].set_title("order")
    for ax in axes:
        ax.set_xlabel("t (depth)")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_run(traj: Trajectory, outdir: str | Path) -> list[Path]:
    """Write ``snapshots.png`` and ``diagnostics.png`` into ``outdir``."""
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    return [plot_snapshots(traj, out / "snapshots.png"), plot_diagnostics(traj, out / "diagnostics.png")]
