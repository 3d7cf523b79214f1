"""``attnflow phase-diagrams OUT``: the built-in (beta, H) and (beta, t) phase diagrams, swept on Dask."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from attnflow.cli.app import UserError, app, confirm_heavy, guarded, progress_bar, say


def _numbers(text: str, what: str, cast=float) -> list:
    try:
        vals = [cast(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UserError(f"{what} must be a comma-separated list of numbers; got {text!r}.") from None
    if not vals or len(vals) > 64:
        raise UserError(f"{what} must list between 1 and 64 values; got {len(vals)}.")
    return vals


@app.command("phase-diagrams")
@guarded
def phase_diagrams_cmd(
    out: Path = typer.Argument(..., help="Sweep folder to write (re-running with the same folder resumes)."),
    beta: str = typer.Option("0.5,1,2,4,8", "--beta", help="Comma-separated temperatures beta (heads.beta)."),
    heads: str = typer.Option("1,2,4,8", "--heads", help="Comma-separated head counts H (heads.count)."),
    seeds: int = typer.Option(2, "--seeds", min=1, max=1000, help="Seeds per (beta, H) cell."),
    base: str = typer.Option("ou", "--base", help="Base config: a preset name or a config YAML file."),
    overrides: list[str] = typer.Option([], "--set", help="Override a base field, e.g. --set tokens.n=64."),
    time_heads: Optional[int] = typer.Option(
        None, "--time-heads", help="H of the (beta, t) diagrams (default: the largest)."
    ),
    scheduler: Optional[str] = typer.Option(
        None, "--scheduler", help="Dask scheduler address (default: a local cluster)."
    ),
    workers: Optional[int] = typer.Option(None, "--workers", min=1, max=256, help="Processes of the local cluster."),
    yes: bool = typer.Option(False, "--yes", help="Start a sweep the pre-flight estimate calls heavy without asking."),
) -> None:
    """Sweep beta x H on Dask and draw the built-in phase diagrams into OUT/diagrams.

    (beta, H): final cluster count, time to clustering, late slope |dF|; (beta, t): cluster count and
    slope over time. Ticks sit at the grid values; colours use a log scale where values span decades.
    Example:

      attnflow phase-diagrams runs/phase --beta 1,2,4,8 --heads 1,4,16 --seeds 3 --set tokens.n=64
    """
    from attnflow.config.schema import MAX_OVERRIDE_CHARS
    from attnflow.config.yamlsafe import load_yaml
    from attnflow.sweep.diagrams import phase_diagrams

    betas = _numbers(beta, "--beta")
    counts = _numbers(heads, "--heads", int)
    sets: dict = {}
    for item in overrides:
        if "=" not in item or len(item) > MAX_OVERRIDE_CHARS:
            raise UserError(f"--set takes KEY=VALUE (a dotted config key); got {item[:80]!r}.")
        key, _, value = item.partition("=")
        sets[key.strip()] = load_yaml(value)
    base_arg: str | dict = base
    if base.endswith((".yaml", ".yml")):
        base_arg = str(Path(base).resolve())
    with progress_bar("phase diagrams", "points") as bar:
        task = bar.add_task("sweep", total=None)
        res = phase_diagrams(
            out,
            base=base_arg,
            betas=betas,
            heads=counts,
            seeds=seeds,
            overrides=sets,
            time_heads=time_heads,
            scheduler=scheduler,
            workers=workers,
            on_progress=lambda ok, failed, total: bar.update(task, completed=ok + failed, total=total),
            confirm=lambda est: confirm_heavy(est, "this sweep", yes),
        )
    for stem, path in res.figures.items():
        say(f"{stem}: {path}")
