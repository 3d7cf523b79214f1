"""The ``attnflow`` application object and the helpers every command module shares.

Command modules (:mod:`attnflow.cli.main`, ``edi``, ``hf``, ...) register on :data:`app`; nothing here
imports them back.

User mistakes (attnflow's own errors, :class:`~attnflow.core.errors.AttnflowError`, and the
operating-system errors a user can fix) exit with code 2 and one clear paragraph, never a traceback;
anything else is a bug in attnflow and shows its traceback and a line asking to report it (exit code
1). ``--debug`` shows the traceback of user mistakes too. Every warning raised under a command is
printed the one way, ``warning: ...``, with its hint (a parameter to change) rendered as a flag of
that command.
"""

from __future__ import annotations

import errno
import functools
import inspect
import math
import re
import shlex
import sys
import traceback
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import typer
import typer.core

try:  # recent typer vendors click (typer._click) and no longer installs it: use the one typer raises
    from typer._click.exceptions import ClickException
except ImportError:  # pragma: no cover - older typer, which depends on click
    from click import ClickException  # type: ignore[assignment]
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from attnflow._version import __version__
from attnflow.core.caller import AttnflowWarning
from attnflow.core.errors import AttnflowError, InputError

#: typer's type label (``<int range>``, ``<list[str]>``) -> the word shown in help (click's style).
_TYPE_WORDS = {"int": "INTEGER", "float": "FLOAT", "str": "TEXT", "path": "PATH", "bool": "BOOLEAN"}


def _type_word(param: Any, ctx: Any) -> str:
    """``<list[str]>`` -> ``TEXT``; ``<float range>`` -> ``FLOAT`` (the range is printed beside it)."""
    label = param.display_type(ctx).strip("<>")
    label = re.sub(r"^list\[(.*)\]$", r"\1", label).removesuffix(" range")
    return _TYPE_WORDS.get(label, label.upper())


def _constant(word: str) -> Any:
    """A ``display_type_rich`` that always shows ``word``."""
    return lambda ctx: word


def _tidy(param: Any, ctx: Any) -> None:
    """Display a parameter the one way attnflow's help uses: flags without a placeholder, values as
    ``--out PATH``, positional arguments as ``RUN_DIR`` (required) or ``[CONFIG]`` (optional)."""
    if getattr(param, "_attnflow_tidy", False):
        return
    if isinstance(param, typer.core.TyperArgument):
        word = _type_word(param, ctx)
        param.metavar = param.name.upper()
        param.display_type_rich = _constant(word)  # type: ignore[method-assign]  # the type column
    elif getattr(param, "is_flag", False):
        param.metavar = ""
    elif param.metavar is None:
        param.metavar = _type_word(param, ctx)
    param._attnflow_tidy = True


class _TidyParams:
    """Mixin for typer's command and group classes: tidied parameters and a usage line
    ``attnflow show [OPTIONS] RUN_DIR`` / ``attnflow run [OPTIONS] [CONFIG]``."""

    def get_params(self, ctx: Any) -> list[Any]:
        params = super().get_params(ctx)  # type: ignore[misc]
        for p in params:
            _tidy(p, ctx)
        return params

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        rv: list[str] = [self.options_metavar] if self.options_metavar else []  # type: ignore[attr-defined]
        for p in self.get_params(ctx):
            if isinstance(p, typer.core.TyperArgument):
                name = (p.metavar or p.name or "").upper() + ("..." if p.nargs != 1 else "")
                rv.append(name if p.required else f"[{name}]")
        if isinstance(self, typer.core.TyperGroup):
            rv.append(self.subcommand_metavar)
        return rv


class TidyCommand(_TidyParams, typer.core.TyperCommand):
    """A command whose help shows parameters the attnflow way (see :func:`_tidy`)."""


class TidyGroup(_TidyParams, typer.core.TyperGroup):
    """A command group whose help shows parameters the attnflow way (see :func:`_tidy`).

    The root group also takes its global flag ``--debug`` after the subcommand
    (``attnflow show RUN --debug``): it is moved in front before click parses (up to a ``--``).
    """

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if ctx.parent is None:
            cut = args.index("--") if "--" in args else len(args)
            if "--debug" in args[1:cut]:
                args = ["--debug", *(a for i, a in enumerate(args) if not (a == "--debug" and i < cut))]
        return super().parse_args(ctx, args)


class App(typer.Typer):
    """:class:`typer.Typer` whose commands and groups are :class:`TidyCommand` / :class:`TidyGroup`."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("cls", TidyGroup)
        kwargs.setdefault("rich_markup_mode", "rich")
        super().__init__(**kwargs)

    def command(self, *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("cls", TidyCommand)
        return super().command(*args, **kwargs)


app = App(
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


class UserError(InputError):
    """A mistake in what the user asked for on the command line: reported in one paragraph, exit code 2."""


def say(message: str, style: str | None = None, prefix: str = "") -> None:
    """Print ``message`` to stderr as plain text, after an optional styled ``prefix`` such as ``error:``.

    Escaped twice over: rich markup (``[sweep]`` in a message stays ``[sweep]``) and control characters
    (an ESC sequence from a folder's text is shown as ``\\x1b[2J``, never sent to the terminal)."""
    from attnflow.core.text import terminal_text  # here: the package attnflow.core imports torch

    head = f"[{style}]{escape(prefix)}[/] " if style and prefix else (escape(prefix) + " " if prefix else "")
    console.print(head + escape(terminal_text(message)), highlight=False, soft_wrap=True)


def fail(message: str, code: int = 2) -> None:
    """Report a user mistake in one escaped paragraph and exit with ``code`` (2)."""
    say(message, "bold red", "error:")
    raise typer.Exit(code)


def warn(message: str) -> None:
    """A warning line (escaped)."""
    say(message, "bold yellow", "warning:")


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
    errno.EFBIG,
}


def os_error_message(e: OSError) -> str:
    """``e`` as one sentence naming the path and the reason."""
    where = " -> ".join(repr(str(f)) for f in (e.filename, e.filename2) if f is not None)
    why = e.strerror or str(e)
    if e.errno == errno.EFBIG:
        why = "file too large (a file size limit, ulimit -f, or the file system's largest file)"
    return f"cannot use {where}: {why}." if where else f"{why}."


#: How a command turns a hint's parameter into one of its own flags: parameter -> (value -> flag
#: text, or ``None`` when the command cannot set that value).
HintFlags = Mapping[str, Callable[[Any], "str | None"]]


def _set_flag(param: str) -> Callable[[Any], str | None]:
    return lambda value: None if value is None else f"--set {param}={value}"


class _SetFlags(dict[str, Callable[[Any], "str | None"]]):
    """Any parameter -> ``--set param=value`` (commands that take ``--set``)."""

    def __missing__(self, param: str) -> Callable[[Any], str | None]:
        return _set_flag(param)

    def get(self, param: str, default: Any = None) -> Any:
        return self[param]


#: The hint flags of a command with ``--set`` (``run``, ``reproduce``).
SET_FLAGS: HintFlags = _SetFlags()

#: ``attnflow reproduce``: ``--set`` for parameters; ``sets`` (overrides) go with one experiment NAME.
REPRODUCE_FLAGS: HintFlags = _SetFlags(sets=lambda _: "attnflow reproduce NAME --set key=value")


def render_hint(hint: Any, flags: HintFlags | None) -> str | None:
    """The flag of this command that applies ``hint`` (``--set integration.dt=0.02``), or ``None``
    when there is no hint or the command has no flag for it (the message names the parameter).
    A hint without a value still renders where the command's flag needs none (``--force``)."""
    if not hint or flags is None or "param" not in hint:
        return None
    make = flags.get(hint["param"])
    if make is None:
        return None
    return make(hint.get("value"))


#: Library wording (a keyword of a Python call) -> how a command line says it, where the command has the flag:
#: the library's messages are written for Python callers, and a CLI message speaks CLI (issue 43).
_PYTHON_WORDS: tuple[tuple[str, str, str], ...] = (
    ("force", "pass force=True", "add {flag}"),
    ("force", "(force=True)", "({flag})"),
    ("force", "force=True", "{flag}"),
    ("overwrite", "pass overwrite=True", "add {flag}"),
    ("log_x", "log_x=True", "{flag}"),
    ("log_y", "log_y=True", "{flag}"),
    ("out", "another out folder", "another --out folder"),
    ("out", "a new out folder", "a new --out folder"),
    ("out", "Choose a new folder", "Choose a new --out folder"),
)

#: The library's ``resume_folder('DIR')``: on any command line that is another command, ``attnflow run --resume DIR``.
_RESUME_CALL = re.compile(r"""resume_folder\((?P<q>['"])(?P<dir>.*?)(?P=q)\)""")


def speak_cli(message: str, flags: HintFlags | None) -> str:
    """``message`` with each Python keyword of :data:`_PYTHON_WORDS` replaced by this command's flag for it
    (``pass force=True`` -> ``add --force``); a keyword the command has no flag for stays as it is. The call
    ``resume_folder('DIR')`` becomes ``'attnflow run --resume DIR'`` whatever the command."""
    for param, python, cli in _PYTHON_WORDS:
        # `param in flags`: a flag the command names (not `--set`'s catch-all, which would spell a keyword
        # as `--set force=True`).
        if python in message and flags is not None and param in flags:
            if (flag := flags[param](True)) is not None:
                message = message.replace(python, cli.format(flag=flag))
    return _RESUME_CALL.sub(lambda m: _resume_command(m["dir"]), message)


def _resume_command(folder: str) -> str:
    """``'attnflow run --resume DIR'``; a folder the shell must quote is quoted and the command left bare."""
    quoted = shlex.quote(folder)
    return f"'attnflow run --resume {folder}'" if quoted == folder else f"attnflow run --resume {quoted}"


def _with_hint(message: str, hint: Any, flags: HintFlags | None) -> str:
    flag = render_hint(hint, flags)
    spoken = speak_cli(message, flags)
    if not flag or (spoken != message and flag in spoken):
        return spoken
    return f"{spoken.rstrip()} With this command: {flag}."


def _show_warning(flags: HintFlags | None) -> Callable[..., None]:
    def show(message: Any, category: type[Warning], filename: str, lineno: int, file: Any = None, line: Any = None):
        warn(_with_hint(str(message), getattr(message, "hint", None), flags))

    return show


BUG_LINE = (
    "this is a bug in attnflow {version}, not a mistake in what you asked: please report it with the "
    "traceback above and the command you ran."
)


def guarded(fn: Callable[..., Any] | None = None, *, flags: HintFlags | None = None) -> Any:
    """Wrap a command: attnflow's own errors (and user-fixable OS errors) become one paragraph and
    exit code 2 (tracebacks under ``--debug``); any other exception is a bug, shown with its
    traceback and a line asking to report it (exit code 1). Warnings print as ``warning: ...``.

    ``flags``: how this command spells a hint's parameter (default: ``--set param=value`` when the
    command takes ``--set``, else no flag). Use as ``@guarded`` or ``@guarded(flags=...)``.
    """
    if fn is None:
        return lambda f: guarded(f, flags=flags)
    if flags is None and "set_" in inspect.signature(fn).parameters:
        flags = SET_FLAGS

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("always", AttnflowWarning)
                warnings.showwarning = _show_warning(flags)
                return fn(*args, **kwargs)
        except (typer.Exit, typer.Abort, ClickException, KeyboardInterrupt):  # typer reports these itself
            raise
        except (AttnflowError, FileNotFoundError, FileExistsError) as e:
            if _state["debug"]:
                raise
            if isinstance(e, OSError) and e.strerror and e.filename:
                fail(os_error_message(e))
            fail(_with_hint(str(e), getattr(e, "hint", None), flags))
        except OSError as e:
            if _state["debug"]:
                raise
            if e.errno not in USER_OS_ERRORS:
                _report_bug(e)
            fail(str(e) if e.errno is None or not e.strerror else os_error_message(e))
        except RecursionError:
            if _state["debug"]:
                raise
            fail(
                "the input is nested too deeply to read (thousands of levels); attnflow configs are a few levels deep."
            )
        except Exception as e:
            if _state["debug"]:
                raise
            _report_bug(e)

    return wrapper


def _report_bug(e: BaseException) -> None:
    """``e`` is a bug: its traceback, then the line asking for a report (exit code 1)."""
    traceback.print_exception(type(e), e, e.__traceback__, file=sys.stderr)
    say(BUG_LINE.format(version=__version__), "bold red", "error:")
    raise typer.Exit(1)


#: ``attnflow hf run``'s flags for a hint: the step is one layer over ``--steps-per-layer`` and the
#: explicit methods are ``--method``; the dtype is always float64 there.
def _steps_per_layer(dt: Any) -> str | None:
    return f"--steps-per-layer {math.ceil(1.0 / float(dt) - 1e-9)}" if dt is not None and float(dt) > 0 else None


HF_RUN_FLAGS: HintFlags = {
    "integration.dt": _steps_per_layer,
    "dt": _steps_per_layer,
    "integration.method": lambda m: f"--method {m}" if m in ("euler", "heun", "rk4") else None,
    "method": lambda m: f"--method {m}" if m in ("euler", "heun", "rk4") else None,
    "text": lambda _: "--ids 1,2,3 (token ids) instead of --text",
    "ids": lambda _: "--ids 1,2,3 (token ids) instead of --text",
}

#: The flags of a command that writes a new folder (``pde``): ``out`` is ``--out``,
#: ``overwrite``/``force`` is ``--force``.
OUT_FLAGS: HintFlags = {
    "out": lambda v: f"--out {v}" if v is not None else "a new --out folder",
    "overwrite": lambda v: "--force" if v is not False else None,
    "force": lambda v: "--force" if v is not False else None,
}

#: The flags of a command that writes one file (``report``, ``movie``, ``plot``).
FILE_OUT_FLAGS: HintFlags = {
    "force": lambda v: "--force" if v is not False else None,
    "out": lambda v: "--out with another path",
    "frames": lambda v: f"--frames {v}" if v is not None else "--frames N (fewer frames)",
}


class _SetAndOut(_SetFlags):
    """``--set param=value`` for config parameters, plus the folder flags of :data:`OUT_FLAGS` and
    ``--resume`` (``resume``: the unfinished run folder to continue), named so that :func:`speak_cli` finds them."""


#: ``attnflow run``: ``--set`` for config parameters, ``--out``/``--force``/``--resume`` for the folder.
RUN_FLAGS: HintFlags = _SetAndOut(
    OUT_FLAGS, resume=lambda v: f"attnflow run --resume {shlex.quote(str(v))}" if v is not None else None
)

#: ``attnflow hf verify``: a prompt is ``--text``; without it the check uses random tokens.
HF_VERIFY_FLAGS: HintFlags = {
    "text": lambda _: "no --text (random tokens)",
    "ids": lambda _: "no --text (random tokens)",
}

#: ``attnflow sweep``: the folder is ``--out``; the cluster is ``--workers`` or ``--scheduler``.
SWEEP_FLAGS: HintFlags = {
    "out": lambda v: "a new --out folder (or the folder of the same sweep, to continue it)",
    "workers": lambda v: "either --workers or --scheduler, not both",
    "scheduler": lambda v: "either --workers or --scheduler, not both",
}

#: ``attnflow sweep-plot``: the axes are ``--x``/``--y``, the diagnostic ``--color``, the fixed
#: parameters ``--where``, the log axes ``--log-x``/``--log-y``.
SWEEP_PLOT_FLAGS: HintFlags = {
    "where": lambda v: f"--where {v}" if v is not None else "--where KEY=VALUE",
    "x": lambda v: f"--x {v}" if v is not None else "--x and --y (two different axes)",
    "y": lambda v: f"--y {v}" if v is not None else "--x and --y (two different axes)",
    "color": lambda v: f"--color {v}" if v is not None else "--color NAME",
    "log_x": lambda v: "--log-x" if v else "no --log-x",
    "log_y": lambda v: "--log-y" if v else "no --log-y",
    "out": lambda v: f"attnflow sweep SWEEP.yaml --out {v}" if v is not None else "attnflow sweep SWEEP.yaml --out DIR",
}


def _print_version(value: bool) -> None:
    if value:
        print(f"attnflow {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    debug: bool = typer.Option(False, "--debug", help="Show full tracebacks instead of one-line errors."),
    version: bool = typer.Option(
        False, "--version", is_eager=True, callback=_print_version, help="Print the version and exit."
    ),
) -> None:
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


def progress_bar(description: str, unit: str = "steps") -> Progress:
    """A progress bar on stderr counting ``unit`` (task descriptions are markup: escape user text)."""
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn(unit),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=False,
        disable=not sys.stderr.isatty(),
    )
