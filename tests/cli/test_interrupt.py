"""Interruptions that help (issue 43): Ctrl-C (SIGINT) and SIGTERM during ``attnflow run`` print one line
with what was saved and the exact resume command, exit 130 / 143, leave no stale ``.NAME.lock``, and the
printed command finishes the run bit-identically to a run never interrupted."""

import os
import shlex
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import xarray as xr

from attnflow.io.checkpoint import load_checkpoint
from attnflow.io.lock import lock_path

pytestmark = pytest.mark.integration

#: A small run of ~1,000 rk4 steps, checkpointed every 5: long enough to be interrupted mid-way.
SETS = ["tokens.n=16", "heads.count=2", "integration.t_end=20"]


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "attnflow", *args]


def _run_args(out) -> list[str]:
    args = ["run", "--preset", "ou", "--out", str(out), "--no-figures", "--checkpoint-every", "5"]
    for s in SETS:
        args += ["--set", s]
    return args


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The same run, never interrupted."""
    out = tmp_path_factory.mktemp("reference") / "run"
    subprocess.run(_cli(*_run_args(out)), check=True, capture_output=True, timeout=600)
    return xr.open_zarr(out / "dataset.zarr").load()


def _interrupt(out, sig: int) -> subprocess.CompletedProcess:
    proc = subprocess.Popen(_cli(*_run_args(out)), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 300
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            ck = out / "checkpoint.npz"
            try:
                if ck.is_file() and load_checkpoint(ck).step >= 10:
                    break
            except (ValueError, OSError):  # being written
                pass
            time.sleep(0.02)
        assert proc.poll() is None, "the run ended before it could be interrupted"
        proc.send_signal(sig)
        text, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    return subprocess.CompletedProcess(proc.args, proc.returncode, text, "")


@pytest.mark.parametrize(("sig", "code", "by"), [(signal.SIGINT, 130, "Ctrl-C"), (signal.SIGTERM, 143, "SIGTERM")])
def test_interrupted_run_says_how_to_resume_and_resumes_bit_identically(tmp_path, reference, sig, code, by):
    out = tmp_path / "run"
    r = _interrupt(out, sig)
    assert r.returncode == code, r.stdout
    lines = [ln for ln in r.stdout.splitlines() if "resume with:" in ln]
    assert len(lines) == 1 and by in lines[0], r.stdout
    ck = load_checkpoint(out / "checkpoint.npz")
    assert f"step {ck.step} of {ck.n_steps}" in lines[0] and 0 < ck.step < ck.n_steps
    assert not lock_path(out).exists(), "a stale lock was left behind"
    command = shlex.split(lines[0].split("resume with:", 1)[1])
    assert command[:3] == ["attnflow", "run", "--resume"]
    done = subprocess.run(_cli(*command[1:]), capture_output=True, text=True, timeout=600, cwd=os.getcwd())
    assert done.returncode == 0, done.stdout + done.stderr
    got = xr.open_zarr(out / "dataset.zarr").load()
    for name in ("time", "x", "A", "energy", "clusters"):
        assert np.array_equal(got[name].values, reference[name].values), name
    print(
        f"{by}: stopped at step {ck.step} of {ck.n_steps}, exit {r.returncode}; the resume equals the reference bit for bit"
    )


def test_the_comparison_sees_a_different_run(tmp_path, reference):
    """Negative control: a run with another seed differs from the reference in the same comparison."""
    out = tmp_path / "other"
    subprocess.run(_cli(*_run_args(out), "--seed", "1"), check=True, capture_output=True, timeout=600)
    got = xr.open_zarr(out / "dataset.zarr").load()
    assert not np.array_equal(got["x"].values, reference["x"].values)
