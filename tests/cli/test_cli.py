"""The attnflow command line: run/show/plot, presets, overrides, and clean errors for bad configs."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

import attnflow as af
from attnflow.cli.main import app
from attnflow.config import PRESETS, ConfigError, parse_config, preset_config

SRC = str(Path(__file__).resolve().parents[2] / "src")
SMALL = {
    "model": "gf",
    "tokens": {"n": 24, "d": 3},
    "heads": {"count": 2, "preset": "identity", "beta": 3.0},
    "weights": {"process": "ou", "rate": 1.0, "sigma": 0.3},
    "integration": {"t_end": 1.0, "dt": 0.05, "save_every": 5},
}


def _cli(*args, cwd=None):
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "attnflow", *args], capture_output=True, text=True, env=env, cwd=cwd)


@pytest.mark.integration
def test_run_show_plot(tmp_path):
    cfg = tmp_path / "small.yaml"
    cfg.write_text(yaml.safe_dump(SMALL))
    out = tmp_path / "run"
    r = _cli("run", str(cfg), "--out", str(out), "--seed", "5")
    assert r.returncode == 0, r.stderr
    traj = af.load(out)
    assert traj.x.shape == (5, 24, 3) and traj.seed == 5 and traj.config["seed"] == 5
    assert yaml.safe_load((out / "config.yaml").read_text())["tokens"]["n"] == 24
    runner = CliRunner()
    r = runner.invoke(app, ["show", str(out)])
    assert r.exit_code == 0 and "energy" in r.output and "clusters" in r.output
    (out / "figures" / "snapshots.png").unlink()
    r = runner.invoke(app, ["plot", str(out)])
    assert r.exit_code == 0 and (out / "figures" / "snapshots.png").is_file()
    # The same seed reproduces the run: bit for bit in the same thread setting, to rounding across them.
    for name in ("again", "again2"):
        r = runner.invoke(app, ["run", str(cfg), "--out", str(tmp_path / name), "--seed", "5", "--no-figures"])
        assert r.exit_code == 0, r.output
    np.testing.assert_array_equal(af.load(tmp_path / "again").x, af.load(tmp_path / "again2").x)
    np.testing.assert_allclose(af.load(tmp_path / "again").x, traj.x, rtol=0, atol=1e-13)


@pytest.mark.integration
@pytest.mark.parametrize(
    "bad, field",
    [
        ({"tokens": {"n": -3}}, "tokens.n"),
        ({"tokens": {"n": 8, "dd": 3}}, "tokens.dd"),
        ({"model": "gf", "heads": {"preset": "gaussian"}}, "symmetric"),
        ({"weights": {"process": "ou", "rate": "fast"}}, "weights.rate"),
        ({"integration": {"t_end": 1.0, "dt": 0.3}}, "whole number of steps"),
        ({"heads": {"count": 2, "masses": [0.3, 0.3]}}, "sum to 1"),
        ({"weights": {"process": "brownian"}}, "process"),
    ],
)
def test_bad_config_exits_2_with_one_message(tmp_path, bad, field):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(yaml.safe_dump(bad))
    out = tmp_path / "run"
    r = CliRunner().invoke(app, ["run", str(cfg), "--out", str(out)])
    assert r.exit_code == 2 and r.exception is None or isinstance(r.exception, SystemExit)
    assert field in r.output and "Traceback" not in r.output
    assert not out.exists() and [p.name for p in tmp_path.iterdir()] == ["bad.yaml"]


@pytest.mark.integration
def test_bad_config_in_a_real_process_prints_no_traceback(tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("tokens:\n  n: -3\n")
    r = _cli("run", str(cfg), "--out", str(tmp_path / "run"))
    assert r.returncode == 2 and "tokens.n" in r.stderr and "-3" in r.stderr
    assert "Traceback" not in r.stderr + r.stdout and not (tmp_path / "run").exists()
    r = _cli("--debug", "run", str(cfg), "--out", str(tmp_path / "run"))
    assert r.returncode != 0 and "Traceback" in r.stderr


@pytest.mark.integration
def test_cli_user_errors_are_clean(tmp_path):
    runner = CliRunner()
    r = runner.invoke(app, ["run", "--out", str(tmp_path / "x")])
    assert r.exit_code == 2 and "either a CONFIG file or --preset" in r.output
    r = runner.invoke(app, ["run", "--preset", "nope", "--out", str(tmp_path / "x")])
    assert r.exit_code == 2 and "unknown preset" in r.output
    r = runner.invoke(app, ["show", str(tmp_path / "missing")])
    assert r.exit_code == 2 and "no run folder" in r.output
    (tmp_path / "half").mkdir()
    r = runner.invoke(app, ["show", str(tmp_path / "half")])
    assert r.exit_code == 2 and "not a complete run folder" in r.output
    r = runner.invoke(app, ["run", "--preset", "ou", "--out", str(tmp_path / "y"), "--set", "tokens.n"])
    assert r.exit_code == 2 and "key.subkey=value" in r.output
    (tmp_path / "notyaml.yaml").write_text("tokens: [1, 2\n")
    r = runner.invoke(app, ["run", str(tmp_path / "notyaml.yaml"), "--out", str(tmp_path / "z")])
    assert r.exit_code == 2 and "not valid YAML" in r.output


def test_presets_validate_and_override():
    for name in PRESETS:
        cfg = preset_config(name)
        assert cfg.tokens.n == 256 and cfg.tokens.d == 3 and cfg.heads.count == 8
    with pytest.raises(ConfigError, match="heads.count"):
        parse_config({"heads": {"count": 0}})


@pytest.mark.integration
def test_preset_run_with_overrides(tmp_path):
    runner = CliRunner()
    out = tmp_path / "osc"
    r = runner.invoke(
        app,
        [
            "run",
            "--preset",
            "oscillating",
            "--out",
            str(out),
            "--no-figures",
            "--set",
            "tokens.n=16",
            "--set",
            "integration.t_end=0.4",
        ],
    )
    assert r.exit_code == 0, r.output
    traj = af.load(out)
    assert traj.N == 16 and traj.t[-1] == pytest.approx(0.4)
    A = traj.A
    assert not np.allclose(A[0], A[-1])  # oscillating weights move
