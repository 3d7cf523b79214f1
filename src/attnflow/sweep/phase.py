"""Phase diagrams of a sweep: a diagnostic over two axes (parameters or time), averaged over seeds.

An axis is a swept parameter (``heads.beta``, or just ``beta`` when the last part is unique) or
``t`` (time; the per-time table is used then). The colour is a diagnostic: with a time axis any of
:data:`attnflow.diagnostics.DIAGNOSTICS`; otherwise a column of the results table
(``clusters`` means ``clusters_end``; ``clusters_mean``, ``slope_floor``, ``t_cluster`` ... as named).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from attnflow.config import ConfigError
from attnflow.sweep.table import SPEC, load_sweep_results

TIME = ("t", "time")


@dataclass
class PhaseDiagram:
    """``values[i, j]``: mean of ``color`` over seeds at ``y = ys[i]``, ``x = xs[j]``; ``counts`` the samples."""

    x: str
    y: str
    color: str
    xs: np.ndarray
    ys: np.ndarray
    values: np.ndarray
    counts: np.ndarray
    fixed: dict

    def __repr__(self) -> str:
        return (
            f"PhaseDiagram(x={self.x!r}, y={self.y!r}, color={self.color!r}, grid={len(self.ys)}x{len(self.xs)}, "
            f"fixed={self.fixed!r})"
        )

    def _repr_html_(self) -> str:
        """The grid itself: rows y, columns x, cells the mean of ``color`` (n seeds)."""
        import html

        head = "".join(f"<th>{html.escape(f'{v:g}')}</th>" for v in self.xs)
        body = ""
        for i, yv in enumerate(self.ys):
            cells = "".join(
                f"<td>{'-' if self.counts[i, j] == 0 else html.escape(f'{self.values[i, j]:.4g}')}</td>"
                for j in range(len(self.xs))
            )
            body += f"<tr><th>{html.escape(f'{yv:g}')}</th>{cells}</tr>"
        title = f"PhaseDiagram: mean {self.color} over seeds; rows {self.y}, columns {self.x}"
        if self.fixed:
            title += f" ({', '.join(f'{k} = {v}' for k, v in self.fixed.items())})"
        return (
            f"<div><b>{html.escape(title)}</b><table><tr><th>{html.escape(self.y)} \\ {html.escape(self.x)}</th>"
            f"{head}</tr>{body}</table></div>"
        )


def _swept(out: Path) -> list[str]:
    import yaml

    spec = yaml.safe_load((out / SPEC).read_text()) if (out / SPEC).is_file() else {}
    grid = (spec or {}).get("grid") or {}
    return list(grid.get("product") or {}) + list(grid.get("zip") or {})


def resolve_parameter(name: str, swept: list[str]) -> str:
    """``beta`` -> ``heads.beta`` when exactly one swept key ends with it."""
    if name in swept:
        return name
    hits = [k for k in swept if k.split(".")[-1] == name]
    if len(hits) == 1:
        return hits[0]
    if not swept:
        raise ConfigError(f"this sweep has no grid parameters, so {name!r} cannot be an axis; use 't' for time.")
    if len(hits) > 1:
        raise ConfigError(f"{name!r} is ambiguous: it could be {', '.join(hits)}; give the full key.")
    raise ConfigError(f"{name!r} is not a swept parameter; the sweep varies {', '.join(swept)} (or use 't' for time).")


def _parse_where(where: list[str], swept: list[str]) -> dict[str, str]:
    fixed = {}
    for item in where:
        if "=" not in item:
            raise ConfigError(f"--where {item!r} must look like KEY=VALUE, e.g. heads.count=8")
        k, v = item.split("=", 1)
        fixed[resolve_parameter(k.strip(), swept)] = v.strip()
    return fixed


def _select(frame, fixed: dict[str, str]):
    import yaml

    for k, raw in fixed.items():
        want = yaml.safe_load(raw)
        col = frame[k]
        mask = col == want
        if not mask.any():
            mask = col.astype(str) == raw
        if not mask.any():
            values = ", ".join(map(str, sorted(col.dropna().unique(), key=str)))
            raise ConfigError(f"--where {k}={raw} matches no point; {k} takes the values {values}.")
        frame = frame[mask]
    return frame


def phase_diagram(out: str | os.PathLike, x: str, y: str, color: str, where: list[str] | None = None) -> PhaseDiagram:
    """Average ``color`` over seeds on the grid of ``x`` by ``y`` (see the module docstring)."""
    out = Path(out)
    swept = _swept(out)
    fixed = _parse_where(where or [], swept)
    x_time, y_time = x in TIME, y in TIME
    if x_time and y_time:
        raise ConfigError("--x and --y cannot both be time; put a swept parameter on one axis.")
    xk = "t" if x_time else resolve_parameter(x, swept)
    yk = "t" if y_time else resolve_parameter(y, swept)
    if xk == yk:
        raise ConfigError(f"--x and --y are both {xk!r}; choose two different axes.")
    timed = x_time or y_time
    frame = load_sweep_results(out, timeseries=timed)
    if not timed:
        frame = frame[frame["status"] == "ok"]
    if frame.empty:
        raise ConfigError(f"the sweep at {str(out)!r} has no finished point to plot.")
    frame = _select(frame, fixed)
    ck = color
    if ck not in frame.columns and f"{color}_end" in frame.columns:
        ck = f"{color}_end"
    if ck not in frame.columns:
        skip = {"point", "index", "seed", "status", "error", "trajectory", "t", *swept}
        options = [c for c in frame.columns if c not in skip]
        raise ConfigError(f"--color {color!r} is not in the sweep table; choose one of {', '.join(options)}.")
    others = [k for k in swept if k not in (xk, yk) and k not in fixed and frame[k].nunique() > 1]
    if others:
        k = others[0]
        listed = ", ".join(map(str, sorted(frame[k].unique(), key=str)))
        raise ConfigError(
            f"parameter {k} also varies (values {listed}); fix it with --where {k}=VALUE so each cell averages seeds only."
        )
    grouped = frame.groupby([yk, xk])[ck].agg(["mean", "count"])
    xs = np.array(sorted(frame[xk].unique()))
    ys = np.array(sorted(frame[yk].unique()))
    values = np.full((len(ys), len(xs)), np.nan)
    counts = np.zeros((len(ys), len(xs)), dtype=int)
    xi = {v: j for j, v in enumerate(xs)}
    yi = {v: i for i, v in enumerate(ys)}
    for (yv, xv), row in grouped.iterrows():
        values[yi[yv], xi[xv]] = row["mean"]
        counts[yi[yv], xi[xv]] = row["count"]
    return PhaseDiagram(xk, yk, ck, xs, ys, values, counts, fixed)


def _edges(c: np.ndarray, log: bool) -> np.ndarray:
    """Cell edges around the centres ``c`` (midpoints; geometric midpoints on a log axis)."""
    c = np.asarray(c, dtype=np.float64)
    if len(c) == 1:
        return np.array([c[0] * 0.5, c[0] * 2.0]) if log else np.array([c[0] - 0.5, c[0] + 0.5])
    v = np.log(c) if log else c
    mid = (v[1:] + v[:-1]) / 2
    e = np.concatenate([[v[0] - (mid[0] - v[0])], mid, [v[-1] + (v[-1] - mid[-1])]])
    return np.exp(e) if log else e


def plot_phase_diagram(pd: PhaseDiagram, path: str | os.PathLike, *, log_x: bool = False, log_y: bool = False) -> Path:
    """Draw ``pd`` as a heatmap (matplotlib ``pcolormesh``) and save it to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for name, vals, log in (("x", pd.xs, log_x), ("y", pd.ys, log_y)):
        if not np.issubdtype(np.asarray(vals).dtype, np.number):
            raise ConfigError(f"the {name} axis values {list(vals)} are not numbers; a heatmap needs numeric axes.")
        if log and np.any(np.asarray(vals) <= 0):
            raise ConfigError(f"--log-{name} needs positive values; got {list(vals)}.")
    fig, ax = plt.subplots(figsize=(6.4, 4.6))
    mesh = ax.pcolormesh(_edges(pd.xs, log_x), _edges(pd.ys, log_y), pd.values, shading="flat", cmap="viridis")
    if log_x:
        ax.set_xscale("log")
    if log_y:
        ax.set_yscale("log")
    fig.colorbar(mesh, ax=ax, label=f"{pd.color} (mean over seeds)")
    ax.set_xlabel("time t" if pd.x == "t" else pd.x)
    ax.set_ylabel("time t" if pd.y == "t" else pd.y)
    n = int(pd.counts.max()) if pd.counts.size else 0
    extra = ", ".join(f"{k}={v}" for k, v in pd.fixed.items())
    ax.set_title(f"{pd.color}: {n} seed(s) per cell" + (f" ({extra})" if extra else ""), fontsize=10)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
