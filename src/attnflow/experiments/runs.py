"""Shared run builders for the experiments: a config dict -> (config, trajectory)."""

from __future__ import annotations

from typing import Any

import numpy as np

from attnflow.config import RunConfig, build, parse_config
from attnflow.io.trajectory import Trajectory
from attnflow.solve.simulation import simulate


def run(
    cfg: dict[str, Any], *, save_every: int | None = None, x0: np.ndarray | None = None
) -> tuple[RunConfig, Trajectory]:
    """Validate ``cfg`` and simulate it (optionally from given tokens, e.g. a perturbed cloud)."""
    rc = parse_config(cfg, f"experiment config {cfg.get('name', '')!r}")
    tokens, process, kwargs = build(rc)
    if save_every is not None:
        kwargs["save_every"] = save_every
    traj = simulate(tokens if x0 is None else x0, process, **kwargs)
    traj.seed = rc.seed
    return rc, traj


def late_mean(t: np.ndarray, y: np.ndarray, fraction: float = 0.5) -> float:
    """Time average of ``y`` over the last ``fraction`` of the run (trapezoid rule)."""
    m = t >= t[-1] - fraction * (t[-1] - t[0])
    return float(np.trapezoid(y[m], t[m]) / (t[m][-1] - t[m][0]))


def early_mean(t: np.ndarray, y: np.ndarray, fraction: float = 0.1) -> float:
    m = t <= t[0] + fraction * (t[-1] - t[0])
    return float(np.trapezoid(y[m], t[m]) / (t[m][-1] - t[m][0]))
