"""Shared fixtures: small simulated runs (fast enough for CI's default run)."""

from __future__ import annotations

import numpy as np
import pytest

from attnflow import simulate, tokens
from attnflow.heads import goe_heads


def small_trajectory(n: int = 80, d: int = 3, H: int = 2, t_end: float = 1.5, dt: float = 0.1, seed: int = 0):
    """A ``gf`` run with constant GOE heads, Euler steps, every step saved."""
    x0 = tokens.uniform(n, d, seed=seed)
    A = goe_heads(H, d, beta=4.0, seed=seed)
    return simulate(x0, A, model="gf", t_end=t_end, dt=dt, method="euler", save_every=1,
                    config={"name": "test", "diagnostics": {"cluster_eps": 1e-3}})


@pytest.fixture(scope="session")
def traj3():
    return small_trajectory()


@pytest.fixture(scope="session")
def run_dir3(traj3, tmp_path_factory):
    path = tmp_path_factory.mktemp("runs") / "r3"
    traj3.save(path, figures=False)
    return path
