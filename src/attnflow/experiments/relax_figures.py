"""The figures of ``ou`` and ``oscillating``: token snapshots, slope and settling curves, the lock-in fit."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from attnflow.analysis.lockin import amplitude_over, lockin_scales
from attnflow.experiments.relax_runs import FLOOR_FACTOR, LockInPair
from attnflow.viz.plotting import snapshot_indices


def figure_snapshots(trajs: dict, title: str):
    """Token clouds at four times per run: on the sphere (d = 3), on the circle (d = 2), or in the plane of
    the two leading principal axes of all saved tokens (d > 3)."""
    rows = len(trajs)
    fig = plt.figure(figsize=(13, 3.4 * rows))
    u, v = np.mgrid[0 : 2 * np.pi : 30j, 0 : np.pi : 15j]
    circle = np.linspace(0, 2 * np.pi, 200)
    for r, (name, traj) in enumerate(trajs.items()):
        idx = snapshot_indices(len(traj.t), 4)
        d = traj.x.shape[-1]
        if d > 3:
            flat = traj.x.reshape(-1, d)
            basis = np.linalg.svd(flat - flat.mean(0), full_matrices=False)[2][:2]
        for c, k in enumerate(idx):
            p = traj.x[k]
            title_k = f"{name}: t = {traj.t[k]:.3g}, clusters {int(traj.diagnostics['clusters'][k])}"
            if d == 3:
                ax = fig.add_subplot(rows, 4, 4 * r + c + 1, projection="3d")
                ax.plot_wireframe(np.cos(u) * np.sin(v), np.sin(u) * np.sin(v), np.cos(v), color="0.85", lw=0.3)
                ax.scatter(p[:, 0], p[:, 1], p[:, 2], s=7, c=np.arange(len(p)), cmap="viridis", depthshade=False)
                ax.set_box_aspect((1, 1, 1))
                ax.set_axis_off()
            else:
                ax = fig.add_subplot(rows, 4, 4 * r + c + 1)
                q = p if d == 2 else p @ basis.T
                ax.plot(np.cos(circle), np.sin(circle), color="0.8", lw=0.8)
                ax.scatter(q[:, 0], q[:, 1], s=9, c=np.arange(len(p)), cmap="viridis")
                ax.set_aspect("equal")
                ax.set_xlim(-1.1, 1.1)
                ax.set_ylim(-1.1, 1.1)
                if d == 2:
                    ax.set_axis_off()
                else:
                    ax.set_xlabel("PC 1", fontsize=7)
                    ax.set_ylabel("PC 2", fontsize=7)
                    ax.tick_params(labelsize=6)
            ax.set_title(title_k, fontsize=9)
    where = {2: "on the circle S^1", 3: "on the sphere S^2"}.get(
        next(iter(trajs.values())).x.shape[-1], "projected on two principal axes"
    )
    fig.suptitle(f"{title} (tokens {where})")
    fig.tight_layout()
    return fig


def figure_ou(traj, rel_inf, rel_0, idx, settle_ou, settle_ctrl, osc, fl, unit=("s_H", 1.0), position=None):
    """The ``ou`` figure; ``settle_ou`` ``(t, W2(mu_t, mu_T), Settling)`` over row #2's last look, ``settle_ctrl`` the
    same for its control and the control's label; ``position`` row #1's ``(t, D(mu_t, x*) / w_follow, settling window
    start, transient end)`` when it is tested by position (a fourth panel)."""
    fig, ax = plt.subplots(1, 4 if position is not None else 3, figsize=(20 if position is not None else 15, 4))
    ax[0].semilogy(traj.t, np.maximum(traj.diagnostics["slope"], 1e-300), label="OU")
    ax[0].semilogy(osc.t, np.maximum(osc.diagnostics["slope"], 1e-300), label="oscillating (control)", alpha=0.6)
    ax[0].axhline(fl.scale, color="k", lw=0.8, label=r"floor scale $s_H$")
    ax[0].axhline(FLOOR_FACTOR * fl.scale, color="k", ls=":", label=f"criterion {FLOOR_FACTOR:g} $s_H$")
    ax[0].axvspan(fl.runs["ou"].window[0], fl.runs["ou"].window[1], color="0.92")
    ax[0].set_title(r"slope $|\partial F|(\mu_t, \Theta_t)$")
    ax[1].semilogy(traj.t, rel_inf, label=r"$\Theta_\infty$ (the limiting law)")
    ax[1].semilogy(traj.t, rel_0, label=r"$\Theta_0$ (the t = 0 law)")
    name, s_H_in_unit = unit
    label = {
        "s_follow": r"$s_{follow}$",
        "s_follow (antipodal pair)": r"$s_{follow}$ (antipodal pair)",
        "s_H": r"$s_H$",
    }.get(name, name)
    ax[1].axhline(FLOOR_FACTOR, color="k", ls=":", label=f"criterion {FLOOR_FACTOR:g} {label}")
    if name != "s_H":
        ax[1].axhline(s_H_in_unit, color="0.5", lw=0.8, ls="--", label=r"floor scale $s_H$ (factor 1)")
    ax[1].axvspan(traj.t[idx[0]], traj.t[-1], color="0.92")
    ax[1].set_title(r"slope $|\partial F|(\mu_t, \Theta)$ / " + label)
    # Without t = T itself (where the distance is 0).
    (t_ou, w2_ou, s_ou), (t_c, w2_c, s_c, c_label) = settle_ou, settle_ctrl
    ax[2].semilogy(t_ou[:-1], w2_ou[:-1] / s_ou.bound, label="OU")
    ax[2].semilogy(t_c[:-1], w2_c[:-1] / s_c.bound, label=c_label)
    ax[2].axhline(1.0, color="k", ls=":", label="criterion (the bound)")
    ax[2].set_title(r"$W_2(\mu_t, \mu_T)$ / (0.1 displacement + 2 wander), settling window", fontsize=9)
    if position is not None:
        t_p, d_p, start, t_tr = position
        ax[3].semilogy(t_p, np.maximum(d_p, 1e-300), label="OU run (row 2's, to its last look)")
        ax[3].axhline(FLOOR_FACTOR, color="k", ls=":", label=f"criterion {FLOOR_FACTOR:g} " + r"$w_{follow}$")
        ax[3].axhline(1.0, color="0.5", lw=0.8, ls="--", label=r"$w_{follow}$ (linear response)")
        ax[3].axvspan(start, t_p[-1], color="0.92", label="settling window")
        ax[3].axvspan(t_p[0], t_tr, color="tab:red", alpha=0.08, label="transient (the control)")
        ax[3].set_title(r"distance from the rest point $D(\mu_t, x^*)$ / $w_{follow}$", fontsize=9)
    for a in ax:
        a.set_xlabel("t")
        a.grid(alpha=0.3, which="both")
        a.legend(fontsize=7)
    fig.tight_layout()
    return fig


def figure_osc(trajs: dict, laws: dict):
    fig, ax = plt.subplots(1, 3, figsize=(15, 4))
    for name, traj in trajs.items():
        ax[0].semilogy(traj.t, np.maximum(traj.diagnostics["slope"], 1e-300), label=name)
        ax[1].plot(traj.t, traj.diagnostics["energy"], label=name)
    for j, (name, law) in enumerate(laws.items()):
        ax[2].plot(law["t"], law["sampled"], color=f"C{j}", label=f"{name}: from {law['paths']} sampled paths")
        ax[2].plot(law["t"], law["closed_form"], "--", color=f"C{j}", lw=0.8, label=f"{name}: closed form")
    ax[0].set_title(r"slope $|\partial F|(\mu_t, \Theta_t)$")
    ax[1].set_title(r"energy $F(\mu_t, \Theta_t)$")
    ax[2].set_title(r"law path length $\int_0^t |\Theta'_s| ds$ (Bures-Wasserstein)")
    for a in ax:
        a.set_xlabel("t")
        a.grid(alpha=0.3)
        a.legend(fontsize=7)
    fig.tight_layout()
    return fig


def figure_lockin(lk: LockInPair):
    """Row #5's evidence: each run's most swinging token coordinate over the lock-in window (constant and drift
    removed) with its fitted ``a cos(omega t) + b sin(omega t)``."""
    scales = dict(zip(("oscillating", "ou"), lockin_scales(lk.oscillating, lk.ou)))
    fig, ax = plt.subplots(1, 2, figsize=(12, 3.6))
    for a, name in zip(ax, ("oscillating", "ou")):
        t, y, fit = lk.series[name]
        f = lk.fit(name)
        a.plot(t, y, lw=0.8, label="token coordinate, constant and drift removed")
        a.plot(t, fit, "--", lw=1.2, label=r"fitted $a\cos\omega t + b\sin\omega t$")
        a.set_title(f"{name}: A = {f.amplitude:.3g} ({amplitude_over(f.amplitude, scales[name]):.3g} noise scales)")
        a.set_xlabel("t")
        a.grid(alpha=0.3)
        a.legend(fontsize=7)
    for a in ax:
        a.set_ylabel("coordinate (own scale)")
    fig.tight_layout()
    return fig
