"""Nothing lost under faults (issue 41, item 4): kill -9 at any moment of a save or of a
``run --out F --force`` replacement, disk full, two sweeps into one folder, and a checkpoint whose
``.npy`` header lies about its size.

The kill tests kill a real ``attnflow`` process at moments drawn from a fixed seed (reproducible in
CI): some spread over the whole command, some just after the hidden folder of the final save
appears. After each kill the folder is the old run or the new one, complete; a kill between the two
renames of a replacement leaves the old run aside, which the next writer puts back.
"""

from __future__ import annotations

import json
import random
import resource
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
import yaml

from attnflow.config import parse_config
from attnflow.core.errors import UnsafeInputError
from attnflow.io.checkpoint import load_checkpoint, save_checkpoint
from attnflow.io.store import clean_leftovers, folder_kind
from attnflow.io.trajectory import load
from attnflow.runs.runner import run_to_folder
from helpers import SMALL_RUN, child_env, skip_without_sweep_extra, snapshot, tiny_checkpoint

SMALL = SMALL_RUN


def _env() -> dict:
    return child_env(OMP_NUM_THREADS="1")


def _popen(*args: object) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "attnflow", *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )


_snapshot = snapshot


def _one_error(text: str) -> str:
    assert "Traceback" not in text, text
    body = " ".join(text[text.index("error:") :].split()) if "error:" in text else ""
    assert text.count("error:") == 1, text
    return body


@pytest.fixture(scope="module")
def old_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("faults") / "run"
    run_to_folder(parse_config(SMALL), out, figures=False)
    return out


def _state(folder: Path, old: dict[str, bytes]) -> str:
    """``old`` or ``new`` (a complete run with seed 7): anything else fails the test."""
    if _snapshot(folder) == old:
        return "old"
    traj = load(folder)  # verifies the manifest: a half-written folder raises here
    assert traj.seed == 7 and traj.t.shape == (3,)
    return "new"


@pytest.mark.integration
def test_kill9_at_random_moments_of_a_force_replacement(old_run, tmp_path):
    cfg = tmp_path / "new.yaml"
    cfg.write_text(yaml.safe_dump({**SMALL, "seed": 7}))
    out = tmp_path / "run"
    rng = random.Random(41)
    seen: dict[str, int] = {}
    # Moments: 3 spread over the command (import, simulation, save), 3 just after the final save's
    # hidden folder appears (inside atomic_folder: dataset, manifest, provenance, the renames).
    plans = [("any", rng.uniform(2.0, 14.0)) for _ in range(3)] + [("save", rng.uniform(0.0, 0.15)) for _ in range(3)]
    for kind, delay in plans:
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(old_run, out)
        old = _snapshot(out)
        proc = _popen("run", cfg, "--out", out, "--force", "--no-figures")
        if kind == "save":
            end = time.time() + 120
            while not list(tmp_path.glob(".run.tmp-*")) and proc.poll() is None and time.time() < end:
                time.sleep(0.005)
        time.sleep(delay)
        proc.kill()
        proc.wait()
        if not out.exists():  # killed between the two renames: the old run waits aside
            assert [p.name for p in tmp_path.glob(".run.old-*")], "the old run vanished"
            clean_leftovers(out)  # what the next writer does under the lock
        state = _state(out, old)
        seen[f"{kind}:{state}"] = seen.get(f"{kind}:{state}", 0) + 1
        clean_leftovers(out)
        assert not [p for p in tmp_path.iterdir() if p.name.startswith(".run.") and not p.name.endswith(".lock")]
    print(f"PASS kill -9 at {len(plans)} moments: outcomes {seen}")
    # Negative control: the same check tells a half-written folder apart (a missing chunk).
    (out / "dataset.zarr" / "x" / "0.0.0").unlink()
    with pytest.raises(Exception, match="missing|damaged"):
        _state(out, old)


_KILL_BETWEEN_RENAMES = r"""
import os, signal, sys
import attnflow.io.store as store
from attnflow.cli.main import app
real = os.rename
calls = []
def rename(a, b):
    real(a, b)
    calls.append(b)
    if ".old-" in str(b):  # the old run is aside, the new one not yet in place
        os.kill(os.getpid(), signal.SIGKILL)
store.os.rename = rename
app(sys.argv[1:], prog_name="attnflow")
"""


@pytest.mark.integration
def test_a_kill_between_the_two_renames_loses_nothing(old_run, tmp_path):
    cfg = tmp_path / "new.yaml"
    cfg.write_text(yaml.safe_dump({**SMALL, "seed": 7}))
    out = tmp_path / "run"
    shutil.copytree(old_run, out)
    old = _snapshot(out)
    r = subprocess.run(
        [sys.executable, "-c", _KILL_BETWEEN_RENAMES, "run", str(cfg), "--out", str(out), "--force", "--no-figures"],
        env=_env(),
        capture_output=True,
        text=True,
    )
    assert r.returncode == -signal.SIGKILL, r.stderr
    aside = list(tmp_path.glob(".run.old-*"))
    assert not out.exists() and len(aside) == 1  # the window the two renames leave open
    assert _snapshot(aside[0]) == old and folder_kind(aside[0]) == "run"
    # The next writer recognises the folder it set aside and puts it back before anything else.
    busy = _popen("run", cfg, "--out", out, "--no-figures")  # no --force: it must refuse to replace it
    _, err = busy.communicate(timeout=300)
    assert busy.returncode == 2 and "already holds a finished run" in _one_error(err), err
    assert _snapshot(out) == old and not list(tmp_path.glob(".run.old-*"))


def _limited_run(args: list[str], fsize: int, log: Path) -> int:
    """``attnflow ARGS`` in a child process whose files may not exceed ``fsize`` bytes (writes past it
    fail with ``EFBIG``, as on a full disk; ``SIGXFSZ`` is ignored across the exec). A fresh process,
    not a fork: the test process runs zarr's I/O thread, which a forked child would lack."""

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

    with open(log, "w") as fh:
        r = subprocess.run(
            [sys.executable, "-m", "attnflow", *args], stdout=fh, stderr=fh, env=_env(), preexec_fn=limit, timeout=300
        )
    return r.returncode


@pytest.mark.integration
@pytest.mark.parametrize("fsize", [1500, 6000, 9000])
def test_disk_full_during_a_force_replacement_keeps_the_old_run(old_run, tmp_path, fsize):
    cfg = tmp_path / "new.yaml"
    cfg.write_text(yaml.safe_dump({**SMALL, "seed": 7}))
    out = tmp_path / "run"
    shutil.copytree(old_run, out)
    old = _snapshot(out)
    biggest = max(len(v) for v in old.values())
    assert biggest > fsize  # negative control: the run writes a file larger than the limit (manifest, chunks)
    log = tmp_path / "log.txt"
    code = _limited_run(["run", str(cfg), "--out", str(out), "--force", "--no-figures"], fsize, log)
    text = log.read_text()
    assert code == 2, text
    msg = _one_error(text)
    assert _snapshot(out) == old  # the previous good data, byte for byte
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".run.") and not p.name.endswith(".lock")]
    print(f"PASS disk full at {fsize} B: old run kept, {msg[:100]}")
    # Without the limit the same command replaces it (the failure was the limit).
    assert _limited_run(["run", str(cfg), "--out", str(out), "--force", "--no-figures"], 2**30, log) == 0
    assert load(out).seed == 7


@pytest.mark.integration
def test_two_sweeps_into_one_folder_one_wins_the_other_refuses(tmp_path):
    skip_without_sweep_extra()
    base = {**SMALL, "tokens": {"n": 48, "d": 3}, "integration": {"t_end": 6.0, "dt": 0.01, "save_every": 50}}
    sweep = tmp_path / "s.yaml"
    sweep.write_text(yaml.safe_dump({"base": base, "grid": {"product": {"heads.beta": [1.0, 2.0, 3.0]}}}))
    out = tmp_path / "sw"
    procs = [_popen("sweep", sweep, "--out", out, "--workers", "1", "--yes") for _ in range(2)]
    results = [(p.wait(timeout=600), p.stderr.read()) for p in procs]  # type: ignore[union-attr]
    codes = sorted(c for c, _ in results)
    assert codes == [0, 2], results
    loser = next(err for c, err in results if c == 2)
    assert "being written by" in _one_error(loser)
    assert folder_kind(out) == "sweep" and len(list((out / "points").glob("*.json"))) == 3
    print(f"PASS two sweeps: exit codes {codes}; loser: {_one_error(loser)[:90]}")


def _checkpoint(path: Path) -> None:
    save_checkpoint(path, tiny_checkpoint(np.ones((4, 3)), step=1, n_steps=2, fingerprint="f"))


def _lie(path: Path, member: str, shape: tuple[int, ...]) -> None:
    """Rewrite ``member`` of the archive with a header declaring ``shape`` over its old data."""
    with zipfile.ZipFile(path) as zf:
        members = {i.filename: zf.read(i) for i in zf.infolist()}
    raw = members[member]
    fh = __import__("io").BytesIO(raw)
    np.lib.format.read_magic(fh)
    _, fortran, dtype = np.lib.format.read_array_header_1_0(fh)
    data = raw[fh.tell() :]
    out = __import__("io").BytesIO()
    np.lib.format.write_array_header_1_0(out, {"descr": dtype.str, "fortran_order": fortran, "shape": shape})
    members[member] = out.getvalue() + data
    with zipfile.ZipFile(path, "w") as zf:
        for name, blob in members.items():
            zf.writestr(name, blob)


def test_a_checkpoint_whose_npy_header_lies_is_refused_before_allocation(tmp_path):
    p = tmp_path / "checkpoint.npz"
    _checkpoint(p)
    assert load_checkpoint(p).x.shape == (4, 3)  # the honest file reads
    _lie(p, "saved_x.npy", (10**11, 4, 3))
    # Negative control: numpy itself allocates the declared 9.6 TB before reading (a child under 1 GiB).
    probe = (
        "import resource, numpy as np; resource.setrlimit(resource.RLIMIT_AS, (2**30, 2**30)); "
        f"np.load({str(p)!r})['saved_x']"
    )
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "MemoryError" in r.stderr, r.stderr[-300:]
    with pytest.raises(UnsafeInputError, match="lies about its size") as err:
        load_checkpoint(p)
    print(f"PASS lying .npy header refused: {err.value}"[:160])
    _checkpoint(p)
    _lie(p, "x.npy", (3, 3))  # smaller than its data is a lie too
    with pytest.raises(UnsafeInputError, match="lies about its size"):
        load_checkpoint(p)


def test_the_leftover_of_a_killed_save_is_ours_and_a_lookalike_is_not(old_run, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(old_run, out)
    ours = tmp_path / ".run.tmp-0123abcd"
    ours.mkdir()
    (ours / ".attnflow-writing").touch()
    theirs = tmp_path / ".run.tmp-notours1"
    theirs.mkdir()
    (theirs / "notes.txt").write_text(json.dumps({"mine": True}))
    removed = clean_leftovers(out)
    assert removed == [ours] and theirs.is_dir() and (theirs / "notes.txt").is_file()
