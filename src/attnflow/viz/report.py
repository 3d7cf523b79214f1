"""``report.html``: one self-contained, offline, interactive page per run (plotly, plotly.js inlined).

Left: the token cloud at a saved time (on ``S^2``, or the PCA view for ``d > 3``), coloured by
final cluster (the rule of every attnflow figure, :func:`attnflow.viz.views.cluster_colouring`)
with markers that grow with the mass of the cluster a token belongs to, a time slider and a play
button. Right: energy ``F(mu_t, t)``, slope ``|dF|`` and metric speed ``|mu'|`` (one curve for
``gf``, where they are equal), cluster count, order parameter, the energy-dissipation budget (when
the run recorded it) and the weights' path ``||A_h(t)||_F``, each with the current time marked.
Below: the run's config and provenance.

The page holds plotly.js once and each array once (:func:`pack_figure`); the figure is plain data
(:func:`report_spec`), so that writing it needs neither torch nor plotly's checks of every frame
(issue 43: the preset run's report went from 7-12 s of CPU to about 2 s).
"""

from __future__ import annotations

import base64
import json
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import yaml

from attnflow._version import __version__
from attnflow.analysis.budget import edi_budget
from attnflow.core.errors import InputError
from attnflow.core.text import html_text
from attnflow.core.trajectory import Trajectory
from attnflow.io.lock import output_lock
from attnflow.io.safety import atomic_write
from attnflow.io.store import REPORT_MARK, check_file_out
from attnflow.io.trajectory import load
from attnflow.viz.views import (
    PALETTE,
    cluster_colouring,
    cluster_labels,
    head_norms,
    speed_equals_slope,
    view3d,
)

if TYPE_CHECKING:
    import plotly.graph_objects as go

REPORT = "report.html"

# (diagnostic names, subplot title, log y axis): one curve panel each, top to bottom.
_PANELS: tuple[tuple[tuple[str, ...], str, bool], ...] = (
    (("energy",), "energy F(μ_t, t)", False),
    (("slope", "metric_speed"), "slope |∂F|(μ_t, t) and metric speed |μ′|(t)", True),
    (("clusters",), "clusters K(t)", True),
    (("order_parameter", "mean_inner"), "order parameter |Σ a_i x_i| and mean ⟨x_i, x_j⟩", False),
)
#: y-axis title of each panel (unicode symbols: the page works offline, without MathJax).
_Y_TITLES = ("F", "|∂F|, |μ′|", "K", "order")
#: Legend names of the curves.
_CURVE_NAMES = {
    "energy": "F(μ_t, t)",
    "slope": "slope |∂F|",
    "metric_speed": "metric speed |μ′|",
    "clusters": "clusters K",
    "order_parameter": "|Σ a_i x_i|",
    "mean_inner": "mean ⟨x_i, x_j⟩",
}
#: Cumulated terms of the energy-dissipation budget drawn in its panel: (key, legend name, colour).
_EDI_CURVES = (
    ("energy_change", "F(μ_t,t) − F(μ_0,0)", PALETTE[0]),
    ("weights", "weights ∫∂_r F dr", PALETTE[1]),
    ("dissipation", "dissipation ½∫|μ′|² + ½∫|∂F|²", PALETTE[3]),
    ("residual", "residual", "#000000"),
)
_CURVE_COLOURS = {
    "energy": PALETTE[0],
    "slope": PALETTE[3],
    "metric_speed": PALETTE[5],
    "clusters": PALETTE[4],
    "order_parameter": PALETTE[2],
    "mean_inner": PALETTE[1],
}


def frame_indices(n_saved: int, max_frames: int) -> np.ndarray:
    """At most ``max_frames`` saved indices, evenly spread, always including the first and the last."""
    if max_frames < 2:
        raise InputError(f"max_frames must be at least 2; got {max_frames}")
    return np.unique(np.linspace(0, n_saved - 1, min(n_saved, max_frames)).round().astype(int))


def _sphere_wireframe(n_lat: int = 9, n_lon: int = 12, pts: int = 61) -> dict[str, Any]:
    """Meridians and parallels of the unit sphere as one line trace (``NaN`` breaks the line)."""
    segs = []
    s = np.linspace(0, 2 * np.pi, pts)
    for lat in np.linspace(-np.pi / 2, np.pi / 2, n_lat)[1:-1]:
        segs.append(np.stack([np.cos(lat) * np.cos(s), np.cos(lat) * np.sin(s), np.full(pts, np.sin(lat))], -1))
    half = np.linspace(-np.pi / 2, np.pi / 2, pts)
    for lon in np.linspace(0, 2 * np.pi, n_lon, endpoint=False):
        segs.append(np.stack([np.cos(half) * np.cos(lon), np.cos(half) * np.sin(lon), np.sin(half)], -1))
    gap = np.full((1, 3), np.nan)
    xyz = np.concatenate([part for seg in segs for part in (seg, gap)]).astype(np.float32)
    return dict(
        type="scatter3d",
        x=xyz[:, 0],
        y=xyz[:, 1],
        z=xyz[:, 2],
        mode="lines",
        line=dict(color="#d0d0d0", width=1),
        hoverinfo="skip",
        showlegend=False,
        name="sphere",
    )


def token_sizes(labels: np.ndarray, a: np.ndarray, size: float) -> np.ndarray:
    """Marker diameter (px) of each token: ``size * (N m)^(1/4)`` with ``m`` the mass of its current
    cluster, so marker *areas* follow :func:`attnflow.viz.views.marker_area` (``sqrt`` of the mass)."""
    mass = np.bincount(labels, weights=np.asarray(a, dtype=np.float64))[labels]
    return size * np.maximum(mass * len(labels), 1e-12) ** 0.25


def _tokens_trace(xyz: np.ndarray, labels: np.ndarray, colours: list[str], sizes: np.ndarray) -> dict[str, Any]:
    xyz = np.asarray(xyz, dtype=np.float32)
    return dict(
        type="scatter3d",
        x=xyz[:, 0],
        y=xyz[:, 1],
        z=xyz[:, 2],
        mode="markers",
        marker=dict(size=np.round(sizes, 2).astype(np.float32), color=colours, line=dict(width=0)),
        customdata=labels.astype(np.int32),
        hovertemplate="token %{pointNumber}<br>cluster %{customdata}<extra></extra>",
        showlegend=False,
        name="tokens",
    )


def _positive(a: np.ndarray) -> np.ndarray:
    return np.where(np.isfinite(a) & (a > 0), a, np.nan)


def _marker_trace(t: float, lo: float, hi: float, row_name: str) -> dict[str, Any]:
    return dict(
        type="scatter",
        x=[t, t],
        y=[lo, hi],
        mode="lines",
        line=dict(color="#444", width=1.5, dash="dot"),
        hoverinfo="skip",
        showlegend=False,
        name=f"now ({row_name})",
    )


#: Most tokens drawn in the 3-D view by default: beyond, a browser struggles and the file grows by
#: about 23 bytes per token and frame; clusters are still computed on every token.
MAX_TOKENS = 10_000


def token_subset(n: int, max_tokens: int) -> np.ndarray:
    """At most ``max_tokens`` of ``n`` token indices: all of them, or a fixed random subset (sorted)."""
    if max_tokens < 1:
        raise InputError(f"max_tokens must be at least 1; got {max_tokens}")
    if n <= max_tokens:
        return np.arange(n)
    return np.sort(np.random.default_rng(0).choice(n, size=max_tokens, replace=False))


def report_figure(
    traj: Trajectory, *, max_frames: int = 200, marker_size: float = 4.0, max_tokens: int = MAX_TOKENS
) -> go.Figure:
    """The interactive figure of :func:`write_report` (a ``plotly.graph_objects.Figure`` with frames).

    At most ``max_tokens`` tokens are drawn (a fixed random subset); their cluster colours and the
    cluster counts come from the whole cloud. The same figure as :func:`report_spec`, checked by plotly
    (the page itself writes the spec unchecked: checking the frames costs seconds, issue 43).
    """
    import plotly.graph_objects as go

    return go.Figure(report_spec(traj, max_frames=max_frames, marker_size=marker_size, max_tokens=max_tokens))


def report_spec(
    traj: Trajectory, *, max_frames: int = 200, marker_size: float = 4.0, max_tokens: int = MAX_TOKENS
) -> dict[str, Any]:
    """The figure of :func:`write_report` as plain data: ``{"data", "layout", "frames"}`` in plotly's
    figure schema, NumPy arrays where plotly takes arrays (see :func:`report_figure` for the arguments)."""
    from plotly.subplots import make_subplots

    idx = frame_indices(len(traj.t), max_frames)
    shown = token_subset(traj.N, max_tokens)
    view = view3d(traj.x)
    col = cluster_colouring(traj)
    colours = [col.colours[k] for k in col.final[shown]]  # fixed over time: the final cluster's colour
    a = np.asarray(traj.token_weights, dtype=np.float64)
    all_labels = [cluster_labels(traj.x[k], col.eps) for k in idx]
    labels = [lab[shown] for lab in all_labels]
    sizes = [token_sizes(lab, a, marker_size)[shown] for lab in all_labels]
    budget = edi_budget(traj) if traj.model == "gf" and traj.steps else None
    merged = speed_equals_slope(traj)
    panels = [(("slope",), "slope |∂F| = metric speed |μ′| (equal for gf)", True) if p[0] == ("slope", "metric_speed")
              and merged else p for p in _PANELS]  # fmt: skip
    n_rows = len(panels) + 1 + (budget is not None)  # curves, EDI budget, weights' path (right column)
    titles = [
        (f"tokens (PCA of d = {traj.d})" if not view.on_sphere else "tokens on the sphere")
        + f": colour = final cluster ({len(col.mass)}), size grows with mass"
    ]
    titles += [p[1] for p in panels]
    if budget is not None:
        titles.append(f"energy-dissipation budget, cumulated (residual {budget.total_residual:.2e})")
    titles.append("weights' path ‖A_h(t)‖_F" + (" (dashed: ‖V_h‖_F)" if traj.V is not None else ""))
    # The layout (subplot domains, titles, axes) comes from plotly's make_subplots; the traces and
    # frames are plain dicts placed on its axes (plotly's checks of the frames cost seconds).
    fig = make_subplots(
        rows=n_rows,
        cols=2,
        column_widths=[0.56, 0.44],
        horizontal_spacing=0.07,
        vertical_spacing=0.06,
        specs=[[{"type": "scene", "rowspan": n_rows}, {"type": "xy"}]] + [[None, {"type": "xy"}]] * (n_rows - 1),
        subplot_titles=titles,
    )
    data: list[dict[str, Any]] = []

    def add(trace: dict[str, Any], row: int) -> int:
        """Place ``trace`` on the panel of ``row`` in the right column; its index in ``data``."""
        sub = fig.get_subplot(row, 2)
        data.append(
            {
                **trace,
                "xaxis": sub.xaxis.plotly_name.replace("axis", ""),
                "yaxis": sub.yaxis.plotly_name.replace("axis", ""),
            }
        )
        return len(data) - 1

    if view.on_sphere:
        data.append({**_sphere_wireframe(), "scene": "scene"})
    token_trace = len(data)
    data.append({**_tokens_trace(view.xyz[idx[0]][shown], labels[0], colours, sizes[0]), "scene": "scene"})

    t = np.asarray(traj.t, dtype=np.float64)
    ranges: list[tuple[float, float, str]] = []  # y extent of each panel, for its time marker
    for r, (names, _, log) in enumerate(panels, start=1):
        vals = []
        for name in names:
            if name not in traj.diagnostics:
                continue
            y = np.asarray(traj.diagnostics[name], dtype=np.float64)
            y = _positive(y) if log else np.where(np.isfinite(y), y, np.nan)
            vals.append(y)
            add(
                dict(
                    type="scatter",
                    x=t,
                    y=y,
                    mode="lines",
                    name=panels[r - 1][1].split(" (")[0] if merged and name == "slope" else _CURVE_NAMES[name],
                    legendgroup=name,
                    line=dict(color=_CURVE_COLOURS.get(name), width=1.8),
                ),
                r,
            )
        if log:
            fig.update_yaxes(type="log", nticks=4, row=r, col=2)
        fig.update_yaxes(title_text=_Y_TITLES[r - 1], row=r, col=2)
        ranges.append(_extent(vals, names[0]))
    if budget is not None:
        r = len(panels) + 1
        for key, name, colour in _EDI_CURVES:
            add(
                dict(
                    type="scatter",
                    x=budget.t,
                    y=budget.cumulative[key],
                    mode="lines",
                    name=name,
                    line=dict(color=colour, width=1.6, dash="solid" if key == "residual" else "dash"),
                ),
                r,
            )
        fig.update_yaxes(title_text="cumulated", row=r, col=2)
        ranges.append(_extent([budget.cumulative[k] for k, _, _ in _EDI_CURVES], "edi"))
    norms = head_norms(traj)
    for h in range(traj.H):
        colour = PALETTE[h % len(PALETTE)]
        add(
            dict(
                type="scatter",
                x=t,
                y=norms["A"][:, h],
                mode="lines",
                line=dict(color=colour, width=1.2),
                name=f"head {h}",
                legendgroup="heads",
                showlegend=False,
                hovertemplate=f"head {h}: " + "%{y:.4g}<extra></extra>",
            ),
            n_rows,
        )
        if "V" in norms:
            add(
                dict(
                    type="scatter",
                    x=t,
                    y=norms["V"][:, h],
                    mode="lines",
                    showlegend=False,
                    line=dict(color=colour, width=1.0, dash="dash"),
                    name=f"V head {h}",
                    hovertemplate=f"V head {h}: " + "%{y:.4g}<extra></extra>",
                ),
                n_rows,
            )
    fig.update_yaxes(title_text="‖A_h‖_F", row=n_rows, col=2)
    ranges.append(_extent([n for n in norms.values()], "weights"))

    marker_traces = [
        add(_marker_trace(float(t[idx[0]]), lo, hi, name), r) for r, (lo, hi, name) in enumerate(ranges, start=1)
    ]
    for r in range(1, n_rows + 1):
        # one time axis for all panels: zooming one zooms all
        fig.update_xaxes(matches=None if r == 1 else "x", row=r, col=2, showticklabels=(r == n_rows))
    fig.update_xaxes(title_text="time t (depth)", row=n_rows, col=2)

    frames = []
    for k, lab, full, size in zip(idx, labels, all_labels, sizes):
        frame_data = [_tokens_trace(view.xyz[k][shown], lab, colours, size)]
        frame_data += [_marker_trace(float(t[k]), lo, hi, name) for lo, hi, name in ranges]
        frames.append(
            dict(
                data=frame_data,
                traces=[token_trace] + marker_traces,
                name=str(int(k)),
                layout=dict(title=dict(text=_title(traj, k, full, len(shown)))),
            )
        )

    step_args = lambda name: [
        [name],
        {
            "frame": {"duration": 0, "redraw": True},
            "mode": "immediate",
            "transition": {"duration": 0},
        },
    ]
    fig.update_layout(
        # The title (two lines) at the top of the page and the legend in its own band below it, above the
        # subplot titles: a horizontal legend at the plot area's edge wraps leftwards over both.
        title=dict(
            text=_title(traj, idx[0], all_labels[0], len(shown)), x=0.01, y=0.985, yref="container", yanchor="top"
        ),
        height=1100,
        margin=dict(l=30, r=20, t=190, b=40),
        template="plotly_white",
        legend=dict(orientation="h", yanchor="bottom", y=1.03, xanchor="right", x=1.0),
        scene=dict(
            aspectmode="cube",
            xaxis_title=view.axis_titles[0],
            yaxis_title=view.axis_titles[1],
            zaxis_title=view.axis_titles[2],
            # fixed ranges: with autorange the axes would rescale from frame to frame
            **{k: dict(range=list(r)) for k, r in zip(("xaxis", "yaxis", "zaxis"), _scene_ranges(view))},
        ),
        uirevision="keep-camera",
    )
    # the play button and the time slider as plain data (plotly's checks of 200 slider steps cost ~0.3 s)
    controls = dict(
        updatemenus=[
            dict(
                type="buttons",
                direction="left",
                x=0.0,
                y=-0.02,
                xanchor="left",
                yanchor="top",
                showactive=False,
                buttons=[
                    dict(
                        label="Play",
                        method="animate",
                        args=[
                            None,
                            {
                                "frame": {"duration": 120, "redraw": True},
                                "fromcurrent": True,
                                "transition": {"duration": 0},
                                "mode": "immediate",
                            },
                        ],
                    ),
                    dict(
                        label="Pause",
                        method="animate",
                        args=[
                            [None],
                            {
                                "frame": {"duration": 0, "redraw": False},
                                "mode": "immediate",
                                "transition": {"duration": 0},
                            },
                        ],
                    ),
                ],
            )
        ],
        sliders=[
            dict(
                active=0,
                x=0.1,
                y=-0.02,
                len=0.45,
                xanchor="left",
                yanchor="top",
                pad=dict(t=0, b=10),
                currentvalue=dict(prefix="t = ", visible=True),
                steps=[dict(method="animate", label=f"{t[k]:.3g}", args=step_args(str(int(k)))) for k in idx],
            )
        ],
    )
    return {"data": data, "layout": {**fig.layout.to_plotly_json(), **controls}, "frames": frames}


def _scene_ranges(view) -> list[tuple[float, float]]:
    if view.on_sphere:
        return [(-1.05, 1.05)] * 3
    lo, hi = view.xyz.min(axis=(0, 1)), view.xyz.max(axis=(0, 1))
    pad = 0.05 * (hi - lo).max()
    return [(float(a - pad), float(b + pad)) for a, b in zip(lo, hi)]


def _extent(series: list[np.ndarray], name: str) -> tuple[float, float, str]:
    finite = np.concatenate([np.ravel(s)[np.isfinite(np.ravel(s))] for s in series]) if series else np.array([])
    if finite.size == 0:
        return 0.0, 1.0, name
    return float(finite.min()), float(finite.max()), name


def _title(traj: Trajectory, k: int, labels: np.ndarray, shown: int | None = None) -> str:
    drawn = f", {shown:,} of {traj.N:,} tokens drawn" if shown is not None and shown < traj.N else ""
    return (
        f"attnflow run: model {html_text(traj.model)}, N = {traj.N}, d = {traj.d}, H = {traj.H}, "
        f"{html_text(traj.method)}, dt = {traj.dt:g}<br><sub>t = {traj.t[k]:.4g}, clusters = {int(labels.max()) + 1}{drawn}</sub>"
    )


def _table(record: dict[str, Any]) -> str:
    rows = "".join(f"<tr><th>{html_text(k)}</th><td>{html_text(_fmt(v))}</td></tr>" for k, v in record.items())
    return f"<table>{rows}</table>"


def _fmt(v: Any) -> str:
    return json.dumps(v) if isinstance(v, (dict, list)) else str(v)


_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
{mark}
<title>{title}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 1em 2em; color: #222; }}
pre {{ background: #f6f6f6; padding: 0.8em; overflow-x: auto; }}
table {{ border-collapse: collapse; }}
th, td {{ text-align: left; padding: 0.15em 0.8em; border-bottom: 1px solid #eee; font-size: 0.9em; }}
.meta {{ display: flex; gap: 3em; flex-wrap: wrap; }}
</style>
</head>
<body>
<h1>{title}</h1>
<p>{summary}</p>
{figure}
<div class="meta">
<div><h2>Config</h2>{config}</div>
<div><h2>Provenance</h2>{provenance}</div>
</div>
<p><small>Written by attnflow {version}. Self-contained: plotly.js and the data are embedded, once each; no network is needed.</small></p>
</body>
</html>
"""


#: Arrays with at least this many entries go once into the page's shared table and are referenced
#: from the figure (the token colours of every frame, the time axis of every curve): one copy each.
SHARED_MIN_LENGTH = 16
#: The element ids of the figure and of its data on the page.
DIV_ID = "attnflow-report"

# plotly.js decodes typed arrays written as {"dtype", "bdata"} (base64): 4 bytes a float32 instead of
# ~10 characters of decimal text, and no float formatting in Python.
_BDATA = {"f8": "<f8", "f4": "<f4", "u1": "u1", "i2": "<i2", "i4": "<i4"}
_INT_RANGES = {"u1": (0, 2**8 - 1), "i2": (-(2**15), 2**15 - 1), "i4": (-(2**31), 2**31 - 1)}

_DRAW = """<script>
(function () {
  "use strict";
  const shared = JSON.parse(document.getElementById("DIV-shared").textContent);
  // {"$ref": i} is entry i of the shared table: the same object wherever it is used
  const fig = JSON.parse(document.getElementById("DIV-figure").textContent, function (key, value) {
    return value !== null && typeof value === "object" && typeof value.$ref === "number" && Object.keys(value).length === 1
      ? shared[value.$ref]
      : value;
  });
  window.PLOTLYENV = window.PLOTLYENV || {};
  Plotly.newPlot("DIV", fig.data, fig.layout, {displaylogo: false, responsive: true}).then(function () {
    return Plotly.addFrames("DIV", fig.frames);
  });
})();
</script>"""


def _array_json(a: np.ndarray) -> Any:
    """A NumPy array as plotly.js's typed-array object (``float64``, ``float32``, or the narrowest of
    ``uint8``, ``int16``, ``int32`` for integers), else a list."""
    if a.ndim != 1 or a.dtype.kind not in "fiub":
        return _plain(a.tolist())
    if a.dtype.kind in "iub":  # the narrowest type that holds the values (cluster labels: one byte mostly)
        lo, hi = (int(a.min()), int(a.max())) if a.size else (0, 0)
        code = next((c for c, (cl, ch) in _INT_RANGES.items() if cl <= lo and hi <= ch), "f8")
    else:
        code = "f4" if a.dtype == np.float32 else "f8"
    raw = np.ascontiguousarray(a, dtype=_BDATA[code]).tobytes()
    return {"dtype": code, "bdata": base64.b64encode(raw).decode("ascii")}


def _plain(v: Any) -> Any:
    """``v`` with non-finite floats as ``null`` (JSON has no NaN) and NumPy scalars as Python numbers."""
    if isinstance(v, list):
        return [_plain(x) for x in v]
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def pack_figure(spec: dict[str, Any], min_length: int = SHARED_MIN_LENGTH) -> tuple[list[Any], Any]:
    """``(shared, figure)``: ``spec`` as JSON-ready data where every array of at least ``min_length``
    entries is replaced by ``{"$ref": i}``, ``shared[i]`` holding it once however often it is used."""
    shared: list[Any] = []
    index: dict[Any, int] = {}

    def ref(key: Any, value: Any) -> dict[str, int]:
        if key not in index:
            index[key] = len(shared)
            shared.append(value)
        return {"$ref": index[key]}

    def walk(v: Any) -> Any:
        if isinstance(v, dict):
            return {str(k): walk(x) for k, x in v.items()}
        if isinstance(v, np.ndarray):
            enc = _array_json(v)
            if v.size < min_length:
                return enc
            return ref(("array", json.dumps(enc, sort_keys=True)), enc)
        if isinstance(v, (list, tuple)):
            items = [walk(x) for x in v]
            if len(items) >= min_length and all(isinstance(x, (str, int, float)) for x in items):
                return ref(("list", json.dumps(items)), items)
            return items
        return _plain(v)

    return shared, walk(spec)


def _script_json(v: Any) -> str:
    """``v`` as JSON that is safe inside ``<script>``: no ``<``, ``>`` or ``&`` appears raw (a string of
    the run cannot close the element), and JSON.parse reads it unchanged."""
    text = json.dumps(v, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


def plotly_js() -> str:
    """The plotly.js bundle shipped with the installed plotly (read from its package data: no network)."""
    from importlib.resources import files

    return (files("plotly") / "package_data" / "plotly.min.js").read_text(encoding="utf-8")


def figure_html(spec: dict[str, Any]) -> str:
    """The figure's part of the page: plotly.js once, the shared arrays once, the figure, and the call
    that draws it (``Plotly.newPlot``, then the frames)."""
    shared, figure = pack_figure(spec)
    height = spec.get("layout", {}).get("height", 980)
    return (
        "<script>window.PlotlyConfig = {MathJaxConfig: 'local'};</script>\n"
        f"<script>{plotly_js()}</script>\n"
        f'<div id="{DIV_ID}" class="plotly-graph-div" style="height:{int(height)}px; width:100%;"></div>\n'
        f'<script type="application/json" id="{DIV_ID}-shared">{_script_json(shared)}</script>\n'
        f'<script type="application/json" id="{DIV_ID}-figure">{_script_json(figure)}</script>\n'
        + _DRAW.replace("DIV", DIV_ID)
    )


def report_html(
    traj: Trajectory,
    *,
    title: str | None = None,
    max_frames: int = 200,
    max_tokens: int = MAX_TOKENS,
    ended: str | None = None,
) -> str:
    """The whole page as a string (plotly.js and the data inlined, each once).

    ``ended`` is the sentence on the final state (the run's ``summary.json`` holds it); without it the
    state is classified here (:func:`attnflow.analysis.stationary.ended_at`, which needs torch).
    """
    spec = report_spec(traj, max_frames=max_frames, max_tokens=max_tokens)
    figure = figure_html(spec)
    if ended is None:
        from attnflow.analysis.stationary import ended_at

        ended = ended_at(traj)[1]
    d = traj.diagnostics
    summary = (
        f"{len(traj.t)} saved times from t = {traj.t[0]:.4g} to {traj.t[-1]:.4g}"
        f" ({len(spec['frames'])} shown on the slider). Energy {d['energy'][0]:.6g} &rarr; {d['energy'][-1]:.6g};"
        f" slope {d['slope'][0]:.3g} &rarr; {d['slope'][-1]:.3g}; clusters {int(d['clusters'][0])} &rarr;"
        f" {int(d['clusters'][-1])}."
    )
    if traj.model == "gf" and traj.steps:
        b = edi_budget(traj)
        rel = f" ({b.relative_residual:.2e} of the dissipation)" if b.total_dissipation > 0 else ""
        summary += (
            f" Energy-dissipation budget ({html_text(b.method)}, dt = {b.dt:g}): residual {b.total_residual:.3e}{rel}."
        )
    summary += f" Ended at: {html_text(ended)}."  # the final state classified (issue 29)
    if traj.N > max_tokens:
        summary += (
            f" The 3-D view draws {max_tokens:,} of the {traj.N:,} tokens (a fixed random subset;"
            " colours and cluster counts are those of the whole cloud)."
        )
    if traj.d > 3:
        var = view3d(traj.x).explained
        assert var is not None
        summary += (
            f" Tokens live in d = {traj.d}: the view shows the top three principal directions of all"
            f" saved tokens, explaining {100 * var.sum():.1f}% of the variance"
            f" ({', '.join(f'{100 * v:.1f}%' for v in var)})."
        )
    config = (
        f"<pre>{html_text(yaml.safe_dump(traj.config, sort_keys=False))}</pre>"
        if traj.config
        else "<p>(no config: the run was made from Python)</p>"
    )
    page_title = title or f"attnflow report: {(traj.config or {}).get('name', traj.model)}"
    return _PAGE.format(
        title=html_text(page_title),
        summary=summary,
        figure=figure,
        config=config,
        provenance=_table(traj.provenance),
        version=__version__,
        mark=REPORT_MARK,
    )


def _summary_ended(run: str | os.PathLike) -> str | None:
    """The final state's sentence recorded in the run's ``summary.json`` (read after :func:`load` checked
    the folder against its manifest), else ``None`` (then :func:`report_html` classifies the state)."""
    from attnflow.io.summary import read_summary

    s = read_summary(Path(run))
    ended = s.get("ended_at") if s else None
    text = ended.get("text") if isinstance(ended, dict) else None
    return text if isinstance(text, str) else None


def write_report(
    run: Trajectory | str | os.PathLike,
    out: str | os.PathLike | None = None,
    *,
    max_frames: int = 200,
    title: str | None = None,
    max_tokens: int = MAX_TOKENS,
    force: bool = False,
) -> Path:
    """Write the interactive report of a run (a :class:`Trajectory` or a run folder) and return its path.

    ``out`` defaults to ``RUN/report.html`` for a run folder (required for a trajectory), which is
    replaced freely (it belongs to the run folder). Another existing ``out`` is replaced only with
    ``force`` and only when it is an attnflow report (:func:`attnflow.io.store.check_file_out`);
    a link is never written through.
    ``max_frames`` bounds the number of saved times on the slider (evenly spread) and ``max_tokens``
    the tokens drawn, which bound the file size: about ``max_frames * min(N, max_tokens) * 23``
    bytes on top of plotly.js (4.8 MB, written once).
    """
    if max_tokens < 1:
        raise InputError(f"max_tokens must be at least 1; got {max_tokens}")
    if isinstance(run, Trajectory):
        if out is None:
            raise InputError("write_report(trajectory) needs out=PATH (a run folder gets RUN/report.html)")
        traj = run
        owned = False
        ended = None
    else:
        traj = load(run)
        ended = _summary_ended(run)
        owned = out is None or Path(out).resolve() == (Path(run) / REPORT).resolve()
        out = Path(run) / REPORT if out is None else out
    path = Path(out)
    check_file_out(path, "report", force=force, owned=owned)
    page = report_html(traj, title=title, max_frames=max_frames, max_tokens=max_tokens, ended=ended)
    with output_lock(path, what="report"):  # one writer: a second report of the same file is refused
        check_file_out(path, "report", force=force, owned=owned)
        with atomic_write(path) as fh:
            fh.write(page)
    return path
