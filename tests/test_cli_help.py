"""Every command's ``--help`` renders (rich markup in help texts is parsed: ``[/NAME]`` would crash it)."""

from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner

from attnflow.cli.main import app

COMMANDS = [
    *[[c] for c in ("run", "show", "plot", "edi", "report", "movie", "sweep", "sweep-plot", "bench", "reproduce")],
    *[["hf", c] for c in ("verify", "run", "gf")],
]


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_help_renders(command):
    res = CliRunner().invoke(app, [*command, "--help"])
    assert res.exit_code == 0 and "Usage" in res.output, res.output[-2000:]


def test_a_markup_tag_in_help_breaks_it():
    # Negative control: the help text `attnflow reproduce` had (default runs/reproduce[/NAME]).
    bad = typer.Typer(rich_markup_mode="rich")

    @bad.command()
    def cmd(out: str = typer.Option("x", help="Output folder (default runs/reproduce[/NAME]).")) -> None:
        pass

    @bad.command()
    def other() -> None:
        pass

    res = CliRunner().invoke(bad, ["cmd", "--help"])
    assert res.exit_code != 0
