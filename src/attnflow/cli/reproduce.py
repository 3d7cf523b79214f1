"""``attnflow reproduce NAME``: the paper's predictions, one command each (see attnflow.experiments)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from attnflow.cli.app import UserError, app, console, guarded


@app.command()
@guarded
def reproduce(
    name: str = typer.Argument(..., help="ou, oscillating, heads, edi, stability-input, stability-weights or all."),
    quick: bool = typer.Option(False, "--quick", help="Small sizes (all of them in about 3 minutes; part of CI)."),
    out: Optional[Path] = typer.Option(
        None, "--out", "-o", help="Output folder (default runs/reproduce/NAME, or runs/reproduce for all)."
    ),
    seed: int = typer.Option(0, "--seed", help="Base seed of every run."),
    full: bool = typer.Option(False, "--full", help="heads: also H = 128, 256."),
    readme: Optional[Path] = typer.Option(
        None, "--readme", help="With 'all': rewrite the reproduce block of this README."
    ),
    threads: int = typer.Option(
        1,
        "--threads",
        min=1,
        help="torch threads; the experiments' systems are small, and more "
        "threads than free cores make torch's spinning workers many times slower.",
    ),
) -> None:
    """Run an experiment of the paper and check its prediction (PASS/FAIL); exit 1 if one fails.

    Examples:

      attnflow reproduce heads --quick

      attnflow reproduce all --out runs/reproduce --readme README.md
    """
    import torch

    from attnflow.experiments import NAMES
    from attnflow.experiments import reproduce as run_all
    from attnflow.experiments.report import update_readme

    if name not in NAMES:
        raise UserError(f"unknown experiment {name!r}; choose one of {', '.join(NAMES)}.")
    if readme is not None and name != "all":
        raise UserError("--readme needs NAME 'all'.")
    target = out or Path("runs/reproduce") / ("" if name == "all" else name)
    torch.set_num_threads(threads)

    def done(res) -> None:
        console.print(f"[bold]{res.name}[/] done in {res.seconds:.1f} s")

    results = run_all(name, out=target, quick=quick, seed=seed, full=full, on_done=done)
    table = Table(title=f"attnflow reproduce {name}{' --quick' if quick else ''}")
    for col in ("experiment", "prediction", "measured", "criterion", ""):
        table.add_column(col, overflow="fold")
    for r in results:
        for p in r.predictions:
            table.add_row(
                r.name, p.statement, p.measured, p.criterion, "[green]PASS[/]" if p.passed else "[red]FAIL[/]"
            )
    from rich.console import Console

    Console(width=200).print(table)
    console.print(f"wrote {target}")
    if readme is not None:
        update_readme(readme, results, target, quick=quick)
        console.print(f"updated {readme}")
    if not all(r.passed for r in results):
        raise typer.Exit(1)
