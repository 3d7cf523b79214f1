"""The ``attnflow`` command line (typer + rich).

User mistakes (a bad config, a missing folder) exit with code 2 and one clear paragraph, never a
traceback; ``--debug`` shows the traceback for bug reports.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

app = typer.Typer(
    name="attnflow",
    help=(
        "Simulate multi-head attention as a time-dependent Wasserstein gradient flow of tokens on the sphere.\n\n"
        "Examples:\n\n"
        "  attnflow run --preset ou --out runs/ou\n\n"
        "  attnflow run my.yaml --out runs/my --set integration.t_end=5\n\n"
        "  attnflow show runs/ou\n\n"
        "  attnflow plot runs/ou\n\n"
        "  attnflow report runs/ou    (interactive HTML: runs/ou/report.html)\n\n"
        "  attnflow movie runs/ou --out ou.mp4 --trails 10 --rotate 360\n\n"
        "Each command has its own --help with examples. Documentation: docs/ (mkdocs serve)."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console(stderr=True)
_state = {"debug": False}


class UserError(Exception):
    """A mistake in what the user asked for: reported in one paragraph, exit code 2."""


def fail(message: str, code: int = 2) -> None:
    console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def guarded(fn):
    """Turn user errors into one-paragraph messages with exit code 2 (tracebacks under --debug)."""
    import functools

    from .config import ConfigError

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (typer.Exit, typer.Abort, KeyboardInterrupt):
            raise
        except (UserError, ConfigError, ValueError, FileNotFoundError, FileExistsError, OverflowError, FloatingPointError) as e:
            if _state["debug"]:
                raise
            fail(str(e))

    return wrapper


@app.callback()
def main(debug: bool = typer.Option(False, "--debug", help="Show full tracebacks instead of one-line errors.")) -> None:
    _state["debug"] = debug


def progress_bar(description: str) -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("steps"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=False,
        disable=not sys.stderr.isatty() and not _state.get("force_progress", False),
    )


@app.command()
@guarded
def run(
    config: Optional[Path] = typer.Argument(None, help="YAML config file (see docs/config.md)."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Run folder to write (must not exist unless --force)."),
    preset: Optional[str] = typer.Option(None, "--preset", "-p", help="Embedded config: ou, oscillating or autonomous."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Override the config's seed."),
    set_: list[str] = typer.Option([], "--set", help="Override a field, e.g. --set integration.t_end=5 (repeatable)."),
    force: bool = typer.Option(False, "--force", help="Replace an existing run folder."),
    figures: bool = typer.Option(True, "--figures/--no-figures", help="Write figures into the run folder."),
    resume: Optional[Path] = typer.Option(None, "--resume", help="Continue an interrupted run folder from its last checkpoint."),
    checkpoint_every: Optional[int] = typer.Option(None, "--checkpoint-every", min=1, help="Checkpoint every K steps."),
    checkpoint_seconds: float = typer.Option(60.0, "--checkpoint-seconds", min=0.0, help="Checkpoint every M seconds (0: off)."),
) -> None:
    """Simulate a config (or a preset) and write a run folder (checkpointed; see --resume).

    Examples:

      attnflow run --preset ou --out runs/ou

      attnflow run examples/ou.yaml --out runs/ou2 --set heads.count=16 --seed 3

      attnflow run --resume runs/ou2
    """
    from .config import apply_overrides, load_config, preset_config
    from .runner import reported_warnings, resume_folder, run_to_folder

    every = {"every_steps": checkpoint_every, "every_seconds": checkpoint_seconds or None}
    warn = lambda m: console.print(f"[bold yellow]warning:[/] {m}", highlight=False, soft_wrap=True)  # noqa: E731
    if resume is not None:
        if config is not None or preset is not None or out is not None or set_ or seed is not None:
            raise UserError("--resume DIR continues the run saved in DIR with its own config; drop CONFIG, --preset, --out, --set and --seed.")
        with progress_bar(f"resume {resume}") as bar, reported_warnings(warn):
            task = bar.add_task(str(resume), total=None)
            traj = resume_folder(resume, figures=figures, progress=lambda k, n: bar.update(task, completed=k, total=n), **every)
        console.print(f"resumed {resume} from step {traj.provenance.get('resumed_from_step', 0)}; wrote {resume}")
        _summary(resume)
        return
    if out is None:
        raise UserError("give the run folder to write with --out DIR (or continue one with --resume DIR).")
    if (config is None) == (preset is None):
        raise UserError("give either a CONFIG file or --preset NAME (ou, oscillating, autonomous), not both or neither.")
    cfg = load_config(config) if config is not None else preset_config(preset)  # type: ignore[arg-type]
    overrides = list(set_) + ([f"seed={seed}"] if seed is not None else [])
    if overrides:
        cfg = apply_overrides(cfg, overrides)
    if out.exists() and not force:
        from .io import is_complete

        hint = "" if is_complete(out) else f" It holds an unfinished run: continue it with 'attnflow run --resume {out}'."
        raise UserError(f"{str(out)!r} already exists; choose another --out or pass --force to replace it.{hint}")
    n_steps = round(cfg.integration.t_end / cfg.integration.dt)
    with progress_bar(cfg.name) as bar, reported_warnings(warn):
        task = bar.add_task(cfg.name, total=n_steps)
        traj = run_to_folder(cfg, out, force=force, figures=figures, progress=lambda k, n: bar.update(task, completed=k), **every)
    console.print(f"wrote {out}  ({traj.provenance['wall_time_s']:.1f} s, {len(traj.t)} saved times)")
    _summary(out)


def _summary(path: Path) -> None:
    from .io import load

    traj = load(path)
    d = traj.diagnostics
    table = Table(title=f"run {path}", show_header=True)
    table.add_column("quantity")
    table.add_column("t = %.3g" % traj.t[0], justify="right")
    table.add_column("t = %.3g" % traj.t[-1], justify="right")
    for name in ("energy", "slope", "metric_speed", "mobility_min", "mobility_max", "order_parameter", "clusters", "mean_inner"):
        table.add_row(name, f"{d[name][0]:.6g}", f"{d[name][-1]:.6g}")
    Console().print(table)
    cfg = traj.config or {}
    info = Table(show_header=False, box=None)
    for k, v in [
        ("model", traj.model),
        ("method", traj.method),
        ("N, d, H", f"{traj.N}, {traj.d}, {traj.H}"),
        ("dt", traj.dt),
        ("weights", (cfg.get("weights") or {}).get("process", "?")),
        ("seed", traj.seed),
        ("wall time (s)", f"{traj.provenance.get('wall_time_s', float('nan')):.2f}"),
        ("attnflow", traj.provenance.get("attnflow_version")),
        ("git commit", traj.provenance.get("git_commit")),
    ]:
        info.add_row(str(k), str(v))
    Console().print(info)


@app.command()
@guarded
def show(run_dir: Path = typer.Argument(..., help="A run folder written by 'attnflow run'.")) -> None:
    """Print a summary table of a run folder.

    Example:

      attnflow show runs/ou
    """
    from .io import is_complete
    from .runner import folder_status

    if not run_dir.is_dir():
        raise UserError(f"no run folder at {str(run_dir)!r}.")
    if not is_complete(run_dir):
        raise UserError(folder_status(run_dir))
    _summary(run_dir)


@app.command()
@guarded
def plot(
    run_dir: Path = typer.Argument(..., help="A run folder written by 'attnflow run'."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Folder for the figures (default RUN/figures)."),
) -> None:
    """Draw sphere snapshots (PCA view for d > 3) and energy/slope/cluster curves.

    Example:

      attnflow plot runs/ou --out figs/
    """
    from .io import FIGURES, load
    from .plotting import plot_run

    traj = load(run_dir)
    paths = plot_run(traj, out or run_dir / FIGURES)
    for p in paths:
        console.print(f"wrote {p}")


def entrypoint() -> None:
    app()


# Subcommands defined in other modules register themselves on `app` when imported here
# (one import line each, kept at the end so that `app` and the helpers above exist).
from . import cli_edi  # noqa: E402,F401  (attnflow edi)
from . import cli_reproduce  # noqa: E402,F401
from . import cli_hf  # noqa: E402,F401
from . import cli_sweep  # noqa: E402,F401  (attnflow sweep, sweep-plot)
from . import cli_view  # noqa: E402,F401  (report, movie)
from . import cli_bench  # noqa: E402,F401  (attnflow bench)
