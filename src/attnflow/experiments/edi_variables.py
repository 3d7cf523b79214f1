"""The ``edi`` experiment's dataset: its variables and :func:`edi_dataset` (:mod:`attnflow.experiments.edi`
writes it)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import xarray as xr

from attnflow.io.metadata import describe

#: name -> (long_name, units, description) of the dataset's variables and coordinates.
VARIABLES: dict[str, tuple[str, str, str]] = {
    "process": (
        "weight process",
        "1",
        "the weight process A_h(t) of the runs: constant, oscillating (A_bar + C sin(omega t + phase)), ou "
        "(Ornstein-Uhlenbeck around A_bar) or callable (the oscillating weights as a Python function, dA/dt by "
        "finite difference)",
    ),
    "dt": ("step dt", "1", "integrator step dt of the rk4 runs (dimensionless model time)"),
    "ou_seed": ("OU seed", "1", "seed of one OU run: its initial tokens and its one Brownian path, shared by every dt"),
    "relative_residual": (
        "relative EDI residual",
        "1",
        "|F(T) - F(0) + 1/2 int |mu'|^2 + 1/2 int |dF|^2 - int dF/dt| divided by the dissipation "
        "1/2 int |mu'|^2 + 1/2 int |dF|^2, for each process and step dt (ou: root mean square over the seeds)",
    ),
    "control_relative_residual": (
        "relative EDI residual, negative control",
        "1",
        "the same residual read wrongly, from the same runs: constant and oscillating with the mobility mis-scaled "
        "by 10% (1/2 int |mu'|^2 / 1.1 + 1.1 x 1/2 int |dF|^2); ou with the weights' work as the Ito sum "
        "dF/dA[A_{k+1} - A_k] (no Ito correction), root mean square over the seeds; callable with the "
        "exact-increment rule (derivative='increment', a first-order splitting)",
    ),
    "ou_relative_residual": (
        "relative EDI residual per OU seed",
        "1",
        "relative EDI residual of each OU seed's run (one Brownian path per seed, the same path for every dt)",
    ),
}


def edi_dataset(
    procs: Sequence[str],
    rel: Mapping[str, np.ndarray],
    ctrl: Mapping[str, np.ndarray],
    rel_ou: np.ndarray,
    all_dt: Sequence[float],
    seeds: Sequence[int],
) -> xr.Dataset:
    """The relative EDI residuals (:data:`VARIABLES`) per process and step ``dt`` (``rel_ou``: per OU seed,
    ``(seeds, dts)``): ``all_dt`` the base steps
    then the refined ones; a process measured on fewer steps (OU: the base steps only) is NaN beyond."""
    pad = lambda v: np.concatenate([v, np.full(len(all_dt) - len(v), np.nan)])
    ds = xr.Dataset(
        {
            "relative_residual": (("process", "dt"), np.stack([pad(rel[p]) for p in procs])),
            "control_relative_residual": (("process", "dt"), np.stack([pad(ctrl[p]) for p in procs])),
            "ou_relative_residual": (("ou_seed", "dt"), np.stack([pad(row) for row in rel_ou])),
        },
        coords={"process": list(procs), "dt": all_dt, "ou_seed": seeds},
    )
    describe(ds, VARIABLES)
    return ds
