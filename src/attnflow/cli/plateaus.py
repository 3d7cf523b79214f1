"""``attnflow plateaus``: how long the first metastable plateau lasts, against beta (and H), with CIs."""

from __future__ import annotations

import math
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from attnflow.cli.app import UserError, app, guarded, progress_bar, say


def _numbers(text: str, name: str, cast=float) -> list:
    try:
        values = [cast(v) for v in text.replace(" ", "").split(",") if v]
    except ValueError:
        raise UserError(f"{name} must be comma-separated numbers like 1,2,4,8; got {text!r}.") from None
    if not values:
        raise UserError(f"{name} needs at least one value; got {text!r}.")
    return values


@app.command()
@guarded
def plateaus(
    out: Path = typer.Option(
        ..., "--out", "-o", help="New folder for runs.csv, summary.csv, summary.md, plateaus.png."
    ),
    beta: str = typer.Option("1,2,4,8", "--beta", help="Comma-separated temperatures beta."),
    heads: str = typer.Option("1", "--heads", help="Comma-separated head counts H."),
    seeds: int = typer.Option(8, "--seeds", min=1, help="Seeds per (beta, H): initial tokens (and GOE heads)."),
    n: int = typer.Option(16, "--n", min=2, help="Tokens per run."),
    d: int = typer.Option(2, "--d", min=2, help="Dimension d (tokens on the unit sphere of R^d)."),
    t_end: float = typer.Option(1000.0, "--t-end", help="End time of every run."),
    heads_kind: str = typer.Option("identity", "--heads-kind", help="identity (A_h = beta I) or goe (beta x GOE)."),
    model: str = typer.Option("gf", "--model", help="gf, usa or mha."),
    saves: int = typer.Option(100, "--saves", min=10, help="Saves per decade of time."),
    rtol: float = typer.Option(1e-8, "--rtol", help="dopri5 relative tolerance."),
    atol: float = typer.Option(1e-10, "--atol", help="dopri5 absolute tolerance."),
    rel_rate: float = typer.Option(
        0.1, "--rel-rate", help="Plateau: -dF/dt below this fraction of the run's mean rate."
    ),
) -> None:
    """Map the duration of the first metastable plateau against beta (and H): adaptive runs over seeds,
    the energy staircase of each, geometric means with bootstrap 95% CIs, a figure and a table.

    Example:

      attnflow plateaus --beta 1,2,4,8 --seeds 8 --t-end 1000 --out plateaus/
    """
    from attnflow.sweep.plateaus import plateau_study, write_study

    if out.exists() or out.is_symlink():
        raise UserError(f"{str(out)!r} already exists; choose a new folder (nothing was written).")
    betas = _numbers(beta, "--beta")
    hs = _numbers(heads, "--heads", int)
    if not (math.isfinite(t_end) and t_end > 0):
        raise UserError(f"--t-end must be a positive number; got {t_end}.")
    total = len(betas) * len(hs) * seeds
    with progress_bar("plateaus", unit="runs") as bar:
        task = bar.add_task("runs", total=total)
        study = plateau_study(
            betas, heads=hs, seeds=seeds, n=n, d=d, t_end=t_end, heads_kind=heads_kind, model=model, saves=saves,
            rtol=rtol, atol=atol, rel_rate=rel_rate, progress=lambda k, m: bar.update(task, completed=k),
        )  # fmt: skip
    paths = write_study(study, out)
    table = Table(title="first metastable plateau: duration against beta")
    cols = ("beta", "H", "seeds", "measured", "censored", "no plateau", "geometric mean", "95% CI")
    for c in cols:
        table.add_column(c, justify="right")
    for r in study.summary:
        ci = "-" if r["measured"] < 2 else f"{r['ci_low']:.4g} .. {r['ci_high']:.4g}"
        gm = "-" if not r["measured"] else f"{r['duration_geomean']:.4g}"
        table.add_row(f"{r['beta']:g}", str(r["H"]), str(r["seeds"]), str(r["measured"]), str(r["censored"]),
                      str(r["no_plateau"]), gm, ci)  # fmt: skip
    console = Console()
    console.print(table)
    for H, tr in study.trend.items():
        console.print(
            escape(
                f"H = {H}: d log10(duration) / d beta = {tr['slope']:.4g}, 95% CI {tr['ci_low']:.4g} .. {tr['ci_high']:.4g} "
                f"({tr['runs']} runs, censored at their lower bound): duration {study.verdict(H)} with beta."
            ),
            highlight=False,
        )
    for p in paths:
        say(f"wrote {p}")
