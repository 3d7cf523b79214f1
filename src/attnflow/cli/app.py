"""The ``attnflow`` application object and the helpers every command module shares.

Command modules (:mod:`attnflow.cli.main`, ``edi``, ``hf``, ...) register on :data:`app`; nothing here
imports them back.

User mistakes (a bad config, a missing folder) exit with code 2 and one clear paragraph, never a
traceback; ``--debug`` shows the traceback for bug reports.
"""

from __future__ import annotations

import errno
import functools
import sys

import typer
from rich.console import Console
from rich.markup import escape
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
    """Print ``message`` (plain text: square brackets in paths survive) as one error paragraph; exit ``code``."""
    console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


#: Operating-system errors that are the user's to fix (a path below a file, no permission, a full or
#: read-only disk, a directory where a file belongs): reported in one paragraph like user mistakes.
USER_OS_ERRORS = {
    errno.EACCES,
    errno.EPERM,
    errno.EROFS,
    errno.ENOSPC,
    errno.ENOTDIR,
    errno.EISDIR,
    errno.EEXIST,
    errno.ENAMETOOLONG,
    errno.ELOOP,
    errno.EDQUOT,
    errno.ENOENT,
}


def os_error_message(e: OSError) -> str:
    """``e`` as one sentence naming the path and the reason."""
    where = " -> ".join(repr(str(f)) for f in (e.filename, e.filename2) if f is not None)
    why = e.strerror or str(e)
    return f"cannot use {where}: {why}." if where else f"{why}."


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
            fail(os_error_message(e) if isinstance(e, OSError) and e.strerror and e.filename else str(e))
        except OSError as e:
            if _state["debug"] or e.errno not in USER_OS_ERRORS:
                raise
            fail(str(e) if e.errno is None or not e.strerror else os_error_message(e))
        except RecursionError:
            if _state["debug"]:
                raise
            fail(
                "the input is nested too deeply to read (thousands of levels); attnflow configs are a few levels deep."
            )

    return wrapper


@app.callback()
def main(debug: bool = typer.Option(False, "--debug", help="Show full tracebacks instead of one-line errors.")) -> None:
    _state["debug"] = debug


def confirm_heavy(est, what: str, yes: bool) -> None:
    """Ask before starting what the pre-flight estimate ``est`` calls heavy (``--yes``: proceed, say so).

    Without a terminal to ask on and without ``--yes`` the command is refused (exit code 2).
    """
    if not est.heavy:
        return
    text = f"{what} will take {est.describe()}."
    if yes:
        console.print(f"[bold yellow]warning:[/] {escape(text)} Starting (--yes).", highlight=False, soft_wrap=True)
        return
    if sys.stdin.isatty() and sys.stderr.isatty():
        console.print(f"[bold yellow]warning:[/] {escape(text)}", highlight=False, soft_wrap=True)
        if typer.confirm("Start it?", default=False, err=True):
            return
        raise typer.Exit(2)
    raise UserError(f"{text} Pass --yes to start it anyway, or make it smaller.")


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
