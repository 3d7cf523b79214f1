"""The config of ``attnflow pde``: a YAML file of its own, validated with pydantic and bounded.

Its ``heads`` and ``weights`` sections are those of a run config (:mod:`attnflow.config.schema`), so the
PDE is driven by exactly the weight processes of :mod:`attnflow.weights` that particles are.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import Field, PositiveFloat, PositiveInt, ValidationError, model_validator

from attnflow.config.errors import ConfigError
from attnflow.config.schema import (
    ConstantWeights,
    HeadsConfig,
    IntegrationConfig,
    RunConfig,
    TokensConfig,
    WeightsConfig,
    _Strict,
    format_validation_error,
    read_yaml_file,
)
from attnflow.pde.basis import MAX_DEGREE_SPHERE

#: Bounds that keep one config's work and memory finite before anything starts.
MAX_LMAX_CIRCLE = 512
MAX_LMAX_SPHERE = min(MAX_DEGREE_SPHERE, 40)
MAX_HEADS = 64
MAX_STEPS = 200_000
MAX_SAVED_VALUES = 50_000_000  # saved frames x coefficients


class PDEInitial(_Strict):
    """The initial density: ``uniform``; ``perturbed`` = ``(1 + eps xi)/|S|`` with ``xi`` a seeded random
    combination of the degrees ``degrees[0]..degrees[1]`` (``max |xi| = 1``); ``vmf`` = a mixture of
    ``components`` von Mises-Fisher bumps of concentration ``kappa`` at seeded centres."""

    kind: Literal["uniform", "perturbed", "vmf"] = "perturbed"
    eps: Annotated[float, Field(ge=0, lt=1)] = 0.05
    degrees: tuple[PositiveInt, PositiveInt] = (1, 8)
    components: Annotated[int, Field(ge=1, le=64)] = 3
    kappa: Annotated[float, Field(gt=0, le=1000)] = 4.0


class PDEGrid(_Strict):
    """The resolution: ``lmax`` (highest frequency / degree) and the largest spectral tail share ``tail_tol``."""

    lmax: PositiveInt = 32
    tail_tol: Annotated[float, Field(gt=0, lt=1)] = 1e-8
    oversample: Annotated[float, Field(ge=1, le=3)] = 1.5


class PDEIntegration(_Strict):
    """Runge-Kutta 4 with step ``dt`` on ``[0, t_end]`` (a whole number of steps), saving every ``save_every``."""

    t_end: PositiveFloat = 2.0
    dt: PositiveFloat = 0.01
    save_every: PositiveInt = 5

    @model_validator(mode="after")
    def _check(self) -> PDEIntegration:
        n = round(self.t_end / self.dt)
        if n < 1 or abs(n * self.dt - self.t_end) > 1e-9 * self.t_end:
            raise ValueError(f"t_end = {self.t_end} must be a whole number of steps dt = {self.dt}")
        if n > MAX_STEPS:
            raise ValueError(f"t_end / dt = {n} steps is more than the bound {MAX_STEPS}; raise dt or lower t_end")
        return self


class PDEConfig(_Strict):
    """The whole PDE run: model, sphere dimension, heads, weight process, initial density, grid, steps, seed."""

    name: str = Field("pde", max_length=200)
    model: Literal["mha", "gf", "usa"] = "gf"
    d: Literal[2, 3] = 2
    seed: Annotated[int, Field(ge=0)] = 0
    heads: HeadsConfig = HeadsConfig(count=1, beta=4.0)
    weights: WeightsConfig = ConstantWeights()
    initial: PDEInitial = PDEInitial()
    grid: PDEGrid = PDEGrid()
    integration: PDEIntegration = PDEIntegration()

    @model_validator(mode="after")
    def _check(self) -> PDEConfig:
        top = MAX_LMAX_CIRCLE if self.d == 2 else MAX_LMAX_SPHERE
        if self.grid.lmax > top:
            raise ValueError(f"grid.lmax = {self.grid.lmax} exceeds the bound {top} for d = {self.d}")
        if self.heads.count > MAX_HEADS:
            raise ValueError(f"heads.count = {self.heads.count} exceeds the bound {MAX_HEADS}")
        lo, hi = self.initial.degrees
        if self.initial.kind == "perturbed" and not (lo <= hi <= self.grid.lmax):
            raise ValueError(f"initial.degrees must satisfy lo <= hi <= grid.lmax = {self.grid.lmax}; got {[lo, hi]}")
        K = 2 * self.grid.lmax + 1 if self.d == 2 else (self.grid.lmax + 1) ** 2
        frames = math.ceil(round(self.integration.t_end / self.integration.dt) / self.integration.save_every) + 1
        if frames * K > MAX_SAVED_VALUES:
            raise ValueError(
                f"saving {frames} frames of {K} coefficients exceeds the bound {MAX_SAVED_VALUES}; "
                "raise integration.save_every"
            )
        self.as_run_config()  # the heads/weights sections must also be valid as a run config's
        return self

    def as_run_config(self) -> RunConfig:
        """The run config with the same model, heads and weights (what builds the weight process)."""
        return RunConfig(
            name=self.name,
            model=self.model,
            seed=self.seed,
            tokens=TokensConfig(n=1, d=self.d),
            heads=self.heads,
            weights=self.weights,
            integration=IntegrationConfig(t_end=self.integration.t_end, dt=self.integration.dt),
        )


def parse_pde_config(data: Any, source: str = "") -> PDEConfig:
    """Validate a PDE config mapping; raises :class:`~attnflow.config.errors.ConfigError` with a readable message."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"invalid PDE config {source}: the top level must be a mapping, got {type(data).__name__}.")
    try:
        return PDEConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, source, kind="PDE config")) from None


def load_pde_config(path: str | Path) -> PDEConfig:
    """Read (bounded YAML) and validate a PDE config file."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"PDE config file {str(p)!r} does not exist or is not a file.")
    return parse_pde_config(read_yaml_file(p, "PDE config file"), f"in {str(p)!r}")


def initial_density(cfg: PDEConfig, basis: Any) -> Any:
    """The initial coefficients the config describes, on ``basis``."""
    import torch

    from attnflow.pde.solver import initial_coefficients, perturbed_uniform

    ini = cfg.initial
    s_init = int(np.random.SeedSequence(cfg.seed).spawn(4)[3].generate_state(1)[0])
    if ini.kind == "uniform":
        return initial_coefficients("uniform", basis)
    if ini.kind == "perturbed":
        return perturbed_uniform(basis, ini.eps, degrees=tuple(ini.degrees), seed=s_init)  # type: ignore[arg-type]
    rng = np.random.default_rng(s_init)
    centres = rng.standard_normal((ini.components, cfg.d))
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)

    def rho(x: np.ndarray) -> np.ndarray:
        return np.exp(ini.kappa * (x @ centres.T - 1)).sum(1)

    return initial_coefficients(rho, basis).to(torch.float64)


def build_pde(cfg: PDEConfig) -> tuple[Any, Any, dict[str, Any]]:
    """``(initial coefficients, weight process, solve_pde keyword arguments)`` of a config."""
    from attnflow.config.build import _seeds, build_heads, build_process
    from attnflow.pde.basis import make_basis

    run = cfg.as_run_config()
    _, s_heads, s_noise = _seeds(cfg.seed)
    A = build_heads(run, s_heads)
    process = build_process(run, A, s_noise)
    basis = make_basis(cfg.grid.lmax, cfg.d, oversample=cfg.grid.oversample)
    heads_w = None if cfg.heads.masses is None else np.asarray(cfg.heads.masses) / np.sum(cfg.heads.masses)
    kwargs = {
        "model": cfg.model,
        "t_end": cfg.integration.t_end,
        "dt": cfg.integration.dt,
        "save_every": cfg.integration.save_every,
        "tail_tol": cfg.grid.tail_tol,
        "seed": s_noise,
        "head_weights": heads_w,
        "basis": basis,
    }
    return initial_density(cfg, basis), process, kwargs
