"""Shared run builders for the experiments: a config dict -> (config, trajectory)."""

from __future__ import annotations

from typing import Any

import numpy as np

from attnflow.config import RunConfig, build, parse_config
from attnflow.core.trajectory import Trajectory
from attnflow.solve.simulation import simulate
from attnflow.verdicts.stats import early_mean, late_mean  # noqa: F401  (their home is verdicts.stats)


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
