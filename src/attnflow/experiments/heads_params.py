"""The ``heads`` experiment's typed parameters (:class:`HeadsParams`) and one parameter set's result
(:class:`SetResult`): what :mod:`attnflow.experiments.heads` runs on and :mod:`attnflow.experiments.heads_report`
reads, in a module of their own so that both import them (the experiment imports its report)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import Field, PositiveFloat, PositiveInt

from attnflow.analysis.floor_fit import SEED_BATCHES, ConstantCheck, ExponentFit, SeedFloor, TailFit
from attnflow.experiments.common import ExperimentParams, Section
from attnflow.weights.processes import ou_stationary_scale


class TokensParams(Section):
    n: PositiveInt = 16
    d: Annotated[int, Field(ge=2)] = 3
    init: Literal["cap", "uniform"] = "cap"
    angle: Annotated[float, Field(gt=0, le=math.pi)] = math.pi / 2


class HeadsSection(Section):
    counts: Annotated[list[PositiveInt], Field(min_length=2)] = [1, 2, 4, 8, 16, 32, 64, 128, 256]
    beta: PositiveFloat = 2.0


class OUParams(Section):
    rate: PositiveFloat = 1.0
    sigma: PositiveFloat = 0.5
    init_spread: Annotated[float, Field(ge=0)] = 0.5


class IntegrationParams(Section):
    #: The run's length at ``d >= 3``; below, :func:`attnflow.experiments.heads.run_length` lengthens it
    #: (``tangent_scaled``).
    t_end: PositiveFloat = 24.0
    dt: PositiveFloat = 0.05
    save_every: PositiveInt = 2
    #: Lengthen the run below ``d = 3`` so that each seed's window is as precise as at ``d = 3``
    #: (:func:`attnflow.experiments.heads.run_length`); ``false``: every ``d`` runs to ``t_end``.
    tangent_scaled: bool = True


class HeadsParams(ExperimentParams):
    """The parameters of ``attnflow reproduce heads``."""

    tokens: TokensParams = TokensParams()
    heads: HeadsSection = HeadsSection()
    weights: OUParams = OUParams()
    integration: IntegrationParams = IntegrationParams()
    seeds: Annotated[int, Field(ge=3)] = 8
    tail: Annotated[int, Field(ge=2)] = 3
    #: The sequential design's cap on batches of ``seeds`` seeds at the tail's H (:data:`SEED_BATCHES`).
    seed_batches: Annotated[int, Field(ge=1)] = SEED_BATCHES
    #: Monte Carlo draws of the H heads behind each seed's predicted floor.
    draws: Annotated[int, Field(ge=8)] = 256
    #: Further parameter sets: overrides of the parameters above (``--set`` applies on top of each).
    sets: dict[str, dict[str, Any]] = {}

    @property
    def stationary_scale(self) -> float:
        """``c = sigma / sqrt(2 rate)``: the stationary OU law's scale, ``A_h ~ Abar_h + c S_h`` (docs/model.md)."""
        return ou_stationary_scale(self.weights.sigma, self.weights.rate)


def heads_params(cfg: HeadsParams | Mapping[str, Any]) -> HeadsParams:
    """``cfg`` as :class:`HeadsParams`: the model itself, or its dict (``configs.yaml``'s form) validated once."""
    return cfg if isinstance(cfg, HeadsParams) else HeadsParams.parse(cfg)


@dataclass(frozen=True)
class UnsettledSeed:
    """A seed left out of the ``heads`` fits: its set, ``H`` and seed, ``why`` (the reason in words), its
    late floor and predicted floor, its clusters and the kind of stationary state it rests at (if any)."""

    set_name: str
    H: int
    seed: int
    why: str
    floor: float
    predicted: float
    clusters: tuple[int, ...]
    state: str | None

    def as_json(self) -> dict[str, Any]:
        """The entry ``results.json`` lists under ``unsettled`` (keys ``set``, ``H``, ``seed``, ``why``,
        ``floor``, ``predicted``, ``clusters``, ``state``)."""
        return {
            "set": self.set_name,
            "H": self.H,
            "seed": self.seed,
            "why": self.why,
            "floor": self.floor,
            "predicted": self.predicted,
            "clusters": list(self.clusters),
            "state": self.state,
        }


@dataclass
class SetResult:
    """One parameter set's runs, floors and fits (:func:`attnflow.experiments.heads._run_set`).

    ``H`` the numbers of heads (sorted, distinct); per ``H`` and seed ``(len(H), seeds)``: ``floor`` the late mean
    of ``|dF|^2``, ``abs_slope`` that of ``|dF|``, ``predicted`` the predicted floor, ``settled`` whether the seed
    entered; ``per_H`` the seeds' :class:`~attnflow.analysis.floor_fit.SeedFloor` rows. ``fit`` the exponent fit
    (:class:`~attnflow.analysis.floor_fit.ExponentFit`, its ``batches_needed`` recorded; ``main`` and ``control``
    its floor and ``|dF|`` fits), ``constant`` / ``constant_control`` the constant checks
    (:class:`~attnflow.analysis.floor_fit.ConstantCheck`; the control's prediction doubled). ``batches`` of
    ``seeds_per_batch`` seeds ran at the tail's ``H``; ``T`` is the runs' length (:func:`attnflow.experiments.heads.run_length`);
    ``unsettled`` the seeds left out (:class:`UnsettledSeed`; ``results.json`` lists them).
    """

    config: HeadsParams
    H: list[int]
    floor: np.ndarray
    abs_slope: np.ndarray
    predicted: np.ndarray
    settled: np.ndarray
    per_H: list[list[SeedFloor]]
    fit: ExponentFit
    batches: int
    seeds_per_batch: int
    constant: ConstantCheck
    constant_control: ConstantCheck
    T: float
    unsettled: list[UnsettledSeed]

    @property
    def main(self) -> TailFit:
        """The floor's own fit (exponent, CI, local exponents, tail, medians)."""
        return self.fit.main

    @property
    def control(self) -> TailFit:
        """The control's fit: the late mean of ``|dF|``."""
        return self.fit.control

    @property
    def run_length(self) -> dict[str, float]:
        """``results.json``'s ``run_length``: ``t_end`` and the run's length ``T``."""
        return {"t_end": self.config.integration.t_end, "T": self.T}
