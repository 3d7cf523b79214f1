"""Plain helpers shared by the tests (random inputs, a small run, the browser lookup).

Import them with ``from helpers import ...``: pytest puts ``tests/`` on ``sys.path``
(``pythonpath = ["tests"]`` in pyproject.toml), so this works from every folder. Fixtures live in
``tests/conftest.py``.

The browser tests find Chromium through ``require_binary``. A user's ``make test`` needs no root and
no browser: the browser tests are skipped with the reason shown in pytest's summary (``-rs``). CI
(``.ci/run``, as root) installs ``chromium`` and ``chromium-driver`` first and sets
``ATTNFLOW_REQUIRE_BROWSER=1``: there a missing browser fails.
"""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest


def random_sym(rng, H, d, scale=1.0):
    G = rng.standard_normal((H, d, d))
    return scale * (G + G.transpose(0, 2, 1)) / 2


def random_tokens(rng, N, d):
    x = rng.standard_normal((N, d))
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def random_masses(rng, n):
    m = rng.uniform(0.5, 1.5, n)
    return m / m.sum()


# --- small simulated runs for the report / movie / CLI-view tests (fast enough for CI's default run) ---


def small_trajectory(n: int = 80, d: int = 3, H: int = 2, t_end: float = 1.5, dt: float = 0.1, seed: int = 0):
    """A ``gf`` run with constant GOE heads, Euler steps, every step saved."""
    from attnflow import simulate, tokens
    from attnflow.core.heads import goe_heads

    x0 = tokens.uniform(n, d, seed=seed)
    A = goe_heads(H, d, beta=4.0, seed=seed)
    return simulate(
        x0,
        A,
        model="gf",
        t_end=t_end,
        dt=dt,
        method="euler",
        save_every=1,
        config={"name": "test", "diagnostics": {"cluster_eps": 1e-3}},
    )


# --- where the browser tests find Chromium, and what happens when it is not installed ---

REQUIRE_ENV = "ATTNFLOW_REQUIRE_BROWSER"
INSTALL_HINT = "as root: apt-get install chromium chromium-driver (CI does this in .ci/run)"


def browser_required() -> bool:
    return os.environ.get(REQUIRE_ENV, "").strip() not in ("", "0")


def require_binary(*names: str) -> str:
    """The path of the first of ``names`` on PATH; otherwise skip the test, or fail it under CI."""
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    message = f"browser test: none of {', '.join(names)} is installed ({INSTALL_HINT})"
    if browser_required():
        pytest.fail(f"{message}; {REQUIRE_ENV}=1 makes a missing browser a failure", pytrace=False)
    pytest.skip(message)


# --- optional extras ---


def skip_without_sweep_extra() -> None:
    """Skip the calling test unless the ``sweep`` extra (distributed, pandas, pyarrow) is installed.

    ``attnflow sweep`` checks the extra before it reads the sweep file, and the results table is Parquet.
    """
    for name in ("distributed", "pandas", "pyarrow"):
        pytest.importorskip(name, reason=f"the sweep extra: pip install -e '.[sweep]' ({name})")


# --- a smooth, time-dependent attention field on S^2 (the order tests of the high-order schemes) ---


def smooth_field(beta: float = 1.5):
    """``f(t, x)``: an anisotropic attention field on ``S^2`` modulated by ``1 + 0.3 sin t``."""
    import torch

    A = torch.tensor([[beta, 0.3, 0.0], [0.3, 0.5 * beta, 0.1], [0.0, 0.1, 0.8]], dtype=torch.float64)
    V = torch.tensor([[1.0, 0.2, -0.1], [0.0, 1.0, 0.3], [0.1, 0.0, 0.9]], dtype=torch.float64)

    def f(t: float, x: torch.Tensor) -> torch.Tensor:
        s = (x @ A) @ x.T
        p = torch.softmax(s, dim=1)
        u = p @ (x @ V.T) * (1.0 + 0.3 * np.sin(t))  # time-dependent, smooth
        return u - (u * x).sum(1, keepdim=True) * x

    return f


def smooth_x0():
    """Six random unit vectors in ``R^3`` (seed 3)."""
    import torch

    from attnflow.core.geometry import retract

    g = torch.Generator().manual_seed(3)
    return retract(torch.randn(6, 3, generator=g, dtype=torch.float64))


def with_entry_changed(pair, table: str, row: int, col: int, delta: float):
    """A copy of a Butcher-tableau pair with ``pair.<table>[row][col]`` moved by ``delta`` (a corrupted
    coefficient, the negative control of an order test)."""
    from dataclasses import replace

    rows = [list(r) for r in getattr(pair, table)]
    rows[row][col] += delta
    return replace(pair, name="broken", **{table: tuple(tuple(r) for r in rows)})


# --- shared by the hostile-input and fault tests (tests/io) ---------------------------------------------

#: ``src/`` of this checkout: what a child process puts on its ``PYTHONPATH``.
SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")

#: The small run config the folder tests write and break (model gf, 16 tokens, 2 heads, 3 saves).
SMALL_RUN = {
    "model": "gf",
    "tokens": {"n": 16, "d": 3},
    "heads": {"count": 2, "preset": "identity", "beta": 3.0},
    "weights": {"process": "constant"},
    "integration": {"t_end": 0.4, "dt": 0.05, "save_every": 4},
}


def child_env(**extra: str) -> dict:
    """The environment of a child ``python -m attnflow``: this checkout's ``src`` first on the path."""
    return {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", ""), **extra}


def snapshot(folder) -> dict:
    """Every file under ``folder`` by relative path -> its bytes (to see that nothing changed)."""
    from pathlib import Path

    folder = Path(folder)
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def tiny_checkpoint(x, *, step: int, n_steps: int, fingerprint: str = ""):
    """A :class:`~attnflow.io.checkpoint.Checkpoint` of the state ``x`` ``(N, 3)`` at ``step`` of
    ``n_steps``, one saved state, no diagnostics (what the checkpoint-refusal tests start from)."""
    from attnflow.io.checkpoint import Checkpoint

    return Checkpoint(
        step=step,
        n_steps=n_steps,
        x=x,
        sampler_state={},
        saved_t=np.zeros(1),
        saved_x=x[None],
        saved_A=np.zeros((1, 1, 3, 3)),
        saved_V=np.zeros((1, 1, 3, 3)),
        any_V=False,
        diagnostics={},
        wall_time_s=0.0,
        fingerprint=fingerprint,
    )
