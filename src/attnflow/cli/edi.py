"""``attnflow edi DIR``: the energy-dissipation budget of a saved ``gf`` run (table + plot)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from attnflow.cli.app import UserError, app, guarded, say
from attnflow.cli.threads import run_pairs, threaded


def plot_budget(budget, path: Path) -> Path:
    """Cumulative budget terms over time (and the residual on its own axis), saved as PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from attnflow.core.text import plain_label

    c = budget.cumulative
    fig, (ax, axr) = plt.subplots(2, 1, figsize=(7, 6), sharex=True, height_ratios=(3, 1.4))
    ax.plot(budget.t, c["energy_change"], label=r"$F(\mu_t,t)-F(\mu_0,0)$")
    ax.plot(budget.t, c["weights"], label=r"weights $\int \partial_r F\,dr$")
    ax.plot(budget.t, c["dissipation"], label=r"dissipation $\frac{1}{2}\int|\mu'|^2+\frac{1}{2}\int|\partial F|^2$")
    ax.plot(budget.t, -c["dissipation"] + c["weights"], "k:", label="weights - dissipation")
    ax.set_ylabel("cumulated")
    ax.legend(fontsize=8)
    ax.set_title(f"energy-dissipation budget ({plain_label(budget.method)}, dt={budget.dt:g})")
    axr.plot(budget.t, c["residual"], color="C3")
    axr.set_ylabel("residual")
    axr.set_xlabel("t")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    from attnflow.core.figures import FIGURE_DPI  # here: the CLI's start-up must not load torch

    fig.savefig(path, dpi=FIGURE_DPI)
    plt.close(fig)
    return path


@app.command()
@guarded
@threaded(lambda kw: run_pairs(kw.get("run_dir")))
def edi(
    run_dir: Path = typer.Argument(..., help="A run folder of model 'gf' written by 'attnflow run'."),
    rows: int = typer.Option(10, "--rows", help="Rows of the table (evenly spaced times)."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Plot file (default RUN/figures/edi.png)."),
) -> None:
    """Print the energy-dissipation budget of a run and save a plot of its terms over time.

    F(mu_t, t) - F(mu_0, 0) + 1/2 int |mu'|^2 + 1/2 int |dF|^2 - int dF/dr dr = residual (0 for the
    exact flow; O(dt^order) for the integrator). Example:

      attnflow run --preset oscillating --out runs/osc && attnflow edi runs/osc
    """
    from attnflow.analysis.edi import edi_budget
    from attnflow.io.store import FIGURES, is_complete
    from attnflow.io.trajectory import load

    if not run_dir.is_dir():
        raise UserError(f"no run folder at {str(run_dir)!r}.")
    if not is_complete(run_dir):
        raise UserError(f"{str(run_dir)!r} is not a complete run folder (no finished provenance.json).")
    if rows < 1:
        raise UserError(f"--rows must be a positive integer; got {rows}.")
    b = edi_budget(load(run_dir))
    c = b.cumulative
    n = len(b.t) - 1
    idx = sorted({int(round(k)) for k in [n * i / max(rows - 1, 1) for i in range(rows)]})
    table = Table(title=f"energy-dissipation budget of {escape(str(run_dir))} (cumulated from t = {b.t[0]:g})")
    for col in ("t", "F(mu_t, t)", "energy change", "weights", "1/2 int |mu'|^2", "1/2 int |dF|^2", "residual"):
        table.add_column(col, justify="right")
    for k in idx:
        table.add_row(
            f"{b.t[k]:.4g}",
            f"{b.energy[k]:.7g}",
            f"{c['energy_change'][k]:.7g}",
            f"{c['weights'][k]:.7g}",
            f"{c['speed_action'][k]:.7g}",
            f"{c['slope_action'][k]:.7g}",
            f"{c['residual'][k]:.3e}",
        )
    out_console = Console(width=160)
    out_console.print(table)
    out_console.print(
        f"method {b.method} (order {b.order}), dt = {b.dt:g}, weights: {b.weights_rule} (dA/dt: {b.weights_derivative}), "
        f"quadrature: {b.quadrature}\n"
        f"residual order {b.residual_order}: {b.residual_order_reason}\n"
        f"total dissipation {b.total_dissipation:.8g}   residual {b.total_residual:.3e}   "
        f"relative residual {b.relative_residual:.3e}   max relative residual over time {b.max_relative_residual:.3e}",
        highlight=False,
    )
    path = plot_budget(b, out or run_dir / FIGURES / "edi.png")
    say(f"wrote {path}")
