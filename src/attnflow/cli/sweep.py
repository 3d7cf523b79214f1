"""``attnflow sweep`` and ``attnflow sweep-plot``: parameter sweeps on Dask and their phase diagrams."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from attnflow.cli.app import (
    SWEEP_FLAGS,
    SWEEP_PLOT_FLAGS,
    UserError,
    app,
    confirm_heavy,
    console,
    guarded,
    say,
)


def _sweep_bar() -> Progress:
    import sys

    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.fields[ok]} done, {task.fields[failed]} failed, {task.fields[left]} remaining"),
        TimeElapsedColumn(),
        console=console,
        disable=not sys.stderr.isatty(),
    )


@app.command()
@guarded(flags=SWEEP_FLAGS)
def sweep(
    sweep_file: Path = typer.Argument(..., help="Sweep YAML: a base config, a grid over dotted keys, seeds."),
    out: Path = typer.Option(..., "--out", "-o", help="Sweep folder; re-running with the same folder resumes."),
    scheduler: Optional[str] = typer.Option(
        None, "--scheduler", help="Address of a running Dask scheduler (tcp://host:port); default: a local cluster."
    ),
    workers: Optional[int] = typer.Option(
        None, "--workers", "-w", min=1, help="Worker processes of the local cluster."
    ),
    batch: Optional[int] = typer.Option(
        None, "--batch", min=1, help="Points per Dask task (default: the file's 'batch')."
    ),
    retry_failed: bool = typer.Option(False, "--retry-failed", help="Run points recorded as failed again."),
    yes: bool = typer.Option(
        False,
        "--yes",
        "-y",
        help="Start even when the pre-flight estimate is large (more than an hour or half the memory).",
    ),
    threads: Optional[int] = typer.Option(
        None,
        "--threads",
        min=1,
        max=1024,
        help="CPU threads per worker (default 1: the local cluster has a worker per core).",
    ),
) -> None:
    """Run every point of a parameter sweep on Dask; write DIR/results.parquet (one row per point).

    Finished points are kept (DIR/points/*.json) and skipped when the command runs again. Exit
    code 1 when some point failed (its error is in the table's 'error' column).

    Examples:

      attnflow sweep examples/sweep_quick.yaml --out runs/quick

      attnflow sweep big.yaml --out /shared/big --scheduler tcp://10.0.0.5:8786
    """
    from attnflow.sweep.runner import run_sweep

    if not sweep_file.is_file():
        raise UserError(f"sweep file {str(sweep_file)!r} does not exist.")
    with _sweep_bar() as bar:
        task = bar.add_task(escape(sweep_file.stem), total=None, ok=0, failed=0, left="?")

        def progress(ok: int, failed: int, total: int) -> None:
            bar.update(task, total=total, completed=ok + failed, ok=ok, failed=failed, left=total - ok - failed)

        report = run_sweep(
            sweep_file,
            out,
            scheduler=scheduler,
            workers=workers,
            batch=batch,
            retry_failed=retry_failed,
            on_progress=progress,
            on_points=lambda k, n: bar.update(task, total=n, completed=k, left="validating"),
            confirm=lambda est: confirm_heavy(est, f"sweep {sweep_file.name!r}", yes),
            threads=threads,
        )
    say(
        f"sweep {sweep_file}: {report.total} points, {report.skipped} already finished, {report.ran} run now; "
        f"{report.ok} ok, {report.failed} failed ({report.wall_s:.1f} s). Table: {out / 'results.parquet'}"
    )
    if report.failed:
        console.print(f"[yellow]{report.failed} point(s) failed; see the 'error' column of the table.[/]")
        raise typer.Exit(1)


@app.command("sweep-plot")
@guarded(flags=SWEEP_PLOT_FLAGS)
def sweep_plot(
    sweep_dir: Path = typer.Argument(..., help="A sweep folder written by 'attnflow sweep'."),
    x: str = typer.Option(..., "--x", help="Horizontal axis: a swept parameter (beta or heads.beta) or t."),
    y: str = typer.Option(..., "--y", help="Vertical axis: a swept parameter or t (time)."),
    color: str = typer.Option("clusters", "--color", help="Diagnostic to colour by (averaged over seeds)."),
    where: list[str] = typer.Option([], "--where", help="Fix another swept parameter, e.g. --where heads.count=8."),
    out: Optional[Path] = typer.Option(
        None, "--out", "-o", help="Figure path (default DIR/figures/phase_X_Y_COLOR.png)."
    ),
    log_x: bool = typer.Option(False, "--log-x", help="Logarithmic x axis."),
    log_y: bool = typer.Option(False, "--log-y", help="Logarithmic y axis."),
) -> None:
    """Draw a phase diagram: a heatmap of a diagnostic over two axes, averaged over seeds.

    Examples:

      attnflow sweep-plot runs/quick --x beta --y t --color clusters --where heads.count=8

      attnflow sweep-plot runs/quick --x beta --y count --color slope_floor
    """
    from attnflow.sweep.phase import phase_diagram, plot_phase_diagram

    if not sweep_dir.is_dir():
        raise UserError(
            f"no sweep folder at {str(sweep_dir)!r}; run 'attnflow sweep SWEEP.yaml --out {sweep_dir}' first."
        )
    pd = phase_diagram(sweep_dir, x, y, color, where)
    short = lambda k: k.split(".")[-1]
    path = out or sweep_dir / "figures" / f"phase_{short(pd.x)}_{short(pd.y)}_{pd.color}.png"
    plot_phase_diagram(pd, path, log_x=log_x, log_y=log_y)
    say(f"wrote {path}")
