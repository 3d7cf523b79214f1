"""The real model and the simulated flow side by side (matplotlib, Agg)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from attnflow.hf.flow import HIST_EDGES, Comparison
from attnflow.viz.plotting import pca_basis, snapshot_indices


def plot_comparison(cmp: Comparison, path: str | Path, count: int = 4) -> Path:
    """Rows: real tokens, simulated tokens (one PCA basis for both), pairwise inner-product
    histograms; last column: cosine agreement and cluster counts against depth."""
    L1 = cmp.real.shape[0]
    idx = snapshot_indices(L1, count)
    basis, var = pca_basis(np.concatenate([cmp.real, cmp.sim]), 2)
    hr, hs = cmp.histogram(cmp.real), cmp.histogram(cmp.sim)
    cols = len(idx) + 1
    fig, axes = plt.subplots(3, cols, figsize=(3.2 * cols, 8.6), squeeze=False)
    lim = 1.05 * max(np.abs(cmp.real @ basis.T).max(), np.abs(cmp.sim @ basis.T).max())
    colors = np.arange(cmp.real.shape[1])
    for c, l in enumerate(idx):
        for row, (X, name) in enumerate([(cmp.real, "model"), (cmp.sim, "flow")]):
            ax = axes[row, c]
            p = X[l] @ basis.T
            ax.scatter(p[:, 0], p[:, 1], c=colors, cmap="viridis", s=14)
            ax.set_xlim(-lim, lim)
            ax.set_ylim(-lim, lim)
            ax.set_aspect("equal")
            ax.set_title(f"{name}, layer {l}", fontsize=9)
            if c == 0:
                ax.set_ylabel(f"PC2 ({100 * var[1]:.0f}%)")
            if row == 1:
                ax.set_xlabel(f"PC1 ({100 * var[0]:.0f}%)")
        ax = axes[2, c]
        ax.stairs(hr[l], HIST_EDGES, label="model")
        ax.stairs(hs[l], HIST_EDGES, label="flow", ls="--")
        ax.set_title(f"<x_i, x_j>, layer {l}", fontsize=9)
        ax.legend(fontsize=7)
    cos = cmp.cosine
    ax = axes[0, -1]
    ax.plot(range(L1), cos.mean(-1), "o-", label="mean")
    ax.plot(range(L1), cos.min(-1), "s--", label="min")
    ax.set_ylim(min(-0.05, cos.min() - 0.05), 1.05)
    ax.set_title("cosine(flow, model)", fontsize=9)
    ax.legend(fontsize=7)
    ax = axes[1, -1]
    ax.plot(range(L1), cmp.clusters(cmp.real), "o-", label="model")
    ax.plot(range(L1), cmp.clusters(cmp.sim), "s--", label="flow")
    ax.set_title(f"clusters (eps = {cmp.cluster_eps:g})", fontsize=9)
    ax.set_xlabel("layer")
    ax.legend(fontsize=7)
    axes[2, -1].axis("off")
    m = cmp.meta
    fig.suptitle(
        f"{m.get('architecture', '?')}: L={m.get('layers')}, H={m.get('heads')}, d={m.get('hidden')}, "
        f"N={cmp.real.shape[1]} tokens - model (top) vs attention-only flow (middle)",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return Path(path)
