"""The ``attnflow`` application object and the helpers every command module shares.

Command modules (:mod:`attnflow.cli.main`, ``edi``, ``hf``, ...) register on :data:`app`; nothing here
imports them back.

User mistakes (a bad config, a missing folder) exit with code 2 and one clear paragraph, never a
traceback; ``--debug`` shows the traceback for bug reports.
"""

from __future__ import annotations

import functools
import sys

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from attnflow.config.errors import ConfigError

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

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (typer.Exit, typer.Abort, KeyboardInterrupt):
            raise
        except (
            UserError,
            ConfigError,
            ValueError,
            FileNotFoundError,
            FileExistsError,
            OverflowError,
            FloatingPointError,
        ) as e:
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
        disable=not sys.stderr.isatty(),
    )
