"""A first compile announces itself (issue 43): ``attnflow run`` says what numba compiles, about how
long it takes and where it is cached, once, on stderr; a warm path says nothing.

A real cold compile costs minutes of wall time on a busy machine, so the hook is tested with numba's
own cache check in a fresh ``NUMBA_CACHE_DIR`` (no compile: the index is read, nothing is called) and
with a stand-in for "this would compile" through the real run paths (``simulate`` and the CLI). A run
compiles in a child process (:func:`attnflow.kernels.announce.prepare`); here the child is a stand-in
too, and ``tests/kernels/test_build_bits.py`` (slow) runs the real one."""

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
    monkeypatch.setattr(notice, "_warm", set())


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


class _Child:
    """Stands in for the compiling child (``announce._spawn``): records its command and environment,
    and "warms the cache" (``cold`` becomes False) unless told to fail."""

    def __init__(self, returncode: int = 0, stderr: bytes = b"") -> None:
        self.calls: list[tuple[list[str], dict]] = []
        self.cold = True
        self.returncode, self.stderr = returncode, stderr

    def run(self, cmd, env, timeout):
        self.calls.append((cmd, env))
        if self.returncode == 0:
            self.cold = False
        return subprocess.CompletedProcess(cmd, self.returncode, stdout=None, stderr=self.stderr)


def test_a_cold_path_is_compiled_in_a_child_process_and_announced(monkeypatch):
    child = _Child()
    monkeypatch.setattr(notice, "_spawn", child.run)
    monkeypatch.setattr(notice, "needs_compile", lambda functions: child.cold)
    monkeypatch.delenv(notice.HERE_ENV, raising=False)
    said: list[str] = []
    with notice.compile_notices(said.append):
        assert notice.prepare("the small-cloud steps", [], "small")
        assert not notice.prepare("the small-cloud steps", [], "small")  # warm now: no second child
    assert len(child.calls) == 1
    cmd, env = child.calls[0]
    assert cmd == [sys.executable, "-m", "attnflow", "warmup", "--only", "small"]
    assert env[notice.HERE_ENV] == "1"  # the child compiles itself rather than starting another
    assert len(said) == 1 and said[0].startswith("compiling the small-cloud steps with numba"), said


def test_a_warm_path_is_checked_once_per_process(monkeypatch):
    """Found warm (or made warm by the child), a path is not checked again: numba's index files are
    read once, not on every run. Control: after a failed child the next call checks again."""
    checks: list[bool] = []
    cold = [False]

    def needs(functions) -> bool:
        checks.append(cold[0])
        return cold[0]

    monkeypatch.setattr(notice, "needs_compile", needs)
    monkeypatch.delenv(notice.HERE_ENV, raising=False)
    for _ in range(5):
        assert not notice.prepare("the small-cloud steps", [], "small")
    assert len(checks) == 1
    failing = _Child(returncode=1)
    monkeypatch.setattr(notice, "_spawn", failing.run)
    cold[0] = True
    checks.clear()
    assert notice.prepare("fast summation's CPU loops", [], "fast")
    assert notice.prepare("fast summation's CPU loops", [], "fast")  # not memoised: a second try
    assert len(failing.calls) == 2 and len(checks) == 2  # checked on each call


def test_the_child_and_warmup_compile_in_their_own_process(monkeypatch):
    """Negative controls: inside the child (``ATTNFLOW_COMPILE_HERE``) or :func:`compile_here`, no
    process is started, though the path is cold."""
    child = _Child()
    monkeypatch.setattr(notice, "_spawn", child.run)
    monkeypatch.setattr(notice, "needs_compile", lambda functions: True)
    monkeypatch.setenv(notice.HERE_ENV, "1")
    assert not notice.prepare("the small-cloud steps", [], "small")
    monkeypatch.delenv(notice.HERE_ENV)
    with notice.compile_here():
        assert not notice.prepare("the small-cloud steps", [], "small")
    assert child.calls == []
    assert notice.prepare("the small-cloud steps", [], "small")  # and outside both, one is
    assert len(child.calls) == 1


@pytest.mark.parametrize(
    "child, why",
    [
        (_Child(returncode=1, stderr=b"Traceback ...\nMemoryError: out of memory\n"), "exit status 1: MemoryError"),
        (_Child(returncode=0), "the cache is still cold afterwards"),
    ],
)
def test_a_failed_child_says_why_and_the_run_compiles_here(monkeypatch, child, why):
    monkeypatch.setattr(notice, "_spawn", child.run)
    monkeypatch.setattr(notice, "needs_compile", lambda functions: True)  # cold before and after
    monkeypatch.delenv(notice.HERE_ENV, raising=False)
    said: list[str] = []
    with notice.compile_notices(said.append):
        assert notice.prepare("the small-cloud steps", [], "small")
    assert len(said) == 2, said
    assert said[1].startswith("compiling the small-cloud steps in a separate process failed (" + why)
    assert said[1].endswith("compiling here instead")


def test_a_child_that_cannot_start_is_reported(monkeypatch):
    def refuse(cmd, env, timeout):
        raise OSError("no such interpreter")

    monkeypatch.setattr(notice, "_spawn", refuse)
    monkeypatch.setattr(notice, "needs_compile", lambda functions: True)
    monkeypatch.delenv(notice.HERE_ENV, raising=False)
    said: list[str] = []
    with notice.compile_notices(said.append):
        notice.prepare("the small-cloud steps", [], "small")
    assert "failed (OSError: no such interpreter)" in said[-1]


@pytest.mark.skipif(not small.AVAILABLE, reason="numba is not installed")
def test_attnflow_run_announces_the_compile_on_stderr(tmp_path, monkeypatch):
    child = _Child()
    monkeypatch.setattr(notice, "_spawn", child.run)
    monkeypatch.setattr(notice, "needs_compile", lambda functions: child.cold)  # as in a fresh cache
    monkeypatch.delenv(notice.HERE_ENV, raising=False)
    cfg = tmp_path / "c.yaml"
    # model mha (gf records the EDI step by step, which keeps the torch path)
    cfg.write_text(
        yaml.safe_dump({**SMALL_RUN, "model": "mha", "integration": {**SMALL_RUN["integration"], "method": "rk4"}})
    )
    r = CliRunner().invoke(app, ["run", str(cfg), "--out", str(tmp_path / "run")])
    assert r.exit_code == 0, r.output
    assert r.output.count("compiling the small-cloud steps with numba") == 1, r.output
    assert len(child.calls) == 1 and "failed" not in r.output, r.output
    # Negative control: a warm cache prints no such line.
    monkeypatch.setattr(notice, "_said", set())
    monkeypatch.setattr(notice, "needs_compile", lambda functions: False)
    r = CliRunner().invoke(app, ["run", str(cfg), "--out", str(tmp_path / "run2")])
    assert r.exit_code == 0 and "compiling" not in r.output, r.output
    assert os.path.isdir(tmp_path / "run2")
