"""Checkpoint and resume: bit-for-bit continuation, atomic files, a real SIGKILL of ``attnflow run``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from attnflow import load, simulate
from attnflow.cli.main import app
from attnflow.config import apply_overrides, build, load_config, preset_config
from attnflow.io.checkpoint import CHECKPOINT, Checkpointer, load_checkpoint, save_checkpoint
from attnflow.io.store import is_complete

torch.set_num_threads(1)  # bit-for-bit comparisons across processes need the same reduction order
SRC = Path(__file__).resolve().parents[2] / "src"


class Interrupt(Exception):
    pass


def small_cfg(method="rk4", process="ou", dtype="float64", **extra):
    over = [
        "tokens.n=24",
        "heads.count=3",
        "integration.t_end=1.0",
        "integration.dt=0.02",
        f"integration.method={method}",
        "integration.save_every=3",
        f"dtype={dtype}",
    ]
    cfg = apply_overrides(preset_config("ou"), over)
    if process != "ou":
        data = cfg.model_dump(mode="json")
        data["weights"] = {"process": process}
        data["heads"]["preset"] = "goe"
        cfg = type(cfg).model_validate(data)
    return cfg


def assert_same(a, b):
    assert np.array_equal(a.t, b.t)
    assert np.array_equal(a.x, b.x)
    assert np.array_equal(a.A, b.A)
    assert set(a.diagnostics) == set(b.diagnostics)
    for k in a.diagnostics:
        assert np.array_equal(a.diagnostics[k], b.diagnostics[k], equal_nan=True), k
    # The per-step EDI series (model gf) continue across the resume too.
    assert set(a.steps) == set(b.steps)
    for k in a.steps:
        assert np.array_equal(a.steps[k], b.steps[k]), k


@pytest.mark.parametrize(
    "method,process,dtype,stop_at",
    [
        ("rk4", "ou", "float64", 23),  # stochastic weights: the generator state must travel
        ("euler", "ou", "float64", 31),
        ("heun", "oscillating", "float64", 17),
        ("rk4", "ou", "float32", 29),  # float32 also resumes exactly (and its drift monitor too)
    ],
)
def test_resume_is_bit_for_bit(tmp_path, method, process, dtype, stop_at):
    cfg = small_cfg(method, process, dtype)
    x0, proc, kw = build(cfg)
    full = simulate(x0, proc, **kw)

    def stop(k, n):
        if k == stop_at:
            raise Interrupt

    ck = Checkpointer(tmp_path / CHECKPOINT, every_steps=5)
    x0, proc, kw = build(cfg)
    with pytest.raises(Interrupt):
        simulate(x0, proc, checkpoint=ck, progress=stop, **kw)
    saved = load_checkpoint(tmp_path)
    assert saved.step == (stop_at - 1) // 5 * 5 and ck.writes == saved.step // 5 + 1  # step 0 is written too
    x0, proc, kw = build(cfg)  # a fresh process object: nothing survives but the file
    resumed = simulate(x0, proc, resume=tmp_path / CHECKPOINT, **kw)
    assert resumed.provenance["resumed_from_step"] == saved.step
    assert_same(full, resumed)
    if dtype == "float32":
        assert resumed.provenance["float32_check"]["checks"] == full.provenance["float32_check"]["checks"]


def test_checkpoint_roundtrip_and_atomic_write(tmp_path):
    cfg = small_cfg()
    x0, proc, kw = build(cfg)
    ck = Checkpointer(tmp_path / "c.npz", every_steps=10)
    simulate(x0, proc, checkpoint=ck, **kw)
    c = load_checkpoint(tmp_path / "c.npz")
    save_checkpoint(tmp_path / "d.npz", c)
    d = load_checkpoint(tmp_path / "d.npz")
    assert d.step == c.step == 40 and d.fingerprint == c.fingerprint
    assert c.sampler_state["rng"] == d.sampler_state["rng"]
    assert np.array_equal(c.sampler_state["A"], d.sampler_state["A"]) and np.array_equal(c.x, d.x)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.npz", "d.npz"]  # no temporary file left behind
    (tmp_path / "bad.npz").write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(ValueError, match="damaged"):
        load_checkpoint(tmp_path / "bad.npz")


def test_resume_refuses_a_different_run(tmp_path):
    cfg = small_cfg()
    x0, proc, kw = build(cfg)
    simulate(x0, proc, checkpoint=Checkpointer(tmp_path / "c.npz", every_steps=10), **kw)
    other = apply_overrides(cfg, ["seed=1"])
    x0, proc, kw = build(other)
    with pytest.raises(ValueError, match="different run"):
        simulate(x0, proc, resume=tmp_path / "c.npz", **kw)


@pytest.mark.integration
def test_incomplete_folder_is_never_mistaken_for_a_finished_one(tmp_path):
    cfg = small_cfg()
    from attnflow.runs.runner import run_to_folder

    out = tmp_path / "run"

    def stop(k, n):
        if k == 27:
            raise Interrupt

    with pytest.raises(Interrupt):
        run_to_folder(cfg, out, every_steps=10, progress=stop, figures=False)
    assert not is_complete(out) and (out / CHECKPOINT).is_file() and (out / "config.yaml").is_file()
    with pytest.raises(ValueError, match="not a complete"):
        load(out)
    runner = CliRunner()
    res = runner.invoke(app, ["show", str(out)])
    assert res.exit_code == 2 and "Traceback" not in res.output
    msg = " ".join(res.output.split())
    assert "INCOMPLETE" in msg and "step 20 of 50" in msg and "--resume" in msg
    res = runner.invoke(app, ["run", "--preset", "ou", "--out", str(out)])
    assert res.exit_code == 2 and f"attnflow run --resume {out}" in " ".join(res.output.split())
    res = runner.invoke(app, ["run", "--resume", str(out), "--no-figures"])
    assert res.exit_code == 0, res.output
    assert is_complete(out) and not (out / CHECKPOINT).exists()
    x0, proc, kw = build(cfg)
    assert_same(simulate(x0, proc, **kw), load(out))
    res = runner.invoke(app, ["run", "--resume", str(out)])
    assert res.exit_code == 2 and "already complete" in res.output


def _cli(*args):
    env = {**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    return [sys.executable, "-m", "attnflow", *args], env


@pytest.mark.integration
def test_sigkill_then_resume_matches_uninterrupted_run(tmp_path):
    """A real `attnflow run` process is killed with SIGKILL mid-run, then resumed with --resume."""
    cfg_file = tmp_path / "long.yaml"
    cfg_file.write_text(
        "name: long\nmodel: gf\nseed: 7\ntokens: {n: 48, d: 3}\nheads: {count: 2, preset: identity, beta: 4}\n"
        "weights: {process: ou, rate: 1.0, sigma: 1.0}\n"
        "integration: {t_end: 4.0, dt: 0.01, method: euler, save_every: 25}\n"
    )
    out = tmp_path / "run"
    cmd, env = _cli("run", str(cfg_file), "--out", str(out), "--no-figures", "--checkpoint-every", "10")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    killed_at = None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            step = load_checkpoint(out / CHECKPOINT).step
        except (FileNotFoundError, ValueError):
            step = 0
        if step >= 30:
            proc.send_signal(signal.SIGKILL)
            killed_at = step
            break
        time.sleep(0.02)
    proc.wait(timeout=30)
    assert killed_at is not None and proc.returncode == -signal.SIGKILL, proc.stderr.read().decode()[-2000:]
    assert not is_complete(out)
    last = load_checkpoint(out / CHECKPOINT).step
    assert 30 <= last < 400

    cmd, env = _cli("show", str(out))
    shown = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert shown.returncode == 2 and "INCOMPLETE" in shown.stderr and "Traceback" not in shown.stderr

    cmd, env = _cli("run", "--resume", str(out), "--no-figures")
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    resumed = load(out)
    assert resumed.provenance["resumed_from_step"] >= last

    x0, process, kw = build(load_config(cfg_file))
    assert_same(simulate(x0, process, **kw), resumed)
