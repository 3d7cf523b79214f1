"""The CLI in a fresh child process, timed from the moment its imports are done.

The child imports the CLI (and the modules the command will need) first, says ``ready``, and waits
for a go on a private pipe, so that its stdin stays free for the test (``yes`` piped in, say). The
time returned is the command's own (imports excluded: on a busy machine importing torch alone can
take longer than the 10 s a refusal may use); a command still running after ``limit`` seconds is
killed and returns exit code ``None``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

SRC = str(Path(__file__).resolve().parents[1] / "src")

CHILD = r"""
import os, sys
from attnflow.cli.main import app
import attnflow.cli.view, attnflow.cli.hf, attnflow.viz.report, attnflow.viz.movie, attnflow.runs.runner
for extra in sys.argv[2].split(","):
    if extra:
        __import__(extra)
print("ready", flush=True)
with os.fdopen(int(sys.argv[1]), "rb") as go:
    go.read()
try:
    app(sys.argv[3:], prog_name="attnflow", standalone_mode=True)
    code = 0
except SystemExit as e:
    code = e.code if isinstance(e.code, int) else 1
sys.stdout.flush(); sys.stderr.flush()
os._exit(code)
"""


def cli_timed(
    *args: object, stdin: Any = subprocess.DEVNULL, warm: tuple[str, ...] = (), limit: float = 60.0
) -> tuple[int | None, str, float]:
    """``(exit code or None when killed, output, seconds the command ran)`` of ``attnflow ARGS``."""
    r, w = os.pipe()
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", ""), "OMP_NUM_THREADS": "1"}
    env.pop("FORCE_COLOR", None)
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(r), ",".join(warm), *[str(a) for a in args]],
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        pass_fds=(r,),
        env=env,
    )
    os.close(r)
    assert proc.stdout is not None
    ready = proc.stdout.readline()
    assert ready.strip() == b"ready", ready + proc.stdout.read()
    t0 = time.monotonic()
    os.close(w)  # the go: the child's read returns at end of file
    try:
        out, _ = proc.communicate(timeout=limit)
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        code = None
    return code, out.decode(errors="replace"), time.monotonic() - t0


def assert_refused(code: int | None, out: str, seconds: float, *, within: float = 10.0) -> str:
    """Exit 2 with one ``error:`` sentence and no traceback, within ``within`` seconds; the message."""
    assert code == 2, (code, out)
    assert "Traceback" not in out, out
    body = " ".join(out.split())
    assert body.count("error:") == 1, out
    assert seconds < within, (seconds, out)
    print(f"refused in {seconds:.2f} s (margin {within - seconds:.2f} s): {body[:160]}")
    return body
