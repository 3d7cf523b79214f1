"""The run-folder commands: ``attnflow run``, ``show`` and ``plot``."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from attnflow.cli.app import UserError, app, console, guarded, progress_bar


@app.command()
@guarded
def run(
    config: Optional[Path] = typer.Argument(None, help="YAML config file (see docs/config.md)."),
    out: Optional[Path] = typer.Option(
        None, "--out", "-o", help="Run folder to write (must not exist unless --force)."
    ),
    preset: Optional[str] = typer.Option(
        None, "--preset", "-p", help="Embedded config: ou, oscillating or autonomous."
    ),
    seed: Optional[int] = typer.Option(None, "--seed", help="Override the config's seed."),
    set_: list[str] = typer.Option([], "--set", help="Override a field, e.g. --set integration.t_end=5 (repeatable)."),
    force: bool = typer.Option(False, "--force", help="Replace an existing run folder."),
    figures: bool = typer.Option(True, "--figures/--no-figures", help="Write figures into the run folder."),
    resume: Optional[Path] = typer.Option(
        None, "--resume", help="Continue an interrupted run folder from its last checkpoint."
    ),
    checkpoint_every: Optional[int] = typer.Option(None, "--checkpoint-every", min=1, help="Checkpoint every K steps."),
    checkpoint_seconds: float = typer.Option(
        60.0, "--checkpoint-seconds", min=0.0, help="Checkpoint every M seconds (0: off)."
    ),
) -> None:
    """Simulate a config (or a preset) and write a run folder (checkpointed; see --resume).

    Examples:

      attnflow run --preset ou --out runs/ou

      attnflow run examples/ou.yaml --out runs/ou2 --set heads.count=16 --seed 3

      attnflow run --resume runs/ou2
    """
    from attnflow.config import apply_overrides, load_config, preset_config
    from attnflow.runs.runner import reported_warnings, resume_folder, run_to_folder

    every = {"every_steps": checkpoint_every, "every_seconds": checkpoint_seconds or None}
    warn = lambda m: console.print(f"[bold yellow]warning:[/] {m}", highlight=False, soft_wrap=True)
    if resume is not None:
        if config is not None or preset is not None or out is not None or set_ or seed is not None:
            raise UserError(
                "--resume DIR continues the run saved in DIR with its own config; drop CONFIG, --preset, --out, --set and --seed."
            )
        with progress_bar(f"resume {resume}") as bar, reported_warnings(warn):
            task = bar.add_task(str(resume), total=None)
            traj = resume_folder(
                resume, figures=figures, progress=lambda k, n: bar.update(task, completed=k, total=n), **every
            )
        console.print(f"resumed {resume} from step {traj.provenance.get('resumed_from_step', 0)}; wrote {resume}")
        _summary(resume)
        return
    if out is None:
        raise UserError("give the run folder to write with --out DIR (or continue one with --resume DIR).")
    if (config is None) == (preset is None):
        raise UserError(
            "give either a CONFIG file or --preset NAME (ou, oscillating, autonomous), not both or neither."
        )
    cfg = load_config(config) if config is not None else preset_config(preset)  # type: ignore[arg-type]
    overrides = list(set_) + ([f"seed={seed}"] if seed is not None else [])
    if overrides:
        cfg = apply_overrides(cfg, overrides)
    if out.exists() and not force:
        from attnflow.io.store import is_complete

        hint = (
            "" if is_complete(out) else f" It holds an unfinished run: continue it with 'attnflow run --resume {out}'."
        )
        raise UserError(f"{str(out)!r} already exists; choose another --out or pass --force to replace it.{hint}")
    # Adaptive methods report the permille of [0, t_end] done.
    n_steps = 1000 if cfg.integration.adaptive else round(cfg.integration.t_end / cfg.integration.dt)
    with progress_bar(cfg.name) as bar, reported_warnings(warn):
        task = bar.add_task(cfg.name, total=n_steps)
        traj = run_to_folder(
            cfg, out, force=force, figures=figures, progress=lambda k, n: bar.update(task, completed=k), **every
        )
    console.print(f"wrote {out}  ({traj.provenance['wall_time_s']:.1f} s, {len(traj.t)} saved times)")
    _summary(out)


def _summary(path: Path) -> None:
    from attnflow.io.trajectory import load

    traj = load(path)
    d = traj.diagnostics
    table = Table(title=f"run {path}", show_header=True)
    table.add_column("quantity")
    table.add_column(f"t = {traj.t[0]:.3g}", justify="right")
    table.add_column(f"t = {traj.t[-1]:.3g}", justify="right")
    for name in (
        "energy",
        "slope",
        "metric_speed",
        "mobility_min",
        "mobility_max",
        "order_parameter",
        "clusters",
        "mean_inner",
    ):
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
    from attnflow.io.store import is_complete
    from attnflow.runs.runner import folder_status

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
    from attnflow.io.store import FIGURES
    from attnflow.io.trajectory import load
    from attnflow.viz.plotting import plot_run

    traj = load(run_dir)
    paths = plot_run(traj, out or run_dir / FIGURES)
    for p in paths:
        console.print(f"wrote {p}")
