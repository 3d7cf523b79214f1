"""The documentation builds without a single warning (``mkdocs build --strict``) and covers every command."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytest.importorskip("mkdocstrings", reason="the docs extra: pip install -e '.[docs]'")


def test_mkdocs_build_strict(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "NO_MKDOCS_2_WARNING": "1"}
    res = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    site = tmp_path / "site"
    # the API reference is generated from the docstrings
    fields = (site / "api" / "fields" / "index.html").read_text()
    assert "metric_speed" in fields and "harmonic mean" in fields
    # the gallery embeds the example files themselves
    gallery = (site / "gallery" / "index.html").read_text()
    assert "OrnsteinUhlenbeck" in gallery and "amplitude" in gallery and "trapezoid" in gallery


def test_every_cli_command_and_example_is_documented():
    from attnflow.cli.main import app

    commands = {c.name or c.callback.__name__ for c in app.registered_commands}
    assert {"run", "show", "plot", "report", "movie"} <= commands
    for name in commands:
        assert (ROOT / "docs" / "cli" / f"{name}.md").is_file(), f"no how-to page docs/cli/{name}.md"
    gallery = (ROOT / "docs" / "gallery.md").read_text()
    for example in sorted((ROOT / "examples").iterdir()):
        if example.suffix in (".py", ".yaml"):
            assert f"examples/{example.name}" in gallery, f"{example.name} is not in the gallery"
