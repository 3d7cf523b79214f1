"""Every example runs: the scripts as they are, the configs shortened to a few steps."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from attnflow.config import apply_overrides, load_config
from attnflow.runs import run_config

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def _run(script: str, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    res = subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return res.stdout


@pytest.mark.integration
def test_energy_dissipation_example(tmp_path):
    out = _run("energy_dissipation.py", str(tmp_path / "ed.png"))
    increase = float(re.search(r"increase between saved steps: (\S+)", out).group(1))
    gap = float(re.search(r"relative gap (\S+)", out).group(1))
    assert increase <= 0.0  # the gf energy never increases
    assert gap < 1e-3  # F(0) - F(T) = int |dF|^2 up to the trapezoid rule's O(dt^2)
    assert (tmp_path / "ed.png").stat().st_size > 10_000


@pytest.mark.integration
def test_quickstart_example(tmp_path):
    out = _run("quickstart.py", str(tmp_path / "q"))
    assert (tmp_path / "q" / "report.html").is_file()
    speed_gap = float(re.search(r"\| \|mu'\| - \|dF\| \| = (\S+)", out).group(1))
    assert speed_gap < 1e-8  # along gf the metric speed equals the slope


def _is_run_config(path: Path) -> bool:
    # sweep files (a `grid` over a base config) belong to the sweep tests
    import yaml

    return "grid" not in (yaml.safe_load(path.read_text()) or {})


@pytest.mark.parametrize("config", sorted(p.name for p in EXAMPLES.glob("*.yaml") if _is_run_config(p)))
def test_example_configs_run(config):
    cfg = load_config(EXAMPLES / config)
    dt = cfg.integration.dt
    cfg = apply_overrides(cfg, ["tokens.n=24", f"integration.t_end={3 * dt}", "integration.save_every=1"])
    traj = run_config(cfg)
    assert traj.x.shape == (4, 24, cfg.tokens.d)
    assert all(np.isfinite(v).all() for v in traj.diagnostics.values())
