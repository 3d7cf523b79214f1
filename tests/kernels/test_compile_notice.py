"""A first compile announces itself (issue 43): ``attnflow run`` says what numba compiles, about how
long it takes and where it is cached, once, on stderr; a warm path says nothing.

A real cold compile costs minutes of wall time on a busy machine, so the hook is tested with numba's
own cache check in a fresh ``NUMBA_CACHE_DIR`` (no compile: the index is read, nothing is called) and
with a stand-in for "this would compile" through the real run paths (``simulate`` and the CLI)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from attnflow.cli.main import app
from attnflow.kernels import announce as notice
from attnflow.kernels import small
from helpers import SMALL_RUN, child_env


class _Cold:
    """A numba dispatcher's shape with nothing compiled and an empty (or stale) cache index."""

    signatures: list = []

    def __init__(self, index: dict) -> None:
        self._cache = type("C", (), {"_cache_file": type("F", (), {"_load_index": staticmethod(lambda: index)})()})()


@pytest.fixture(autouse=True)
def fresh_notices(monkeypatch):
    monkeypatch.setattr(notice, "_said", set())


def test_a_cold_function_is_announced_once_and_a_warm_one_never():
    said: list[str] = []
    with notice.compile_notices(said.append):
        assert notice.announce("the small-cloud steps", [_Cold({})])
        assert not notice.announce("the small-cloud steps", [_Cold({})])  # once per process
        # Negative controls: a cache index for this source, or a signature compiled in this process.
        assert not notice.announce("fast summation's CPU loops", [_Cold({"sig": "entry"})])
        warm = _Cold({})
        warm.signatures = ["float64(float64)"]
        assert not notice.announce("fast summation's CPU loops", [warm])
    assert len(said) == 1
    line = said[0]
    print(line)
    cpu = notice.COMPILE_CPU_S["the small-cloud steps"]
    assert line.startswith(f"compiling the small-cloud steps with numba (first use only: about {cpu:.0f} s of CPU")
    assert notice.numba_cache_location() in line and "attnflow warmup" in line
    assert not notice.announce("the small-cloud steps", [_Cold({})])  # no reporter: silent


@pytest.mark.skipif(not small.AVAILABLE, reason="numba is not installed")
def test_numbas_cache_check_on_the_real_kernels(tmp_path):
    """In an empty ``NUMBA_CACHE_DIR`` the small-cloud kernels would compile (checked without calling
    them); here, after a call, they would not."""
    code = "from attnflow.kernels import small, announce; print(announce.needs_compile([small._attempt]))"
    env = child_env(NUMBA_CACHE_DIR=str(tmp_path / "numba"))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert r.stdout.strip() == "True", r.stderr
    small.field(np.eye(3)[:2], np.eye(3)[None], np.eye(3)[None], np.ones(1), np.full(2, 0.5), "mha")
    assert not notice.needs_compile([small._eval])


@pytest.mark.skipif(not small.AVAILABLE, reason="numba is not installed")
def test_attnflow_run_announces_the_compile_on_stderr(tmp_path, monkeypatch):
    monkeypatch.setattr(notice, "needs_compile", lambda functions: True)  # as in a fresh cache
    cfg = tmp_path / "c.yaml"
    # model mha (gf records the EDI step by step, which keeps the torch path)
    cfg.write_text(
        yaml.safe_dump({**SMALL_RUN, "model": "mha", "integration": {**SMALL_RUN["integration"], "method": "rk4"}})
    )
    r = CliRunner().invoke(app, ["run", str(cfg), "--out", str(tmp_path / "run")])
    assert r.exit_code == 0, r.output
    assert r.output.count("compiling the small-cloud steps with numba") == 1, r.output
    # Negative control: a warm cache prints no such line.
    monkeypatch.setattr(notice, "_said", set())
    monkeypatch.setattr(notice, "needs_compile", lambda functions: False)
    r = CliRunner().invoke(app, ["run", str(cfg), "--out", str(tmp_path / "run2")])
    assert r.exit_code == 0 and "compiling" not in r.output, r.output
    assert os.path.isdir(tmp_path / "run2")
