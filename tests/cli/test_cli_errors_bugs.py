"""The CLI's error contract: attnflow's own errors are one sentence and exit code 2; anything else is
a bug, shown with its traceback and a line asking for a report; warnings print one way, with hints
rendered as flags the running command has."""

from __future__ import annotations

import warnings

import pytest
import yaml
from typer.testing import CliRunner

import attnflow.config as config_pkg
from attnflow.cli.app import HF_RUN_FLAGS, SET_FLAGS, UserError, guarded, render_hint
from attnflow.cli.main import app
from attnflow.core.caller import AttnflowWarning
from attnflow.core.errors import (
    AttnflowError,
    FloatRangeError,
    Hint,
    InputError,
    NumericalError,
    UnsafeInputError,
)


def _bad_preset(name):
    raise IndexError("list index out of range (planted)")


@pytest.mark.integration
def test_a_planted_bug_shows_its_traceback_and_asks_for_a_report(monkeypatch, tmp_path):
    monkeypatch.setattr(config_pkg, "preset_config", _bad_preset)
    r = CliRunner().invoke(app, ["run", "--preset", "ou", "--out", str(tmp_path / "run")])
    flat = " ".join(r.output.split())
    assert r.exit_code == 1, r.output
    assert "Traceback" in r.output and "IndexError: list index out of range (planted)" in r.output
    assert "_bad_preset" in r.output  # the frame of the bug itself
    assert "bug in attnflow" in flat and "please report it" in flat
    assert flat.index("IndexError") < flat.index("bug in attnflow")  # the line follows the traceback


@pytest.mark.integration
def test_a_bare_value_error_from_a_library_is_a_bug_not_a_user_error(monkeypatch, tmp_path):
    def numpy_like(name):
        raise ValueError("operands could not be broadcast together with shapes (3,) (4,)")

    monkeypatch.setattr(config_pkg, "preset_config", numpy_like)
    r = CliRunner().invoke(app, ["run", "--preset", "ou", "--out", str(tmp_path / "run")])
    assert r.exit_code == 1 and "Traceback" in r.output and "bug in attnflow" in " ".join(r.output.split())


@pytest.mark.integration
def test_a_user_error_is_still_one_sentence_and_exit_2(tmp_path):
    # Negative control of the two tests above: the same command with a real user mistake.
    r = CliRunner().invoke(app, ["run", "--preset", "nope", "--out", str(tmp_path / "run")])
    assert r.exit_code == 2 and "unknown preset" in r.output
    assert "Traceback" not in r.output and "bug in attnflow" not in r.output


@pytest.mark.integration
def test_debug_shows_the_traceback_of_a_user_error(tmp_path):
    r = CliRunner().invoke(app, ["--debug", "run", "--preset", "nope", "--out", str(tmp_path / "run")])
    assert r.exit_code != 0 and isinstance(r.exception, InputError)


def test_every_error_class_is_an_attnflow_error():
    from attnflow.config import ConfigError
    from attnflow.config.yamlsafe import YAMLLimitError
    from attnflow.experiments.common import ExperimentConfigError
    from attnflow.hf.importer import HFImportError
    from attnflow.io.lock import OutputBusy
    from attnflow.io.store import DamagedRun
    from attnflow.runs.runner import ResumeError
    from attnflow.solve.guards import NumericalInstability
    from attnflow.solve.preflight import PreflightError

    for cls in (ConfigError, HFImportError, ExperimentConfigError, OutputBusy, DamagedRun, ResumeError, PreflightError):
        assert issubclass(cls, InputError) and issubclass(cls, ValueError), cls
    assert issubclass(YAMLLimitError, UnsafeInputError) and issubclass(YAMLLimitError, ConfigError)
    assert issubclass(NumericalInstability, NumericalError) and issubclass(NumericalInstability, FloatingPointError)
    assert issubclass(FloatRangeError, NumericalError) and issubclass(FloatRangeError, OverflowError)
    assert issubclass(UserError, InputError)
    assert not issubclass(IndexError, AttnflowError)  # control


def test_library_input_errors_are_input_errors():
    import attnflow as af

    with pytest.raises(InputError, match="need n >= 1"):
        af.tokens.uniform(0, 3, 0)
    with pytest.raises(ValueError):  # existing ``except ValueError`` keeps working
        af.tokens.uniform(0, 3, 0)


def test_a_hint_is_rendered_as_a_flag_the_command_has():
    h = Hint("integration.dt", 0.02)
    assert render_hint(h, SET_FLAGS) == "--set integration.dt=0.02"
    assert render_hint(h, HF_RUN_FLAGS) == "--steps-per-layer 50"
    assert render_hint(Hint("integration.method", "jko"), HF_RUN_FLAGS) is None  # hf run has no jko
    assert render_hint(Hint("dtype", "float64"), HF_RUN_FLAGS) is None
    assert render_hint(h, None) is None and render_hint(None, SET_FLAGS) is None


def _stiff_command(message_hint):
    @guarded(flags=HF_RUN_FLAGS)
    def cmd():
        warnings.warn(AttnflowWarning("use dt <= 0.02.", hint=message_hint), stacklevel=1)
        warnings.warn("a third-party remark", DeprecationWarning, stacklevel=1)

    return cmd


def test_warnings_print_one_way_with_the_commands_own_flag(capsys):
    _stiff_command(Hint("integration.dt", 0.02))()
    err = " ".join(capsys.readouterr().err.split())
    assert "warning: use dt <= 0.02. With this command: --steps-per-layer 50." in err
    assert "--set" not in err  # hf run has no --set
    assert "warning: a third-party remark" in err and "DeprecationWarning" not in err and ".py:" not in err


def test_stability_warning_carries_a_structured_hint_not_a_flag():
    from attnflow import simulate, tokens
    from attnflow.core.heads import identity_heads
    from attnflow.solve.guards import StabilityWarning

    with pytest.warns(StabilityWarning) as rec:
        simulate(tokens.uniform(8, 3, 0), identity_heads(2, 3, 16.0), t_end=0.5, dt=0.25, method="rk4")
    w = rec[0].message
    assert isinstance(w, AttnflowWarning) and w.hint["param"] == "integration.dt" and 0 < w.hint["value"] < 0.25
    assert "--" not in str(w) and "dt <=" in str(w)


@pytest.mark.integration
def test_hf_run_advice_names_steps_per_layer_not_set(tmp_path, monkeypatch):
    # The hf run command with its real flags: a stiff hint renders as --steps-per-layer.
    import attnflow.hf.flow as flow

    def fake_run_prompt(*a, **k):
        from attnflow.solve.guards import Advice, StabilityWarning, warn

        warn(Advice("the step dt = 0.125 is large; use dt <= 0.02.", Hint("integration.dt", 0.02)), StabilityWarning)
        raise InputError("stop here (planted user error)")

    monkeypatch.setattr(flow, "run_prompt", fake_run_prompt)
    r = CliRunner().invoke(app, ["hf", "run", str(tmp_path), "--ids", "1,2", "--out", str(tmp_path / "o")])
    flat = " ".join(r.output.split())
    assert r.exit_code == 2 and "With this command: --steps-per-layer 50." in flat and "--set" not in flat


def _run_stiff(tmp_path):
    """``attnflow run`` of a config whose step is too large for its weights (it warns, and finishes)."""
    cfg = {
        "model": "gf",
        "tokens": {"n": 8, "d": 3},
        "heads": {"count": 2, "preset": "identity", "beta": 16.0},
        "weights": {"process": "constant"},
        "integration": {"t_end": 0.5, "dt": 0.25, "method": "rk4", "save_every": 1},
    }
    path = tmp_path / "stiff.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return CliRunner().invoke(app, ["run", str(path), "--out", str(tmp_path / "run"), "--no-figures"])


@pytest.mark.integration
def test_run_renders_set_for_a_config_hint(tmp_path):
    r = _run_stiff(tmp_path)
    flat = " ".join(r.output.split())
    assert r.exit_code == 0, r.output
    assert "warning: the step dt = 0.25 is large" in flat and "With this command: --set integration.dt=" in flat


@pytest.mark.integration
def test_edi_prints_a_data_warning_as_one_line_like_show(monkeypatch, tmp_path):
    # edi used to print the raw Python warning with its source line; now every command prints
    # ``warning: ...`` and nothing else for it.
    import attnflow.io.store as store
    import attnflow.io.trajectory as trajectory

    def load(path):
        warnings.warn(f"{str(path)!r} has no manifest.json (planted).", store.DataWarning, stacklevel=2)
        raise InputError("stop here (planted user error)")

    monkeypatch.setattr(store, "is_complete", lambda p: True)
    monkeypatch.setattr(trajectory, "load", load)
    r = CliRunner().invoke(app, ["edi", str(tmp_path)])
    lines = [line for line in r.output.splitlines() if line.strip()]
    assert r.exit_code == 2
    assert any(line.startswith("warning: ") and "has no manifest.json (planted)." in line for line in lines), r.output
    assert "DataWarning" not in r.output and "warnings.warn" not in r.output and ".py:" not in r.output


@pytest.mark.integration
def test_a_warning_under_a_command_points_at_the_command_not_at_typer(monkeypatch, tmp_path):
    import importlib

    cli_app = importlib.import_module("attnflow.cli.app")  # (attnflow.cli.app is also the App object)

    seen = []
    real = cli_app._show_warning

    def recording(flags):
        show = real(flags)

        def both(message, category, filename, lineno, file=None, line=None):
            seen.append(filename)
            show(message, category, filename, lineno, file, line)

        return both

    monkeypatch.setattr(cli_app, "_show_warning", recording)
    r = _run_stiff(tmp_path)
    assert r.exit_code == 0, r.output
    assert seen and all(f.replace("\\", "/").endswith("attnflow/cli/main.py") for f in seen), seen
    assert not [f for f in seen if "typer" in f]


def test_an_errors_hint_is_rendered_as_set_by_a_command_with_set(capsys):
    import torch

    from attnflow.core.heads import Heads
    from attnflow.kernels.dispatch import choose_fast

    x = torch.nn.functional.normalize(torch.randn(64, 3, dtype=torch.float64), dim=-1)
    a = torch.full((64,), 1 / 64, dtype=torch.float64)
    with pytest.raises(InputError) as err:  # beta = 400: no expansion reaches the tolerance
        choose_fast(x, Heads(K=400.0 * torch.eye(3, dtype=torch.float64)[None]), a, 1e-10, force=True)
    assert err.value.hint["param"] == "kernel.backend" and "--" not in str(err.value)

    @guarded
    def cmd(set_: list[str] | None = None):
        raise err.value

    with pytest.raises(Exception) as ex:
        cmd()
    assert getattr(ex.value, "exit_code", None) == 2
    assert "With this command: --set kernel.backend=auto." in " ".join(capsys.readouterr().err.split())
