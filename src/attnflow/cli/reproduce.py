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
        None,
        "--out",
        "-o",
        help="Output folder (default runs/reproduce for all, runs/reproduce/NAME for one experiment).",
    ),
    seed: int = typer.Option(0, "--seed", help="Base seed of every run."),
    full: bool = typer.Option(
        False,
        "--full",
        help="Deprecated, no effect: without --quick the run is the full one (H up to 256, every parameter set). "
        "Accepted so that old scripts keep working; it prints a notice.",
    ),
    set_: list[str] = typer.Option(
        [],
        "--set",
        help="Change a parameter of experiment NAME, e.g. --set heads.beta=3 (repeatable; the defaults are in "
        "configs.yaml of a run).",
    ),
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

      attnflow reproduce heads --set heads.beta=3 --set weights.rate=0.5 --set heads.counts=[16,32,64,128]

      attnflow reproduce all --out runs/reproduce --readme README.md
    """
    import torch
    from rich.markup import escape
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

    from attnflow.experiments import NAMES, ExperimentConfigError, experiment_config
    from attnflow.experiments import reproduce as run_all
    from attnflow.experiments.report import update_readme

    if name not in NAMES:
        raise UserError(f"unknown experiment {name!r}; choose one of {', '.join(NAMES)}.")
    if full and quick:
        raise UserError(
            "--full and --quick contradict each other; give one (--full is deprecated: the default is full)."
        )
    if readme is not None and name != "all":
        raise UserError("--readme needs NAME 'all'.")
    if set_ and name == "all":
        raise UserError("--set changes one experiment's parameters; give NAME (e.g. heads), not 'all'.")
    if set_:
        try:
            experiment_config(name, quick=quick, sets=list(set_))
        except ExperimentConfigError as e:
            raise UserError(str(e)) from None
    target = out or Path("runs/reproduce") / ("" if name == "all" else name)
    if full:
        console.print("[yellow]--full is deprecated and has no effect: without --quick the run is the full one.[/]")
    torch.set_num_threads(threads)

    bar = Progress(
        TextColumn("[bold]{task.fields[experiment]}[/]"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.description}"),
        console=console,
        transient=False,
    )
    tasks: dict[str, TaskID] = {}

    def progress_for(exp: str):
        def tick(done: int, total: int, what: str) -> None:
            if exp not in tasks:
                tasks[exp] = bar.add_task(escape(what), total=total, experiment=exp)
            bar.update(tasks[exp], completed=done, total=total, description=escape(what))

        return tick

    def done(res) -> None:
        if res.name in tasks:
            bar.update(tasks[res.name], description=f"done in {res.seconds:.1f} s")

    with bar:
        results = run_all(
            name, out=target, quick=quick, seed=seed, sets=list(set_), on_done=done, progress=progress_for
        )
    table = Table(title=f"attnflow reproduce {name}{' --quick' if quick else ''}", expand=False)
    for col, ratio in (
        ("experiment", 1),
        ("prediction", 3),
        ("measured", 4),
        ("criterion", 3),
        ("negative control", 4),
    ):
        table.add_column(col, overflow="fold", ratio=ratio)
    table.add_column("", no_wrap=True, width=len("FAIL (control passes)"))
    for r in results:
        for p in r.predictions:
            verdict = f"[green]{p.verdict}[/]" if p.ok else f"[red]{escape(p.verdict)}[/]"
            table.add_row(
                r.name,
                escape(p.statement),
                escape(p.measured),
                escape(p.criterion),
                escape(p.control_text),
                verdict,
            )
    from rich.console import Console

    Console().print(table)  # the terminal's width (80 columns when not a terminal)
    console.print(f"wrote {escape(str(target))} (report.md there)")
    if readme is not None:
        update_readme(readme, results, target, quick=quick)
        console.print(f"updated {escape(str(readme))}")
    if not all(r.passed for r in results):
        raise typer.Exit(1)
