"""``attnflow reproduce NAME``: the paper's predictions, one command each (see attnflow.experiments)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from attnflow.cli.app import REPRODUCE_FLAGS, UserError, app, console, guarded

#: Width of the verdict column ("FAIL (control" / "passes)" / "margin 0.31" on separate lines).
VERDICT_WIDTH = 13


def bottom_line(results) -> str:
    """The verdict of a whole reproduce in one line, e.g. ``19/19 predictions PASS; 19/19 negative controls
    rejected``, naming each prediction that failed (printed last, below the table)."""
    preds = [(r.name, p) for r in results for p in r.predictions]
    n_pass = sum(p.ok for _, p in preds)
    n_ctrl = sum(p.control_rejected for _, p in preds)
    line = f"{n_pass}/{len(preds)} predictions PASS; {n_ctrl}/{len(preds)} negative controls rejected"
    failed = [f"{name}: {p.statement} ({p.verdict})" for name, p in preds if not p.ok]
    return line + ("; FAILED: " + "; ".join(failed) if failed else "") + "."


def results_table(results, title: str) -> Table:
    """The predictions as a two-column table that reads at any width (80 columns included): one row per
    prediction, its statement, measured value, criterion and control stacked in the wide column, the
    verdict and its margin in the narrow one. Every string from a run is escaped."""
    from rich.markup import escape

    table = Table(title=escape(title), expand=False, show_lines=True)
    table.add_column("prediction: measured, criterion, negative control", overflow="fold", ratio=1)
    table.add_column("verdict", no_wrap=False, width=VERDICT_WIDTH)
    for r in results:
        for p in r.predictions:
            text = (
                f"[bold]{escape(r.name)}[/]: {escape(p.statement)}\n"
                f"[dim]measured:[/] {escape(p.measured)}\n"
                f"[dim]criterion:[/] {escape(p.criterion)}\n"
                f"[dim]model:[/] {escape(p.model)}" + (f" ({escape(p.model_reason)})" if p.model_reason else "") + "\n"
                f"[dim]negative control:[/] {escape(p.control_text)}"
            )
            colour = "green" if p.ok else "red"
            verdict = f"[{colour}]{escape(p.verdict)}[/]"
            if p.margin is not None:
                verdict += f"\nmargin {p.margin:.2g}"
            table.add_row(text, verdict)
    return table


def random_sets_table(rs) -> Table:
    """Pass counts per prediction over the random sets (readable at 80 columns)."""
    from rich.markup import escape

    table = Table(title=escape(f"attnflow reproduce {rs.name} --random-sets {rs.k} --seed {rs.seed}"), expand=False)
    table.add_column("prediction", overflow="fold", ratio=1)
    table.add_column("passed", no_wrap=True, justify="right")
    table.add_column("min margin", no_wrap=True, justify="right")
    for key, row in rs.rows.items():
        ok = row["passed"] == row["runs"]
        table.add_row(
            escape(key),
            f"[{'green' if ok else 'red'}]{row['passed']}/{row['runs']}[/]",
            f"{row['min_margin']:.2g}",
        )
    return table


@app.command()
@guarded(flags=REPRODUCE_FLAGS)
def reproduce(
    name: str = typer.Argument(
        ...,
        help="ou, oscillating, heads, edi, stability-input, stability-weights or all; or a conjecture FILE.py of "
        "your own (docs/reproduce.md, 'Writing a conjecture').",
    ),
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
    random_sets: Optional[int] = typer.Option(
        None,
        "--random-sets",
        min=1,
        help="Run NAME at K parameter sets drawn from the documented ranges (d in 2..8, beta, rate, sigma, cloud, "
        "H; docs/reproduce.md) with the --quick sizes, and report each prediction's pass rate. --seed S picks the "
        "draws.",
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

      attnflow reproduce heads --random-sets 5 --seed 1

      attnflow reproduce my_conjecture.py --random-sets 4 --seed 0
    """
    import torch
    from rich.markup import escape
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

    from attnflow.experiments import NAMES, ExperimentConfigError, experiment_config
    from attnflow.experiments import reproduce as run_all
    from attnflow.experiments.report import update_readme

    if name.endswith(".py"):
        if set_ or readme is not None or full or quick:
            raise UserError(
                "a conjecture file runs at its own space's sets: give it without --set, --readme, --full or --quick."
            )
        torch.set_num_threads(threads)
        _reproduce_file(Path(name), out, seed, random_sets)
        return
    if name not in NAMES:
        raise UserError(f"unknown experiment {name!r}; choose one of {', '.join(NAMES)} (or a FILE.py).")
    if full and quick:
        raise UserError(
            "--full and --quick contradict each other; give one (--full is deprecated: the default is full)."
        )
    if readme is not None and name != "all":
        raise UserError("--readme needs NAME 'all'.")
    if set_ and name == "all":
        raise UserError("--set changes one experiment's parameters; give NAME (e.g. heads), not 'all'.")
    if random_sets is not None and (set_ or readme is not None or full):
        raise UserError("--random-sets draws its own parameters: give it without --set, --readme or --full.")
    if set_:
        try:
            experiment_config(name, quick=quick, sets=list(set_))
        except ExperimentConfigError as e:
            raise UserError(str(e)) from None
    target = out or Path("runs/reproduce") / ("" if name == "all" else name)
    if random_sets is not None and out is None:
        target = Path("runs/reproduce") / f"{name}-random-{random_sets}-seed{seed}"
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

    if random_sets is not None:
        from attnflow.experiments import reproduce_random

        with bar:
            rs = reproduce_random(name, random_sets, out=target, seed=seed, progress=progress_for)
        from rich.console import Console

        Console().print(random_sets_table(rs))
        for entry in rs.sets:
            for f in entry["failures"]:
                console.print(
                    f"[red]set {entry['index']}[/] ({escape(', '.join(f['overrides']))}): {escape(f['prediction'])}: "
                    f"{escape(f['why'])}",
                    highlight=False,
                )
        console.print(f"wrote {escape(str(target))} (random_sets.json, report.md)")
        if not rs.passed:
            raise typer.Exit(1)
        return
    with bar:
        results = run_all(
            name, out=target, quick=quick, seed=seed, sets=list(set_), on_done=done, progress=progress_for
        )
    table = results_table(results, f"attnflow reproduce {name}{' --quick' if quick else ''}")
    from rich.console import Console

    Console().print(table)  # the terminal's width (80 columns when not a terminal)
    console.print(f"wrote {escape(str(target))} (report.md there)")
    if readme is not None:
        update_readme(readme, results, target, quick=quick)
        console.print(f"updated {escape(str(readme))}")
    colour = "green" if all(p.ok for r in results for p in r.predictions) else "red"
    Console().print(f"[bold {colour}]{escape(bottom_line(results))}[/]", highlight=False, soft_wrap=True)
    if not all(r.passed for r in results):
        raise typer.Exit(1)


def _reproduce_file(path: Path, out: Optional[Path], seed: int, random_sets: Optional[int]) -> None:
    """``attnflow reproduce FILE.py``: the experiments of a file named here, with a built-in's output."""
    from rich.console import Console
    from rich.markup import escape

    from attnflow.experiments.conjectures import reproduce_file

    stem = path.stem
    target = out or Path("runs/reproduce") / (
        stem if random_sets is None else f"{stem}-random-{random_sets}-seed{seed}"
    )
    got = reproduce_file(path, out=target, seed=seed, random_sets=random_sets)
    if isinstance(got, list):
        Console().print(results_table(got, f"attnflow reproduce {path.name}"))
        console.print(f"wrote {escape(str(target))} (results.json, report.md, figures/, manifest.json)")
        ok = all(r.passed for r in got)
    else:
        Console().print(random_sets_table(got))
        for entry in got.sets:
            for n, e in entry["experiments"].items():
                for st, v, c in zip(e["statements"], e["verdicts"], e["controls"]):
                    console.print(
                        f"set {entry['index']} {escape(n)}: {escape(st)}: {escape(v)}; {escape(c)}", highlight=False
                    )
        console.print(f"wrote {escape(str(target))} (random_sets.json, report.md, manifest.json)")
        ok = got.passed
    if not ok:
        raise typer.Exit(1)
