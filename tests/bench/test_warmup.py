"""``attnflow warmup`` (issue 43): says where numba caches the kernels, and compiles each compiled path."""

import json
import os
import subprocess
import sys

import pytest


def test_cache_location_follows_numba_rules(monkeypatch, tmp_path):
    from attnflow.bench.warmup import numba_cache_location

    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    assert numba_cache_location() == str(tmp_path)
    monkeypatch.delenv("NUMBA_CACHE_DIR")
    assert numba_cache_location().endswith("kernels/fastsum/__pycache__")  # an editable, writable install


_PROBE = """
import json
from numba.core.registry import CPUDispatcher
import attnflow.kernels.small as s, attnflow.kernels.fastsum.cpu as c
def compiled():
    return {
        "small step": len(s._attempt.signatures),
        "ensemble step": len(s._batched_attempt.signatures),
        "fast summation": sum(len(v.signatures) for v in vars(c).values() if isinstance(v, CPUDispatcher)),
    }
before = compiled()
from attnflow.bench.warmup import warmup
warmup(report=lambda line: None)
print(json.dumps([before, compiled()]))
"""


@pytest.mark.slow
def test_warmup_compiles_every_compiled_path(tmp_path):
    """After warming up, the small-cloud step, the ensemble step and fast summation's loops each hold a
    compiled signature; control: in the same fresh process before the warm-up, none does."""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True, env=env, timeout=3000
    )
    before, after = json.loads(out.stdout.strip().splitlines()[-1])
    assert all(v == 0 for v in before.values()), before
    assert all(v >= 1 for v in after.values()), after
    assert any(tmp_path.rglob("*.nbi")), "nothing was written to the cache"


def test_only_one_group_runs_and_each_task_compiles_in_this_process(monkeypatch):
    """``warmup(only="small")`` runs the small-cloud tasks alone, each inside ``compile_here`` (so a run
    inside the warm-up does not start another child); the control ``only=None`` runs them all."""
    from attnflow.bench import warmup as wu
    from attnflow.kernels import announce

    ran: list[tuple[str, bool]] = []
    tasks = [(g, f"{g}{i}", lambda g=g: ran.append((g, bool(announce._here)))) for i, g in enumerate(wu.GROUPS * 2)]
    monkeypatch.setattr(wu, "_tasks", lambda: tasks)
    assert set(wu.warmup(report=lambda line: None, only="small")) == {"small1", "small3"}
    assert ran == [("small", True), ("small", True)]
    assert len(wu.warmup(report=lambda line: None)) == 4 and not announce._here
    with pytest.raises(ValueError, match="fast, small"):
        wu.warmup(report=lambda line: None, only="slow")


def test_warmup_refuses_an_unknown_group_in_one_line():
    from typer.testing import CliRunner

    from attnflow.cli.main import app

    r = CliRunner().invoke(app, ["warmup", "--only", "everything"])
    assert r.exit_code == 2, r.output
    assert "--only must be one of fast, small, not 'everything'" in r.output and "Traceback" not in r.output
