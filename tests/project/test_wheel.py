"""The package as a user installs it (issue 31, item 13): ``python -m build`` writes an sdist and a
wheel built from that sdist; the wheel installs into a fresh virtual environment (torch first, the
CPU build, then the wheel with its dependencies) and, run from outside the source tree, gives
``attnflow --help``, a preset run, ``report`` and ``reproduce ou --quick``.

``slow`` (a fresh environment: minutes); CI runs it (``.ci/run``). The fast tests below check what
the build would carry, so a missing file fails in every run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TORCH = "torch==2.13.0"


def _run(cmd: list[str], cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["OMP_NUM_THREADS"] = "1"
    res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert res.returncode == 0, f"{' '.join(cmd)} exited {res.returncode}:\n{res.stdout[-1500:]}\n{res.stderr[-3000:]}"
    return res


def test_the_package_data_is_declared() -> None:
    import tomllib

    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert cfg["project"]["scripts"]["attnflow"] == "attnflow.cli:entrypoint"
    assert "py.typed" in cfg["tool"]["setuptools"]["package-data"]["attnflow"]
    assert (ROOT / "src" / "attnflow" / "py.typed").is_file()
    manifest = (ROOT / "MANIFEST.in").read_text()
    assert "docs/assets/katex" in manifest and "examples" in manifest


@pytest.mark.integration
@pytest.mark.slow
def test_wheel_installs_and_runs(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(ROOT)], cwd=tmp_path)
    (wheel,) = dist.glob("attnflow-*.whl")
    (sdist,) = dist.glob("attnflow-*.tar.gz")
    names = zipfile.ZipFile(wheel).namelist()
    assert "attnflow/py.typed" in names and "attnflow/config/schema.py" in names  # the presets live there
    assert "attnflow/viz/report.py" in names and not any(n.endswith((".nbi", ".nbc")) for n in names)
    with tarfile.open(sdist) as tar:
        members = tar.getnames()
    assert any("docs/assets/katex/katex.min.js" in m for m in members)
    assert any(m.endswith("examples/ou.yaml") for m in members)

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], cwd=tmp_path)
    pip, bin_ = venv / "bin" / "pip", venv / "bin"
    # torch first, the CPU build: a local wheel when pip has one (as here), else PyTorch's CPU index
    local = subprocess.run([str(pip), "install", "-q", "--no-index", "--no-deps", "--dry-run", TORCH])
    extra = [] if local.returncode == 0 else ["--index-url", "https://download.pytorch.org/whl/cpu"]
    _run([str(pip), "install", "-q", TORCH, *extra], cwd=tmp_path)
    _run([str(pip), "install", "-q", str(wheel)], cwd=tmp_path)

    work = tmp_path / "work"
    work.mkdir()
    where = _run([str(bin_ / "python"), "-c", "import attnflow; print(attnflow.__file__)"], cwd=work).stdout
    assert str(venv) in where and str(ROOT) not in where  # the installed copy, not the source tree
    assert "Simulate multi-head attention" in _run([str(bin_ / "attnflow"), "--help"], cwd=work).stdout
    _run([str(bin_ / "attnflow"), "run", "--preset", "ou", "--out", "ou", "--set", "integration.t_end=0.5"], cwd=work)
    _run([str(bin_ / "attnflow"), "report", "ou"], cwd=work)
    assert (work / "ou" / "report.html").stat().st_size > 1e6  # plotly.js inlined
    res = _run([str(bin_ / "attnflow"), "reproduce", "ou", "--quick", "--out", "repro"], cwd=work)
    assert "PASS" in res.stdout + res.stderr
