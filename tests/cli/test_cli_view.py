"""``attnflow report`` / ``attnflow movie`` on the command line: outputs, and one-paragraph errors (exit 2)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from attnflow.cli.main import app

pytestmark = pytest.mark.integration

runner = CliRunner()


def test_report_command_writes_report_html(run_dir3):
    res = runner.invoke(app, ["report", str(run_dir3), "--max-frames", "5"])
    assert res.exit_code == 0, res.output
    assert (run_dir3 / "report.html").stat().st_size > 3_000_000
    assert "report.html" in res.output


def test_movie_command_writes_a_movie(run_dir3, tmp_path):
    out = tmp_path / "m.mp4"
    res = runner.invoke(
        app,
        [
            "movie",
            str(run_dir3),
            "--out",
            str(out),
            "--frames",
            "4",
            "--resolution",
            "160x120",
            "--trails",
            "2",
            "--rotate",
            "30",
        ],
    )
    assert res.exit_code == 0, res.output
    assert out.stat().st_size > 1000
    res = runner.invoke(app, ["movie", str(run_dir3), "--out", str(out)])
    assert res.exit_code == 2 and "already exists" in res.output


@pytest.mark.parametrize(
    "args, message",
    [
        (["report", "no/such/run"], "no run folder"),
        (["movie", "no/such/run", "--out", "m.mp4"], "no run folder"),
        (["movie", "{run}", "--out", "m.avi"], ".mp4 or .gif"),
        (["movie", "{run}", "--out", "{tmp}/m.mp4", "--resolution", "big"], "WIDTHxHEIGHT"),
        (["movie", "{run}", "--out", "{tmp}/m.mp4", "--resolution", "161x120"], "even"),
    ],
)
def test_user_mistakes_exit_2_without_traceback(args, message, run_dir3, tmp_path):
    args = [a.format(run=run_dir3, tmp=tmp_path) for a in args]
    res = runner.invoke(app, args)
    assert res.exit_code == 2, res.output
    assert message in res.output and "Traceback" not in res.output


def test_every_command_help_has_examples():
    for cmd in ["run", "show", "plot", "report", "movie"]:
        res = runner.invoke(app, [cmd, "--help"])
        assert res.exit_code == 0 and "Example" in res.output and f"attnflow {cmd}" in res.output
    res = runner.invoke(app, ["--help"])
    assert "attnflow report" in res.output and "attnflow movie" in res.output
