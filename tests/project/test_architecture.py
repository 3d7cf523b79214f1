"""The package's shape, enforced: import-linter's contracts (layers, no cycles) and ruff.

Each check runs against the real tree and, as its negative control, against a copy with one
deliberate violation, which it must reject.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _lint_imports(src: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(src)}
    return subprocess.run(
        [str(BIN / "lint-imports"), "--config", str(ROOT / "pyproject.toml"), "--no-cache"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_import_contracts_hold():
    res = _lint_imports(ROOT / "src")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    assert "2 kept, 0 broken" in res.stdout


@pytest.mark.parametrize(
    "module, line, broken",
    [
        ("core/geometry.py", "import attnflow.viz.plotting", "each stage imports only the stages below it BROKEN"),
        ("solve/guards.py", "from attnflow.solve import simulation", "No import cycle anywhere in the package BROKEN"),
        # An annotation-only import counts too: the Trajectory record sits in core so that no stage
        # below io needs one (dynamics.lipschitz had exactly this import before).
        (
            "dynamics/lipschitz.py",
            "from typing import TYPE_CHECKING as _TC\nif _TC:\n    from attnflow.io.trajectory import load",
            "each stage imports only the stages below it BROKEN",
        ),
    ],
)
def test_import_contracts_reject_a_violation(tmp_path, module, line, broken):
    src = tmp_path / "src"
    shutil.copytree(ROOT / "src" / "attnflow", src / "attnflow", ignore=shutil.ignore_patterns("__pycache__"))
    with open(src / "attnflow" / module, "a") as fh:
        fh.write(f"\n{line}  # noqa: E402, F401\n")
    res = _lint_imports(src)
    assert res.returncode != 0 and broken in res.stdout, res.stdout[-3000:]


def test_ruff_lint_and_format_are_clean():
    paths = ["src", "tests", "examples", "scripts", "benchmarks"]
    lint = subprocess.run([str(BIN / "ruff"), "check", *paths], cwd=ROOT, capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout[-3000:]
    fmt = subprocess.run([str(BIN / "ruff"), "format", "--check", *paths], cwd=ROOT, capture_output=True, text=True)
    assert fmt.returncode == 0, fmt.stdout[-3000:]


def _mypy(tree: Path) -> subprocess.CompletedProcess:
    """mypy with the project's configuration on the package at ``tree/src/attnflow``.

    The project's cache (``.mypy_cache``) keeps the third-party stubs (torch, numpy) checked once.
    """
    return subprocess.run(
        [
            str(BIN / "mypy"),
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--cache-dir",
            str(ROOT / ".mypy_cache"),
            str(tree / "src" / "attnflow"),
        ],
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=900,
    )


def test_mypy_finds_nothing_and_rejects_a_planted_type_error(tmp_path):
    res = _mypy(ROOT)
    assert res.returncode == 0 and "Success: no issues found" in res.stdout, res.stdout[-3000:] + res.stderr[-2000:]
    # Negative control: a copy with two planted defects, a type error anywhere and an unannotated
    # function in the fully typed core.
    tree = tmp_path / "tree"
    shutil.copytree(ROOT / "src" / "attnflow", tree / "src" / "attnflow", ignore=shutil.ignore_patterns("__pycache__"))
    with open(tree / "src" / "attnflow" / "viz" / "plotting.py", "a") as fh:
        fh.write('\n\ndef _planted() -> int:\n    return "not an int"\n')
    with open(tree / "src" / "attnflow" / "core" / "geometry.py", "a") as fh:
        fh.write("\n\ndef _planted_untyped(x):\n    return x\n")
    res = _mypy(tree)
    assert res.returncode != 0, res.stdout[-3000:]
    assert "viz/plotting.py" in res.stdout and "[return-value]" in res.stdout, res.stdout[-3000:]
    assert "core/geometry.py" in res.stdout and "[no-untyped-def]" in res.stdout, res.stdout[-3000:]
