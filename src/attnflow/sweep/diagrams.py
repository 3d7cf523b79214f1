"""Built-in phase diagrams: a (beta, H) sweep run on Dask, drawn as (beta, H) and (beta, t) diagrams.

:func:`phase_diagrams` builds the sweep (a base config, the grid ``heads.beta`` x ``heads.count``,
seeds), runs it with :func:`attnflow.sweep.runner.run_sweep` (Dask, resumable) and draws, averaged
over seeds with :func:`attnflow.sweep.phase.phase_diagram`:

* (beta, H): the final cluster count, the time to clustering and the late slope ``|dF|`` (the mean
  over the late window);
* (beta, t) at one head count: the cluster count and the slope over time.

Every figure puts its ticks at the grid values, uses a log axis for a geometric grid, and a log
colour scale where the values span a decade or more (:func:`plot_diagram`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from attnflow.config import ConfigError
from attnflow.core.figures import FIGURE_DPI
from attnflow.sweep.phase import PhaseDiagram, phase_diagram
from attnflow.sweep.spec import GridSpec, SweepSpec

#: (x, y, colour, file stem, colour label) of every built-in diagram.
DIAGRAMS: tuple[tuple[str, str, str, str, str], ...] = (
    ("heads.beta", "heads.count", "clusters", "beta_H_clusters", "final cluster count"),
    ("heads.beta", "heads.count", "t_cluster", "beta_H_t_cluster", "time to clustering"),
    ("heads.beta", "heads.count", "slope_mean", "beta_H_late_slope", "late slope |dF| (late-window mean)"),
    ("heads.beta", "t", "clusters", "beta_t_clusters", "cluster count"),
    ("heads.beta", "t", "slope", "beta_t_slope", "slope |dF|"),
)


@dataclass
class PhaseDiagrams:
    """The sweep folder, the diagrams computed from it and the figure of each."""

    out: Path
    diagrams: dict[str, PhaseDiagram] = field(default_factory=dict)
    figures: dict[str, Path] = field(default_factory=dict)


def cell_edges(c: np.ndarray, log: bool) -> np.ndarray:
    """Cell edges around the grid values ``c`` (midpoints; geometric midpoints on a log axis), so each
    cell is centred on its grid value and the ticks can sit there."""
    c = np.asarray(c, dtype=np.float64)
    if len(c) == 1:
        return np.array([c[0] * 0.5, c[0] * 2.0]) if log else np.array([c[0] - 0.5, c[0] + 0.5])
    v = np.log(c) if log else c
    mid = (v[1:] + v[:-1]) / 2
    e = np.concatenate([[v[0] - (mid[0] - v[0])], mid, [v[-1] + (v[-1] - mid[-1])]])
    return np.exp(e) if log else e


def geometric(values: Sequence[float] | np.ndarray) -> bool:
    """Whether a positive grid is closer to geometric than to arithmetic (then it is drawn on a log axis)."""
    v = np.asarray(sorted(values), dtype=np.float64)
    if len(v) < 3 or v[0] <= 0:
        return False
    lin = np.std(np.diff(v)) / np.mean(np.diff(v))
    log = np.std(np.diff(np.log(v))) / np.mean(np.diff(np.log(v)))
    return bool(log < lin)


def spans_decades(values: np.ndarray) -> bool:
    """Whether the finite values are positive and span a factor of 10 or more (log colour scale)."""
    v = values[np.isfinite(values)]
    return bool(v.size and v.min() > 0 and v.max() / v.min() >= 10)


def plot_diagram(pd: PhaseDiagram, path: str | os.PathLike, *, label: str | None = None) -> Path:
    """Heatmap of ``pd``: ticks at the grid values, log axes for geometric grids, a log colour scale when the
    values span decades, empty (NaN) cells hatched and counted in the title."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import LogNorm

    xs, ys = np.asarray(pd.xs, dtype=np.float64), np.asarray(pd.ys, dtype=np.float64)
    log_x, log_y = geometric(xs), pd.y != "t" and geometric(ys)
    fig, ax = plt.subplots(figsize=(6.6, 4.8))
    ax.set_facecolor("0.85")
    ax.patch.set_hatch("//")
    vals = np.ma.masked_invalid(pd.values)
    norm = LogNorm(vmin=float(vals.min()), vmax=float(vals.max())) if spans_decades(pd.values) else None
    mesh = ax.pcolormesh(cell_edges(xs, log_x), cell_edges(ys, log_y), vals, shading="flat", cmap="viridis", norm=norm)
    if log_x:
        ax.set_xscale("log")
    if log_y:
        ax.set_yscale("log")
    ax.set_xticks(xs)
    ax.set_xticklabels([f"{v:g}" for v in xs], rotation=45 if len(xs) > 8 else 0)
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    if pd.y != "t":
        ax.set_yticks(ys)
        ax.set_yticklabels([f"{v:g}" for v in ys])
        ax.yaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    scale = " (log scale)" if norm is not None else ""
    cbar = fig.colorbar(mesh, ax=ax, label=f"{label or pd.color}{scale}")
    if norm is not None:  # plain numbers (2, 5, 20), not 2 x 10^0, on the log colour scale
        cbar.ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        cbar.ax.yaxis.set_minor_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    ax.set_xlabel("beta (heads.beta)" if pd.x == "heads.beta" else pd.x)
    ax.set_ylabel("time t" if pd.y == "t" else ("heads H (heads.count)" if pd.y == "heads.count" else pd.y))
    empty = int(np.sum(~np.isfinite(pd.values)))
    n = int(pd.counts.max()) if pd.counts.size else 0
    extra = ", ".join(f"{k}={v}" for k, v in pd.fixed.items())
    ax.set_title(
        f"{label or pd.color}: mean over {n} seed(s)"
        + (f" ({extra})" if extra else "")
        + (f"; {empty} empty" if empty else ""),
        fontsize=10,
    )
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=FIGURE_DPI)
    plt.close(fig)
    return path


def phase_sweep(
    *,
    base: str | dict[str, Any] = "ou",
    betas: Sequence[float],
    heads: Sequence[int],
    seeds: int = 2,
    overrides: dict[str, Any] | None = None,
    name: str = "phase",
) -> SweepSpec:
    """The sweep behind the built-in diagrams: ``base`` (a preset, a config path or mapping) with ``overrides``,
    over ``heads.beta`` x ``heads.count``, ``seeds`` seeds per cell."""
    if len(betas) < 1 or len(heads) < 1:
        raise ConfigError("give at least one beta and one head count")
    if any(not np.isfinite(b) for b in betas):
        raise ConfigError(f"every beta must be a finite number; got {list(betas)}")
    if any(int(h) != h or h < 1 for h in heads):
        raise ConfigError(f"head counts must be positive integers; got {list(heads)}")
    grid = GridSpec(product={"heads.beta": [float(b) for b in betas], "heads.count": [int(h) for h in heads]})
    return SweepSpec(name=name, base=base, set=dict(overrides or {}), grid=grid, seeds=seeds)


def phase_diagrams(
    out: str | os.PathLike,
    *,
    base: str | dict[str, Any] = "ou",
    betas: Sequence[float],
    heads: Sequence[int],
    seeds: int = 2,
    overrides: dict[str, Any] | None = None,
    time_heads: int | None = None,
    scheduler: str | None = None,
    workers: int | None = None,
    client: Any = None,
    on_progress: Callable[[int, int, int], None] | None = None,
    confirm: Callable[[Any], None] | None = None,
) -> PhaseDiagrams:
    """Run the (beta, H) sweep on Dask into ``out`` (resumable) and draw every diagram of :data:`DIAGRAMS` into
    ``out/diagrams``; the (beta, t) ones at ``time_heads`` heads (default: the largest head count)."""
    from attnflow.sweep.runner import run_sweep

    spec = phase_sweep(base=base, betas=betas, heads=heads, seeds=seeds, overrides=overrides)
    h_t = int(time_heads if time_heads is not None else max(heads))
    if h_t not in [int(h) for h in heads]:
        raise ConfigError(f"time_heads = {h_t} is not one of the head counts {list(heads)}")
    run_sweep(spec, out, scheduler=scheduler, workers=workers, client=client, on_progress=on_progress, confirm=confirm)
    res = PhaseDiagrams(Path(out))
    for x, y, color, stem, label in DIAGRAMS:
        where = [f"heads.count={h_t}"] if y == "t" else []
        pd = phase_diagram(out, x, y, color, where=where)
        res.diagrams[stem] = pd
        res.figures[stem] = plot_diagram(pd, Path(out) / "diagrams" / f"{stem}.png", label=label)
    return res
