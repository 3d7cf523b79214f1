"""What ``attnflow show``, ``plot`` and ``report`` add for a folder written by ``attnflow hf run``
(one that holds ``hf_comparison.zarr``): the comparison tables, the hf figures and the tokens."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import numpy as np
import xarray as xr

from attnflow.core.text import html_text
from attnflow.hf.flow import COMPARISON, Comparison, load_comparison
from attnflow.hf.plot import plot_comparison, plot_heads
from attnflow.io.safety import atomic_write, read_regular, refuse_link


def is_hf_run(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a run folder written by ``attnflow hf run``."""
    return (Path(path) / COMPARISON).is_dir()


def comparison_from_dataset(ds: xr.Dataset) -> Comparison:
    """The :class:`Comparison` stored in ``hf_comparison.zarr`` (without the heads themselves)."""

    def get(name: str) -> np.ndarray:
        return np.asarray(ds[name].values)

    meta = {k[3:]: v for k, v in ds.attrs.items() if k.startswith("hf_")}
    return Comparison(
        real=get("real_x"),
        sim=get("sim_x"),
        ids=get("input_ids"),
        radius=get("radius"),
        cluster_eps=float(ds.attrs.get("cluster_eps", 1e-3)),
        tokens=json.loads(ds.attrs["tokens"]) if "tokens" in ds.attrs else [],
        meta=meta,
        restart=get("restart_x"),
        rand=get("random_x"),
        rand_restart=get("random_restart_x"),
        attention=get("attention"),
        head_speed=get("head_speed"),
        head_collapse=get("head_collapse"),
        head_log_mobility=get("head_log_mobility"),
        total_speed=get("total_speed"),
    )


#: ``(column title, variable)`` of the per-depth comparison table.
DEPTH_COLUMNS = (
    ("cos flow", "cos_flow"),
    ("no move", "cos_nomove"),
    ("random", "cos_random"),
    ("cos 1-layer", "cos_restart"),
    ("no move", "cos_restart_nomove"),
    ("random", "cos_restart_random"),
    ("<x,x'> model", "mean_inner_real"),
    ("flow", "mean_inner_sim"),
    ("random", "mean_inner_random"),
    ("eff. rank model", "effective_rank_real"),
    ("flow", "effective_rank_sim"),
    ("nn cos model", "nn_cosine_real"),
    ("flow", "nn_cosine_sim"),
)


def depth_table(ds: xr.Dataset) -> tuple[list[str], list[list[str]]]:
    """Header and rows (one per depth) of the comparison, where the dataset has them."""
    cols = [(t, v) for t, v in DEPTH_COLUMNS if v in ds]
    header = ["depth", *[t for t, _ in cols]]
    rows = []
    for l in range(ds.sizes["layer"]):
        rows.append([str(l), *[f"{float(ds[v][l]):.3f}" for _, v in cols]])
    return header, rows


def head_table(ds: xr.Dataset, top: int = 3) -> tuple[list[str], list[list[str]]]:
    """Per layer: the heads that push hardest toward collapse, their share of the motion, and the
    layer's total push (the per-head parts add up to it)."""
    header = [
        "layer",
        "d/dt <x,x'> (all heads)",
        f"top {top} heads toward collapse (push, share of motion)",
        "log mobility min..max (head)",
    ]
    rows: list[list[str]] = []
    if "head_collapse" not in ds:
        return header, rows
    C, S = ds["head_collapse"].values, ds["head_speed"].values
    M = ds["head_log_mobility"].values
    share = S / np.maximum(S.sum(1, keepdims=True), 1e-300)
    for l in range(C.shape[0]):
        order = np.argsort(-C[l])[:top]
        lo, hi = int(np.argmin(M[l])), int(np.argmax(M[l]))
        rows.append(
            [
                str(l),
                f"{C[l].sum():+.3f}",
                ", ".join(f"h{h} ({C[l, h]:+.3f}, {100 * share[l, h]:.0f}%)" for h in order),
                f"{M[l, lo]:.2f} (h{lo}) .. {M[l, hi]:.2f} (h{hi})",
            ]
        )
    return header, rows


def path_line(ds: xr.Dataset) -> str | None:
    """The weight path ``int |Theta'| dt`` across depth, real vs random heads."""
    if "path_A" not in ds:
        return None
    return (
        f"weight path across depth (sum of relative jumps, scale-free): A {float(ds.path_A.sum()):.3f} "
        f"(random heads {float(ds.path_A_random.sum()):.3f}), V {float(ds.path_V.sum()):.3f} "
        f"(random {float(ds.path_V_random.sum()):.3f}) over {ds.sizes['jump']} layer boundaries"
    )


def plot_hf(run_dir: str | os.PathLike, out: str | os.PathLike) -> list[Path]:
    """Draw ``hf_comparison.png`` and ``hf_heads.png`` of an hf run folder into ``out``."""
    out = Path(out)
    refuse_link(out, "figures folder")
    out.mkdir(parents=True, exist_ok=True)
    ds = load_comparison(run_dir)
    cmp = comparison_from_dataset(ds)
    paths = [plot_comparison(cmp, out / "hf_comparison.png")]
    heads = plot_heads(cmp, out / "hf_heads.png")
    return paths + ([heads] if heads is not None else [])


def _html_table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html_text(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html_text(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table border='1' cellpadding='3' style='border-collapse:collapse'><tr>{head}</tr>{body}</table>"


def report_section(run_dir: str | os.PathLike) -> str:
    """An HTML section: the prompt's tokens, the comparison and head tables, the hf figures."""
    ds = load_comparison(run_dir)
    cmp = comparison_from_dataset(ds)
    tokens = cmp.tokens or [str(i) for i in cmp.ids.tolist()]
    parts = [
        "<h2>The real model and its attention-only flow</h2>",
        f"<p>Prompt ({len(tokens)} tokens): <code>{html_text(' '.join(tokens))}</code></p>",
        "<p>Depth l: the sphere point the norm feeding layer l sees. Cosines are means over tokens of "
        "&lt;x_i, x_i(model)&gt;; 'no move' keeps the positions of depth 0 (cumulative) or of depth l-1 "
        "(1-layer); 'random' uses random heads of the same shapes and norms.</p>",
        _html_table(*depth_table(ds)),
        "<h3>Which heads drive the collapse</h3>",
        _html_table(*head_table(ds)),
    ]
    line = path_line(ds)
    if line:
        parts.append(f"<p>{html_text(line)}</p>")
    figures = Path(run_dir) / "figures"
    for name in ("hf_comparison.png", "hf_heads.png"):
        p = figures / name
        if p.is_file():
            data = base64.b64encode(read_regular(p, run_dir)).decode()
            parts.append(f"<p><img alt='{name}' style='max-width:100%' src='data:image/png;base64,{data}'></p>")
    return "<section id='hf-comparison'>" + "\n".join(parts) + "</section>"


def add_to_report(run_dir: str | os.PathLike, report: str | os.PathLike) -> Path:
    """Insert :func:`report_section` into an already written report page (before ``</body>``)."""
    p = Path(report)
    refuse_link(p, "report")
    page = read_regular(p).decode("utf-8")
    section = report_section(run_dir)
    page = page.replace("</body>", section + "\n</body>", 1) if "</body>" in page else page + section
    with atomic_write(p) as fh:  # never through a link
        fh.write(page)
    return p
