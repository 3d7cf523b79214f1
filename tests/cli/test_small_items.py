"""The smaller items of issue 43: ``--debug`` after the subcommand, ``reproduce``'s bottom line on screen,
``attnflow.AttnflowError`` at the top level."""

from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

import attnflow
from attnflow.cli import app
from attnflow.cli.app import UserError
from attnflow.cli.reproduce import bottom_line
from attnflow.core.errors import AttnflowError, InputError

runner = CliRunner()


@pytest.mark.parametrize("args", [["--debug", "show", "MISSING"], ["show", "MISSING", "--debug"]])
def test_debug_before_or_after_the_subcommand(tmp_path, args):
    """Both places show the traceback: the exception reaches the caller instead of a one-line error."""
    args = [str(tmp_path / "missing") if a == "MISSING" else a for a in args]
    r = runner.invoke(app, args)
    assert isinstance(r.exception, UserError) and "no run folder" in str(r.exception)


def test_without_debug_one_line_and_an_unknown_flag_is_still_refused(tmp_path):
    """Controls: without --debug the error is one line (exit 2); a misspelt flag is still 'No such option'."""
    r = runner.invoke(app, ["show", str(tmp_path / "missing")])
    assert r.exit_code == 2 and "error: no run folder" in r.output
    r = runner.invoke(app, ["show", str(tmp_path / "missing"), "--debugg"])
    assert r.exit_code == 2 and "No such option" in r.output


def _pred(ok: bool, control: bool = True, statement: str = "s"):
    return SimpleNamespace(ok=ok and control, control_rejected=control, statement=statement,
                           verdict="PASS" if ok and control else "FAIL")  # fmt: skip


def test_bottom_line_counts_and_names_the_failures():
    good = [
        SimpleNamespace(name="a", predictions=[_pred(True), _pred(True)]),
        SimpleNamespace(name="b", predictions=[_pred(True)]),
    ]
    assert bottom_line(good) == "3/3 predictions PASS; 3/3 negative controls rejected."
    bad = [*good, SimpleNamespace(name="c", predictions=[_pred(False, statement="F decreases")])]
    assert bottom_line(bad) == "3/4 predictions PASS; 4/4 negative controls rejected; FAILED: c: F decreases (FAIL)."


def test_reproduce_prints_its_bottom_line_last(monkeypatch, tmp_path):
    import attnflow.experiments as experiments

    results = [SimpleNamespace(name="ou", predictions=[_pred(True)], passed=True)]
    monkeypatch.setattr(experiments, "reproduce", lambda *a, **k: results)
    monkeypatch.setattr("attnflow.cli.reproduce.results_table", lambda results, title: "TABLE")
    r = runner.invoke(app, ["reproduce", "ou", "--quick", "--out", str(tmp_path / "rep")])
    assert r.exit_code == 0, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert lines[-1] == "1/1 predictions PASS; 1/1 negative controls rejected."


def test_attnflow_error_at_the_top_level():
    assert attnflow.AttnflowError is AttnflowError and "AttnflowError" in attnflow.__all__
    with pytest.raises(attnflow.AttnflowError):
        raise InputError("a user mistake")
    with pytest.raises(AttributeError):  # control: a name that is not exported
        attnflow.AttnflowErrors  # noqa: B018


def test_gf_step_warning_says_what_to_do():
    from attnflow.cli.hf import gf_step_warning

    text = gf_step_warning(3, 64)
    assert "3 prompt(s)" in text and "--gf-steps-per-layer such as 128" in text and "dt = 1/64" in text
    assert "smaller step" in gf_step_warning(1) and "such as" not in gf_step_warning(1)  # control: no count known
