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
from attnflow.core.errors import Hint
from attnflow.core.figures import FIGURE_DPI
from attnflow.core.text import html_text, plain_label
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

        head = "".join(f"<th>{html_text(f'{v:g}')}</th>" for v in self.xs)
        body = ""
        for i, yv in enumerate(self.ys):
            cells = "".join(
                f"<td>{'-' if self.counts[i, j] == 0 else html_text(f'{self.values[i, j]:.4g}')}</td>"
                for j in range(len(self.xs))
            )
            body += f"<tr><th>{html_text(f'{yv:g}')}</th>{cells}</tr>"
        title = f"PhaseDiagram: mean {self.color} over seeds; rows {self.y}, columns {self.x}"
        if self.fixed:
            title += f" ({', '.join(f'{k} = {v}' for k, v in self.fixed.items())})"
        return (
            f"<div><b>{html_text(title)}</b><table><tr><th>{html_text(self.y)} \\ {html_text(self.x)}</th>"
            f"{head}</tr>{body}</table></div>"
        )


def _swept(out: Path) -> list[str]:
    from attnflow.config.yamlsafe import load_yaml
    from attnflow.io.store import read_small_text

    spec = load_yaml(read_small_text(out / SPEC)) if (out / SPEC).is_file() else {}
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
            raise ConfigError(
                f"the where item {item!r} must look like KEY=VALUE, e.g. 'heads.count=8'",
                hint=Hint("where", "heads.count=8"),
            )
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
            raise ConfigError(
                f"the where item {k}={raw} matches no point; {k} takes the values {values}.",
                hint=Hint("where", f"{k}=VALUE"),
            )
        frame = frame[mask]
    return frame


def phase_diagram(out: str | os.PathLike, x: str, y: str, color: str, where: list[str] | None = None) -> PhaseDiagram:
    """Average ``color`` over seeds on the grid of ``x`` by ``y`` (see the module docstring)."""
    out = Path(out)
    swept = _swept(out)
    fixed = _parse_where(where or [], swept)
    x_time, y_time = x in TIME, y in TIME
    if x_time and y_time:
        raise ConfigError("x and y cannot both be time; put a swept parameter on one axis.", hint=Hint("x"))
    xk = "t" if x_time else resolve_parameter(x, swept)
    yk = "t" if y_time else resolve_parameter(y, swept)
    if xk == yk:
        raise ConfigError(f"x and y are both {xk!r}; choose two different axes.", hint=Hint("y"))
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
        raise ConfigError(
            f"color={color!r} is not in the sweep table; choose one of {', '.join(options)}.",
            hint=Hint("color", options[0] if options else None),
        )
    others = [k for k in swept if k not in (xk, yk) and k not in fixed and frame[k].nunique() > 1]
    if others:
        k = others[0]
        listed = ", ".join(map(str, sorted(frame[k].unique(), key=str)))
        raise ConfigError(
            f"parameter {k} also varies (values {listed}); fix it with where=['{k}=VALUE'] so each cell averages seeds "
            "only.",
            hint=Hint("where", f"{k}=VALUE"),
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


#: An axis of at most this many integer values (``heads.count`` in {1, 8}) is drawn as categories.
CATEGORICAL_MAX = 12
#: Colour values spanning at least this ratio (max / min, all positive) get a logarithmic scale.
LOG_COLOR_RATIO = 100.0


def _is_integer_valued(v: np.ndarray) -> bool:
    v = np.asarray(v, dtype=np.float64)
    v = v[np.isfinite(v)]
    return bool(v.size) and bool(np.all(v == np.round(v)))


def categorical_axis(values: np.ndarray, log: bool) -> bool:
    """Whether an axis is drawn as evenly spaced categories: a few whole numbers, not on a log scale
    (midpoint cells around 1 and 8 would run from -2.5 to 11.5)."""
    return not log and len(values) <= CATEGORICAL_MAX and _is_integer_valued(values)


def _tick_label(v: float) -> str:
    return f"{v:g}"


def plot_phase_diagram(pd: PhaseDiagram, path: str | os.PathLike, *, log_x: bool = False, log_y: bool = False) -> Path:
    """Draw ``pd`` as a heatmap (:func:`phase_figure`) and save it to ``path``."""
    import matplotlib.pyplot as plt

    fig = phase_figure(pd, log_x=log_x, log_y=log_y)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=FIGURE_DPI)
    plt.close(fig)
    return path


def phase_figure(pd: PhaseDiagram, *, log_x: bool = False, log_y: bool = False):
    """The heatmap of ``pd`` (matplotlib ``pcolormesh``) as a ``Figure``, not saved.

    Axes of a few whole numbers are categories (one evenly sized cell each, ticks at the grid
    values); other axes tick at the grid values too when there are at most
    :data:`CATEGORICAL_MAX`. Colours are on a log scale when the values span
    :data:`LOG_COLOR_RATIO` or more, and the colour bar ticks whole numbers when every value is one.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import LogNorm
    from matplotlib.ticker import MaxNLocator

    for name, vals, log in (("x", pd.xs, log_x), ("y", pd.ys, log_y)):
        if not np.issubdtype(np.asarray(vals).dtype, np.number):
            raise ConfigError(f"the {name} axis values {list(vals)} are not numbers; a heatmap needs numeric axes.")
        if log and np.any(np.asarray(vals) <= 0):
            raise ConfigError(
                f"log_{name}=True needs positive values; got {list(vals)}.", hint=Hint(f"log_{name}", False)
            )
    cat_x, cat_y = categorical_axis(pd.xs, log_x), categorical_axis(pd.ys, log_y)
    ex = np.arange(len(pd.xs) + 1) - 0.5 if cat_x else _edges(pd.xs, log_x)
    ey = np.arange(len(pd.ys) + 1) - 0.5 if cat_y else _edges(pd.ys, log_y)
    finite = pd.values[np.isfinite(pd.values)]
    norm = None
    if finite.size and finite.min() > 0 and finite.max() / finite.min() >= LOG_COLOR_RATIO:
        norm = LogNorm(vmin=finite.min(), vmax=finite.max())
    fig, ax = plt.subplots(figsize=(6.4, 4.6))
    mesh = ax.pcolormesh(ex, ey, pd.values, shading="flat", cmap="viridis", norm=norm)
    if log_x:
        ax.set_xscale("log")
    if log_y:
        ax.set_yscale("log")
    for axis, vals, cat in ((ax.xaxis, pd.xs, cat_x), (ax.yaxis, pd.ys, cat_y)):
        if cat:
            axis.set_ticks(np.arange(len(vals)), [_tick_label(v) for v in vals])
        elif len(vals) <= CATEGORICAL_MAX:
            axis.set_ticks(np.asarray(vals, dtype=np.float64), [_tick_label(v) for v in vals])
            axis.set_ticks([], minor=True)
    label = f"{plain_label(pd.color)} (mean over seeds" + (", log scale)" if norm is not None else ")")
    bar = fig.colorbar(mesh, ax=ax, label=label)
    if norm is None and _is_integer_valued(finite):
        bar.locator = MaxNLocator(integer=True)
        bar.update_ticks()
    ax.set_xlabel("time t" if pd.x == "t" else plain_label(pd.x))
    ax.set_ylabel("time t" if pd.y == "t" else plain_label(pd.y))
    n = int(pd.counts.max()) if pd.counts.size else 0
    extra = plain_label(", ".join(f"{k}={v}" for k, v in pd.fixed.items()))
    ax.set_title(f"{plain_label(pd.color)}: {n} seed(s) per cell" + (f" ({extra})" if extra else ""), fontsize=10)
    fig.tight_layout()
    return fig
