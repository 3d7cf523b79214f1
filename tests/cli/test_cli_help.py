"""Every command's --help works (a rich-markup slip in a help text fails here), and the help shows
parameters one way: no ``<bool>``/``<list[str]>`` placeholders, positional arguments as NAME/[NAME]."""

from __future__ import annotations

import subprocess
import sys

import pytest
import typer
import typer.core
from typer.main import get_command
from typer.testing import CliRunner

from attnflow._version import __version__
from attnflow.cli import app
from attnflow.cli.app import App

runner = CliRunner()


def command_paths(typer_app: typer.Typer) -> list[list[str]]:
    """Every command path of the tree: [], ['run'], ['hf'], ['hf', 'run'], ..."""
    paths: list[list[str]] = []

    def walk(cmd, path: list[str]) -> None:
        paths.append(path)
        if isinstance(cmd, typer.core.TyperGroup):
            for name, sub in cmd.commands.items():
                walk(sub, [*path, name])

    walk(get_command(typer_app), [])
    return paths


def help_failures(typer_app: typer.Typer) -> dict[str, str]:
    """Command path -> what went wrong with its --help (exit code, exception)."""
    bad = {}
    for path in command_paths(typer_app):
        r = runner.invoke(typer_app, [*path, "--help"])
        if r.exit_code != 0 or r.exception is not None or "Traceback" in r.output:
            bad[" ".join(path) or "(root)"] = f"exit {r.exit_code}: {r.exception!r}"
    return bad


@pytest.mark.integration
def test_every_help_works():
    paths = command_paths(app)
    names = {" ".join(p) for p in paths}
    # the walk reaches the sub-app's commands
    assert {"run", "show", "reproduce", "hf", "hf run", "hf verify", "hf gf"} <= names
    assert len(paths) >= 15
    assert help_failures(app) == {}


@pytest.mark.integration
def test_markup_slip_fails_the_walk():
    """Negative control: a help text with '[/NAME]' (the old 'reproduce --help' crash) is caught."""
    bad = App(name="bad")

    @bad.command()
    def ok() -> None:
        """Fine."""

    @bad.command()
    def broken(out: str = typer.Option("x", help="Output folder (default runs/reproduce[/NAME]).")) -> None:
        """Broken."""

    failures = help_failures(bad)
    assert list(failures) == ["broken"]
    assert "MarkupError" in failures["broken"]


@pytest.mark.integration
def test_help_shows_parameters_one_way():
    for path in command_paths(app):
        out = runner.invoke(app, [*path, "--help"], terminal_width=200).output
        for placeholder in ("<bool>", "<list[str]>", "<str>", "<path>", "<int>", "{"):
            assert placeholder not in out, (path, placeholder)
    run_help = runner.invoke(app, ["run", "--help"], terminal_width=200).output
    assert "Usage: attnflow run [OPTIONS] [CONFIG]" in run_help
    assert "--out" in run_help and "PATH" in run_help
    show_help = runner.invoke(app, ["show", "--help"], terminal_width=200).output
    assert "Usage: attnflow show [OPTIONS] RUN_DIR" in show_help


@pytest.mark.integration
def test_version():
    r = runner.invoke(app, ["--version"])
    assert r.exit_code == 0
    assert r.output.strip() == f"attnflow {__version__}"


@pytest.mark.integration
def test_cli_startup_imports_no_heavy_modules():
    """`attnflow --help` stays fast: importing the CLI loads neither torch, xarray, scipy nor matplotlib."""
    code = (
        "import sys, attnflow.cli; "
        "print(sorted(m for m in ('torch', 'xarray', 'scipy', 'matplotlib', 'zarr', 'numpy') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.integration
def test_messages_are_escaped(tmp_path):
    """A folder name that looks like markup is printed as written."""
    missing = tmp_path / "runs[/NAME]" / "[bold]x"
    r = runner.invoke(app, ["show", str(missing)])
    assert r.exit_code == 2
    assert r.exception is None or isinstance(r.exception, SystemExit)
    assert "[bold]x" in r.output and "runs[/NAME]" in r.output


def test_extra_name_survives_in_messages():
    from attnflow.cli.app import console, fail

    with console.capture() as cap:
        try:
            fail("install them with pip install 'attnflow[sweep]' (dask, pandas)")
        except typer.Exit as e:
            assert e.exit_code == 2
    assert "attnflow[sweep]" in cap.get()


@pytest.mark.integration
def test_missing_extra_message_keeps_the_extra_name(monkeypatch, tmp_path):
    """End to end: the sweep's install hint reaches the user with '[sweep]' and '[distributed]' intact."""
    import importlib.util
    from pathlib import Path

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "distributed" else real(name, *a))
    sweep_file = Path(__file__).resolve().parents[2] / "examples" / "sweep_quick.yaml"
    r = runner.invoke(app, ["sweep", str(sweep_file), "--out", str(tmp_path / "s")], terminal_width=300)
    assert r.exit_code == 2
    assert "pip install 'attnflow[sweep]' (dask[distributed], pandas, pyarrow)" in r.output
