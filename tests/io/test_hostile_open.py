"""Open, then check (issue 41, item 2): a named pipe planted in a run folder is refused at once.

Every file attnflow reads from outside goes through :func:`attnflow.io.safety.open_regular`
(``O_NOFOLLOW | O_NONBLOCK``, then ``fstat`` on that same descriptor). Before, a run folder whose
``provenance.json`` or ``manifest.json`` was a FIFO blocked ``report``, ``movie``, ``run --resume``
and ``run --out F --force`` until killed: the file was opened (and the open waited for a writer)
before the folder was scanned. Each case keeps its negative control: the plain open really blocks.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from pathlib import Path

import pytest
import yaml

from attnflow.config import parse_config
from attnflow.core.errors import UnsafeInputError
from attnflow.io.safety import open_regular, read_regular
from attnflow.runs.runner import run_to_folder
from helpers import SMALL_RUN
from hostile_child import assert_refused, cli_timed

SMALL = SMALL_RUN


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("open") / "run"
    run_to_folder(parse_config(SMALL), out, figures=False)
    return out


def blocks(opener, path: Path, seconds: float = 1.0) -> bool:
    """Whether ``opener(path)`` is still waiting after ``seconds`` (then a writer is opened to free it)."""
    done = threading.Event()

    def target() -> None:
        try:
            opener(path).close()
        except Exception:
            pass
        done.set()

    threading.Thread(target=target, daemon=True).start()
    waiting = not done.wait(seconds)
    if waiting:  # a writer end lets the blocked open return, so no thread is left behind
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
        done.wait(5)
    return waiting


def old_open(path: Path):
    """What attnflow did before: a no-follow open without O_NONBLOCK, then fstat."""
    return os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW), "rb")


def test_open_regular_refuses_pipes_links_folders_and_big_files_and_reads_plain_ones(tmp_path):
    plain = tmp_path / "plain.json"
    plain.write_bytes(b'{"a": 1}')
    assert read_regular(plain) == b'{"a": 1}'  # negative control: a plain file reads
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    assert blocks(old_open, fifo) and blocks(open, fifo)  # negative control: the old calls wait forever
    t0 = time.monotonic()
    with pytest.raises(UnsafeInputError, match="named pipe"):
        open_regular(fifo)
    assert time.monotonic() - t0 < 1.0
    link = tmp_path / "link.json"
    link.symlink_to(plain)
    assert link.read_bytes() == b'{"a": 1}'  # negative control: the link does resolve
    with pytest.raises(UnsafeInputError, match="symbolic link"):
        open_regular(link)
    with pytest.raises(UnsafeInputError, match="folder"):
        open_regular(tmp_path)
    with pytest.raises(UnsafeInputError, match="more than the 4"):
        read_regular(plain, max_bytes=4)
    with pytest.raises(FileNotFoundError):
        open_regular(tmp_path / "missing")


def test_open_regular_confines_to_its_folder(tmp_path):
    folder, outside = tmp_path / "folder", tmp_path / "outside"
    folder.mkdir()
    outside.mkdir()
    (outside / "secret.json").write_text("{}")
    (folder / "sub").symlink_to(outside, target_is_directory=True)
    assert (folder / "sub" / "secret.json").read_text() == "{}"  # negative control: the path resolves
    with pytest.raises(UnsafeInputError, match="symbolic link"):
        open_regular(folder / "sub" / "secret.json", folder)
    with pytest.raises(UnsafeInputError, match="outside"):
        open_regular(folder / ".." / "outside" / "secret.json", folder)
    (folder / "own.json").write_text("[]")
    assert read_regular(folder / "own.json", folder) == b"[]"


@pytest.mark.integration
@pytest.mark.parametrize("name", ["provenance.json", "manifest.json"])
@pytest.mark.parametrize("command", ["report", "movie", "resume", "force"])
def test_a_named_pipe_in_a_run_folder_is_refused_at_once(finished, tmp_path, name, command):
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    if command == "resume" and name != "provenance.json":  # a run to resume is unfinished
        prov = json.loads((run / "provenance.json").read_text())
        (run / "provenance.json").write_text(json.dumps({**prov, "complete": False}))
    (run / name).unlink()
    os.mkfifo(run / name)
    before = sorted(p.name for p in run.iterdir())
    assert blocks(old_open, run / name)  # negative control: the old open of this very file waits
    cfg = tmp_path / "small.yaml"
    cfg.write_text(yaml.safe_dump(SMALL))
    args = {
        "report": ["report", run, "--out", tmp_path / "r.html"],
        "movie": ["movie", run, "--out", tmp_path / "m.mp4"],
        "resume": ["run", "--resume", run],
        "force": ["run", cfg, "--out", run, "--force", "--no-figures"],
    }[command]
    code, out, seconds = cli_timed(*args, limit=60)
    msg = assert_refused(code, out, seconds)
    assert name in msg and ("pipe" in msg or "not a file" in msg), msg
    assert sorted(p.name for p in run.iterdir()) == before  # nothing removed, nothing written
    assert not (tmp_path / "r.html").exists() and not (tmp_path / "m.mp4").exists()


def _config(p: Path):
    from attnflow.config import load_config

    return load_config(p)


def _tokens(p: Path):
    from attnflow.core.tokens import from_file

    return from_file(p)


def _corpus(p: Path):
    from attnflow.hf.corpus import read_corpus

    return read_corpus(p)


def _checkpoint(p: Path):
    from attnflow.io.checkpoint import load_checkpoint

    return load_checkpoint(p)


def _lock_holder(p: Path):
    from attnflow.io.lock import holder

    return holder(p.parent / p.name.removeprefix(".").removesuffix(".lock"))


@pytest.mark.parametrize(
    "reader, name",
    [
        (_config, "run.yaml"),
        (_tokens, "tokens.npy"),
        (_tokens, "tokens.csv"),
        (_corpus, "corpus.txt"),
        (_checkpoint, "checkpoint.npz"),
        (_lock_holder, ".out.lock"),
    ],
)
@pytest.mark.parametrize("swapped", [False, True])
def test_every_reader_refuses_a_named_pipe_at_once(tmp_path, monkeypatch, reader, name, swapped):
    """``swapped``: the checks before the open are told "a regular file" (as if the pipe replaced
    the file between the check and the open): the read itself must still refuse it."""
    fifo = tmp_path / name
    os.mkfifo(fifo)
    assert blocks(open, fifo)  # negative control: a plain open of it waits for a writer
    if swapped:
        monkeypatch.setattr(Path, "is_file", lambda self: True)
    result: list[object] = []

    def call() -> None:
        try:
            result.append(reader(fifo))
        except Exception as e:  # the refusal, checked below
            result.append(e)

    t0 = time.monotonic()
    worker = threading.Thread(target=call, daemon=True)
    worker.start()
    worker.join(5)
    if worker.is_alive():  # free the blocked open, then fail
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        worker.join(5)
        pytest.fail(f"{reader.__name__} waited on the pipe {name}")
    (got,) = result
    # The lock record of a pipe is no record (nothing to name); every other reader refuses in one sentence.
    assert got == {} if reader is _lock_holder else isinstance(got, ValueError), got
    print(f"{reader.__name__}: {time.monotonic() - t0:.3f} s: {got}")
