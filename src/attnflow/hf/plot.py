"""The real model and the simulated flow side by side, and what each head does (matplotlib, Agg)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

from attnflow.core.text import plain_label

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from attnflow.core.figures import FIGURE_DPI
from attnflow.hf.flow import HIST_EDGES, Comparison
from attnflow.hf.measures import mean_cosine, measure_path
from attnflow.viz.plotting import pca_basis, snapshot_indices


def token_labels(cmp: Comparison) -> list[str]:
    """The token strings (``#i`` plus the id where the prompt was given as ids)."""
    if cmp.tokens:
        return list(cmp.tokens)
    return [f"#{i}:{t}" for i, t in enumerate(cmp.ids.tolist())]


def _label(ax, p: np.ndarray, labels: list[str]) -> None:
    for (u, v), s in zip(p, labels):
        ax.annotate(s, (u, v), fontsize=6, alpha=0.8, xytext=(2, 2), textcoords="offset points")


def plot_comparison(cmp: Comparison, path: str | Path, count: int = 4) -> Path:
    """Rows: real tokens, simulated tokens (one PCA basis for both, points labelled with their
    token strings), pairwise inner-product histograms; last column: agreement with the model
    against depth (cumulative and restarted, each with its no-move and random-heads baseline), and
    the threshold-free clustering measures of model, flow and random-heads flow."""
    L1 = cmp.real.shape[0]
    idx = snapshot_indices(L1, count)
    basis, var = pca_basis(np.concatenate([cmp.real, cmp.sim]), 2)
    hr, hs = cmp.histogram(cmp.real), cmp.histogram(cmp.sim)
    labels = token_labels(cmp)
    cols = len(idx) + 1
    fig, axes = plt.subplots(3, cols, figsize=(3.4 * cols, 9.4), squeeze=False)
    lim = 1.05 * max(np.abs(cmp.real @ basis.T).max(), np.abs(cmp.sim @ basis.T).max())
    colors = np.arange(cmp.real.shape[1])
    for c, l in enumerate(idx):
        for row, (X, name) in enumerate([(cmp.real, "model"), (cmp.sim, "flow")]):
            ax = axes[row, c]
            p = X[l] @ basis.T
            ax.scatter(p[:, 0], p[:, 1], c=colors, cmap="viridis", s=14)
            _label(ax, p, labels)
            ax.set_xlim(-lim, lim)
            ax.set_ylim(-lim, lim)
            ax.set_aspect("equal")
            ax.set_title(f"{name}, depth {l}", fontsize=9)
            if c == 0:
                ax.set_ylabel(f"PC2 ({100 * var[1]:.0f}%)")
            if row == 1:
                ax.set_xlabel(f"PC1 ({100 * var[0]:.0f}%)")
        ax = axes[2, c]
        ax.stairs(hr[l], HIST_EDGES, label="model")
        ax.stairs(hs[l], HIST_EDGES, label="flow", ls="--")
        ax.set_title(f"<x_i, x_j>, depth {l}", fontsize=9)
        ax.legend(fontsize=7)
    depth = np.arange(L1)
    ax = axes[0, -1]
    ax.plot(depth, mean_cosine(cmp.sim, cmp.real), "o-", label="flow (cumulative)")
    ax.plot(depth, mean_cosine(np.broadcast_to(cmp.real[:1], cmp.real.shape), cmp.real), "k:", label="no move")
    if cmp.rand is not None:
        ax.plot(depth, mean_cosine(cmp.rand, cmp.real), "x--", color="gray", label="random heads")
    if cmp.restart is not None and cmp.rand_restart is not None:
        prev = np.concatenate([cmp.real[:1], cmp.real[:-1]])
        ax.plot(depth[1:], mean_cosine(cmp.restart, cmp.real)[1:], "s-", label="flow, 1 layer from model")
        ax.plot(depth[1:], mean_cosine(prev, cmp.real)[1:], "k-.", alpha=0.6, label="no move, 1 layer")
        ax.plot(depth[1:], mean_cosine(cmp.rand_restart, cmp.real)[1:], "+--", color="silver", label="random, 1 layer")
    ax.set_ylim(-0.05, 1.05)
    ax.set_title("mean cosine with the model", fontsize=9)
    ax.legend(fontsize=6)
    m_real, m_sim = measure_path(cmp.real), measure_path(cmp.sim)
    m_rand = measure_path(cmp.rand) if cmp.rand is not None else None
    for ax, name, title in (
        (axes[1, -1], "mean_inner", "mean <x_i, x_j>"),
        (axes[2, -1], "effective_rank", "effective rank exp(spectral entropy)"),
    ):
        ax.plot(depth, m_real[name], "o-", label="model")
        ax.plot(depth, m_sim[name], "s--", label="flow")
        if m_rand is not None:
            ax.plot(depth, m_rand[name], "x:", color="gray", label="random heads")
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("depth")
        ax.legend(fontsize=7)
    m = cmp.meta
    fig.suptitle(
        f"{plain_label(m.get('architecture', '?'))}: L={m.get('layers')}, H={m.get('heads')}, d={m.get('hidden')}, "
        f"N={cmp.real.shape[1]} tokens - model (top) vs attention-only flow (middle)",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=FIGURE_DPI)
    plt.close(fig)
    return Path(path)


def plot_heads(cmp: Comparison, path: str | Path) -> Path | None:
    """Every head's attention map at the model's real positions (rows: layers, columns: heads;
    axes labelled with the token strings), then per head its share of the motion and its push
    toward collapse (``d/dt`` of the mean inner product)."""
    if cmp.attention is None or cmp.head_speed is None or cmp.head_collapse is None:
        return None
    L, H, N, _ = cmp.attention.shape
    labels = token_labels(cmp)
    fig = plt.figure(figsize=(1.6 * H + 1, 1.6 * L + 3.6))
    gs = fig.add_gridspec(L + 1, H, height_ratios=[1] * L + [1.6])
    for l in range(L):
        for h in range(H):
            ax = fig.add_subplot(gs[l, h])
            ax.imshow(cmp.attention[l, h], vmin=0, vmax=1, cmap="magma")
            ax.set_xticks([])
            ax.set_yticks([])
            if l == 0:
                ax.set_title(f"head {h}", fontsize=8)
            if h == 0:
                ax.set_ylabel(f"layer {l}", fontsize=8)
                if N <= 24:
                    ax.set_yticks(range(N), labels, fontsize=4)
            if l == L - 1 and N <= 24:
                ax.set_xticks(range(N), labels, fontsize=4, rotation=90)
    share = cmp.head_speed / np.maximum(cmp.head_speed.sum(1, keepdims=True), 1e-300)
    for k, (M, title, cmap) in enumerate(
        [
            (share, "share of the motion mean_i |v_h| / sum_h", "viridis"),
            (cmp.head_collapse, "push toward collapse d/dt mean <x_i,x_j> (per head)", "coolwarm"),
        ]
    ):
        ax = fig.add_subplot(gs[L, k * (H // 2) : (k + 1) * (H // 2)])
        lim = np.abs(M).max() or 1.0
        im = ax.imshow(M, aspect="auto", cmap=cmap, vmin=-lim if cmap == "coolwarm" else 0, vmax=lim)
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.set_title(title, fontsize=8)
        fig.colorbar(im, ax=ax, fraction=0.04)
    fig.suptitle("attention maps p_hij at the model's positions (rows: query i, columns: key j)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=FIGURE_DPI)
    plt.close(fig)
    return Path(path)
