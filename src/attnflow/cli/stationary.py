"""``attnflow stationary RUN``: classify a run's final state (index, minimiser or saddle, escape direction)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from attnflow.cli.app import UserError, app, guarded, say

#: Clusters listed in the table (the JSON output has them all).
MAX_ROWS = 20


@app.command()
@guarded
def stationary(
    run_dir: Path = typer.Argument(..., help="A run folder written by 'attnflow run'."),
    cluster_eps: Optional[float] = typer.Option(
        None, "--cluster-eps", help="Tokens with <x_i, x_j> > 1 - eps form one cluster (default: the run's)."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print the classification as JSON instead of tables."),
    escape_out: Optional[Path] = typer.Option(
        None, "--escape-out", help="Write the escape direction (N x d, .npy) to this file."
    ),
) -> None:
    """Classify the final state of a run as a critical point of the energy F: index, minimiser or saddle,
    and the escape direction of a saddle (see docs/model.md, "Stationary points").

    Examples:

      attnflow stationary runs/ou

      attnflow stationary runs/ou --json
    """
    import numpy as np

    from attnflow.analysis.stationary import classify_stationary, describe, token_clusters
    from attnflow.io.store import folder_kind, is_complete
    from attnflow.io.trajectory import load
    from attnflow.runs.folders import folder_status

    if folder_kind(run_dir) == "missing":
        raise UserError(f"no run folder at {str(run_dir)!r}.")
    if not is_complete(run_dir):
        raise UserError(folder_status(run_dir))
    if escape_out is not None and escape_out.suffix != ".npy":
        raise UserError(f"--escape-out must name a .npy file; got {str(escape_out)!r}.")
    if escape_out is not None and escape_out.exists():
        raise UserError(f"{str(escape_out)!r} exists; choose a new file name (nothing was written).")
    if cluster_eps is not None and not cluster_eps >= 0:
        raise UserError(f"--cluster-eps must be >= 0; got {cluster_eps}.")
    traj = load(run_dir)
    eps = cluster_eps
    if eps is None:
        eps = float(((traj.config or {}).get("diagnostics") or {}).get("cluster_eps", 1e-3))
    k = len(traj.t) - 1
    x = np.asarray(traj.x[k], dtype=np.float64)
    x = x / np.linalg.norm(x, axis=-1, keepdims=True)
    import torch

    clusters = int(token_clusters(torch.from_numpy(x), eps).max()) + 1
    say(f"classifying the state at t = {traj.t[k]:g} ({traj.N} tokens, {clusters} clusters, d = {traj.d})")
    p = classify_stationary(
        x,
        traj.heads_at(k),
        t=float(traj.t[k]),
        model=traj.model,
        token_weights=np.asarray(traj.token_weights, dtype=np.float64),
        head_weights=np.asarray(traj.head_weights, dtype=np.float64),
        cluster_eps=eps,
    )
    if escape_out is not None and p.escape is not None:
        escape_out.parent.mkdir(parents=True, exist_ok=True)
        np.save(escape_out, np.asarray(p.escape))
    if json_out:
        rec = {"path": str(run_dir), **p.summary()}
        rec["eigenvalues"] = [float(v) for v in p.eigenvalues]
        rec["split_eigenvalues"] = {str(c): [float(v) for v in s] for c, s in p.split_eigenvalues.items()}
        rec["centres"] = np.asarray(p.centres).tolist()
        rec["escape_per_cluster"] = (
            None if p.escape is None else [np.asarray(p.escape)[p.labels == c][0].tolist() for c in range(p.clusters)]
        )
        print(json.dumps(rec, indent=2))
        return
    out = Console()
    info = Table(show_header=False, box=None)
    rows = [
        ("index", str(p.index)),
        ("kind", p.kind),
        ("what", describe(p)),
        ("rigid / splitting index", f"{p.rigid_index} / {p.split_index}"),
        ("lowest eigenvalue", f"{p.lowest_eigenvalue:.6g}"),
        ("symmetry directions removed", str(p.symmetry_directions)),
        ("zero modes beyond symmetry", str(p.degenerate)),
        (
            "stationary",
            f"{p.stationary} (Newton step {p.newton_distance:.3g} rad, relative gradient {p.relative_gradient:.3g})",
        ),
        ("energy F", f"{p.energy:.10g}"),
        ("escape", "none (a minimiser)" if p.escape is None else "per cluster below (unit Frobenius norm over tokens)"),
    ]
    for key, val in rows:
        info.add_row(escape(key), escape(val))
    out.print(info)
    table = Table(title="clusters at the final state")
    for col in ("cluster", "tokens", "mass", "centre", "escape (first token)", "splitting eigenvalues"):
        table.add_column(col, justify="right")
    counts = np.bincount(p.labels, minlength=p.clusters)
    for c in range(min(p.clusters, MAX_ROWS)):
        esc = "-" if p.escape is None else np.array2string(np.asarray(p.escape)[p.labels == c][0], precision=4)
        split = p.split_eigenvalues.get(c)
        table.add_row(
            str(c),
            str(int(counts[c])),
            f"{p.cluster_masses[c]:.4g}",
            escape(np.array2string(p.centres[c], precision=4)),
            escape(esc),
            "-" if split is None else escape(np.array2string(split, precision=4)),
        )
    out.print(table)
    if p.clusters > MAX_ROWS:
        say(f"({p.clusters - MAX_ROWS} more clusters: see --json)")
    if escape_out is not None:
        say(
            f"wrote {escape_out}"
            if p.escape is not None
            else f"no escape direction (a minimiser): {escape_out} not written"
        )
