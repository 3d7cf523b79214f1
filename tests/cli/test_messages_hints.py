"""Library messages name parameters and carry a structured hint; only the CLI turns a hint into a flag.

The same mistake is made twice: through the library (the message names ``force=True``, never
``--force``; ``e.hint`` names the parameter) and through the CLI (the paragraph ends with the
command's own flag). Controls: the raw library message has no ``--``; a command without a flag for
the hint's parameter renders nothing.
"""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from attnflow.cli.app import (
    FILE_OUT_FLAGS,
    HF_RUN_FLAGS,
    RUN_FLAGS,
    SET_FLAGS,
    SWEEP_PLOT_FLAGS,
    render_hint,
)
from attnflow.cli.main import app
from attnflow.core.errors import Hint, InputError
from attnflow.io.store import check_file_out
from attnflow.runs.runner import check_out

PNG = b"\x89PNG\r\n\x1a\n" + b"\0" * 16


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_existing_empty_out_folder_library_names_force_and_cli_renders_the_flag(tmp_path):
    out = tmp_path / "empty"
    out.mkdir()
    with pytest.raises(FileExistsError) as e:
        check_out(out)
    msg = str(e.value)
    assert "force=True" in msg and "--" not in msg  # control: the raw library message has no flag
    assert e.value.hint == Hint("force", True)  # type: ignore[attr-defined]
    check_out(out, force=True)  # the parameter the message names does fix it

    r = CliRunner().invoke(app, ["run", "--preset", "ou", "--out", str(out), "--no-figures"])
    flat = _flat(r.output)
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert "add --force to use it" in flat and "force=True" not in flat  # the CLI speaks CLI (issue 43)


def test_rerun_refusal_speaks_cli(tmp_path):
    """A finished run and an unfinished one in --out: the refusal names --force and --resume, never the
    library's force=True or resume_folder(...) (issue 43); the library keeps its own wording (control)."""
    done, half = tmp_path / "done", tmp_path / "half"
    done.mkdir()
    (done / "provenance.json").write_text('{"attnflow_version": "0", "complete": true}')
    (done / "dataset.zarr").mkdir()
    half.mkdir()
    (half / "config.yaml").write_text("name: x\n")
    for out, says in ((done, "add --force to replace it"), (half, f"'attnflow run --resume {half}'")):
        with pytest.raises(FileExistsError) as e:
            check_out(out)
        assert "force=True" in str(e.value)  # control: the library message
        r = CliRunner().invoke(app, ["run", "--preset", "ou", "--out", str(out), "--no-figures"])
        flat = _flat(r.output)
        assert r.exit_code == 2 and says in flat, flat
        assert "force=True" not in flat and "resume_folder(" not in flat


def test_existing_figure_library_names_force_and_cli_plot_renders_the_flag(tmp_path):
    fig = tmp_path / "fig.png"
    fig.write_bytes(PNG)
    with pytest.raises(InputError) as e:
        check_file_out(fig, "figure", force=False)
    assert "--" not in str(e.value) and "force=True" in str(e.value)
    assert e.value.hint is not None and e.value.hint.param == "force"
    check_file_out(fig, "figure", force=True)
    assert render_hint(e.value.hint, FILE_OUT_FLAGS) == "--force"


def test_each_command_spells_the_hint_its_own_way():
    assert render_hint(Hint("where", "heads.count=VALUE"), SWEEP_PLOT_FLAGS) == "--where heads.count=VALUE"
    assert render_hint(Hint("log_x", False), SWEEP_PLOT_FLAGS) == "no --log-x"
    assert render_hint(Hint("resume", "runs/a"), RUN_FLAGS) == "attnflow run --resume runs/a"
    assert render_hint(Hint("integration.dt", 0.02), RUN_FLAGS) == "--set integration.dt=0.02"  # still --set
    assert render_hint(Hint("ids"), HF_RUN_FLAGS) is not None and "--ids" in render_hint(Hint("ids"), HF_RUN_FLAGS)
    # controls: a parameter the command has no flag for, or a --set hint without a value, renders nothing
    assert render_hint(Hint("where", "k=1"), FILE_OUT_FLAGS) is None
    assert render_hint(Hint("integration.dt"), SET_FLAGS) is None
    assert render_hint(Hint("force", True), SWEEP_PLOT_FLAGS) is None


def test_resume_call_and_out_folder_speak_cli(tmp_path):
    """``resume_folder('DIR')`` is ``'attnflow run --resume DIR'`` on every command line (a folder with a space
    is quoted for the shell), and "another out folder" names ``--out`` only where the command has it; the
    library's own message keeps its Python words (control)."""
    from attnflow.cli.app import OUT_FLAGS, speak_cli
    from attnflow.runs.folders import folder_status

    msg = "it stopped; continue it with resume_folder('runs/my run'), or choose another out folder."
    for flags in (None, FILE_OUT_FLAGS, RUN_FLAGS):
        assert "continue it with attnflow run --resume 'runs/my run', or" in speak_cli(msg, flags)
        assert "resume_folder(" not in speak_cli(msg, flags)
    assert "another --out folder" in speak_cli(msg, OUT_FLAGS) and "another --out folder" in speak_cli(msg, RUN_FLAGS)
    assert "another out folder" in speak_cli(msg, None)  # control: a command without --out keeps the words
    assert speak_cli("not a run folder. Choose a new folder.", RUN_FLAGS).endswith("Choose a new --out folder.")
    half = tmp_path / "half"
    half.mkdir()
    (half / "config.yaml").write_text("name: x\n")
    assert "resume_folder(" in folder_status(half)  # control: the library speaks Python
    r = CliRunner().invoke(app, ["show", str(half)])
    flat = _flat(r.output)
    assert r.exit_code == 2 and f"'attnflow run --resume {half}'" in flat and "resume_folder(" not in flat, flat


def test_report_and_plot_refusals_speak_cli(tmp_path, run_dir3):
    """The file-writing commands (``report``, ``plot``) refused an existing file with the library's "pass
    force=True to replace it. With this command: --force." (issue 43: a CLI message speaks CLI); now one
    sentence naming --force. A command without a --force flag keeps the library's words (control)."""
    from attnflow.cli.app import speak_cli

    msg = "'x.html' already exists; choose another output, or pass force=True to replace it."
    assert (
        speak_cli(msg, FILE_OUT_FLAGS)
        == "'x.html' already exists; choose another output, or add --force to replace it."
    )
    assert speak_cli(msg, SWEEP_PLOT_FLAGS) == msg  # control: sweep plot has no --force
    assert speak_cli(msg, SET_FLAGS) == msg  # nor is `--set force=True` a flag for it
    assert speak_cli("log_x=True needs positive values", SWEEP_PLOT_FLAGS).startswith("--log-x needs")
    page = tmp_path / "report.html"
    assert CliRunner().invoke(app, ["report", str(run_dir3), "--out", str(page)]).exit_code == 0
    r = CliRunner().invoke(app, ["report", str(run_dir3), "--out", str(page)])
    flat = _flat(r.output)
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert "or add --force to replace it." in flat and "force=True" not in flat, flat
    assert "With this command" not in flat  # the flag is in the sentence, not appended after it
