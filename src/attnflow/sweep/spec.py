"""The sweep file: a base run config, a parameter grid over dotted config keys, and seeds.

::

    name: quick
    base: ou                    # a preset name, a config file (relative to this file) or a mapping
    set:                        # fixed overrides of the base
      tokens.n: 32
    grid:
      product:                  # every combination of these lists
        heads.beta: [1, 4, 9]
        heads.count: [1, 8]
      zip:                      # these lists advance together (equal lengths)
        weights.rate: [0.5, 1.0]
        weights.sigma: [0.5, 1.0]
    seeds: 3                    # seeds 0, 1, 2 (or an explicit list [0, 7, 9])

The points are ``product x zip x seeds``; each is one run config, built with
:func:`attnflow.config.apply_overrides` and validated before anything runs. A point is named by a
hash of its full config, so a re-run (or an edited sweep file) recognises finished points.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, PositiveInt, ValidationError, model_validator

from attnflow.config import (
    PRESETS,
    ConfigError,
    RunConfig,
    apply_overrides,
    format_validation_error,
    load_config,
    parse_config,
    preset_config,
)
from attnflow.config.schema import read_yaml_file


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class GridSpec(_Strict):
    """``product``: every combination; ``zip``: lists that advance together."""

    product: dict[str, list[Any]] = {}
    zip: dict[str, list[Any]] = {}

    @model_validator(mode="after")
    def _check(self) -> GridSpec:
        for part in ("product", "zip"):
            for key, values in getattr(self, part).items():
                if not values:
                    raise ValueError(f"grid.{part}.{key} is an empty list; give at least one value")
                if key == "seed":
                    raise ValueError("sweep seeds with the top-level 'seeds' field, not grid key 'seed'")
        both = set(self.product) & set(self.zip)
        if both:
            raise ValueError(f"keys {sorted(both)} appear in both grid.product and grid.zip; keep each key in one")
        lengths = {k: len(v) for k, v in self.zip.items()}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"the grid.zip lists must have equal lengths; got {lengths}")
        return self


class SummarySpec(_Strict):
    """How the table summarises a trajectory: time averages over the last ``window`` of ``[t0, t_end]``."""

    window: Annotated[float, Field(gt=0, le=1)] = 0.5


class SweepSpec(_Strict):
    """A whole sweep (see the module docstring)."""

    name: str = "sweep"
    base: str | dict[str, Any] = "ou"
    set: dict[str, Any] = {}
    grid: GridSpec = GridSpec()
    seeds: PositiveInt | list[NonNegativeInt] = 1
    keep_trajectories: bool = False
    batch: PositiveInt | Literal["auto"] = "auto"
    retries: NonNegativeInt = 2
    summary: SummarySpec = SummarySpec()

    @model_validator(mode="after")
    def _check(self) -> SweepSpec:
        if isinstance(self.seeds, list):
            if not self.seeds:
                raise ValueError("seeds is an empty list; give a count (e.g. 3) or a list of seeds")
            if len(set(self.seeds)) != len(self.seeds):
                raise ValueError(f"seeds has repeated values: {self.seeds}")
        if self.n_points > MAX_POINTS:
            # Counted before any point is built: a 14 kB sweep file may describe a million points.
            raise ValueError(
                f"the sweep has {self.n_points:,} points (grid x seeds), more than the {MAX_POINTS:,} one sweep may "
                "have; split it into several sweeps"
            )
        return self

    @property
    def n_points(self) -> int:
        """``product x zip x seeds``: the number of points, computed without building them."""
        n = math.prod(len(v) for v in self.grid.product.values())
        n *= len(next(iter(self.grid.zip.values()))) if self.grid.zip else 1
        return n * (len(self.seeds) if isinstance(self.seeds, list) else int(self.seeds))

    @property
    def seed_list(self) -> list[int]:
        return list(range(self.seeds)) if isinstance(self.seeds, int) else list(self.seeds)

    @property
    def parameters(self) -> list[str]:
        """The swept dotted keys, in grid order (product first, then zip)."""
        return list(self.grid.product) + list(self.grid.zip)


#: Most points one sweep may have (grid x seeds); checked from the counts before any point is built.
MAX_POINTS = 100_000


@dataclass(frozen=True)
class SweepPoint:
    """One simulation of a sweep: its grid ``params``, ``seed`` and full validated run ``config``."""

    index: int
    params: dict[str, Any]
    seed: int
    config: dict[str, Any]

    @property
    def id(self) -> str:
        return point_id(self.config)


def point_id(config: dict[str, Any]) -> str:
    """A content hash of a full run config (16 hex digits): equal configs are the same point."""
    blob = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def parse_sweep(data: Any, source: str = "") -> SweepSpec:
    """Validate a sweep mapping; raises :class:`ConfigError` naming the offending field."""
    if not isinstance(data, dict):
        raise ConfigError(f"invalid sweep file {source}: the top level must be a mapping, got {type(data).__name__}.")
    try:
        return SweepSpec.model_validate(data)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, source, kind="sweep file")) from None


def load_sweep(path: str | os.PathLike) -> tuple[SweepSpec, Path]:
    """Read and validate a sweep YAML file; returns the spec and the folder relative paths refer to."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"sweep file {str(p)!r} does not exist.")
    if not p.is_file():
        raise ConfigError(f"sweep file {str(p)!r} is not a file (a folder or a device); give a YAML file.")
    data = read_yaml_file(p, "sweep file")
    return parse_sweep(data, f"{str(p)!r}"), p.resolve().parent


def base_config(spec: SweepSpec, root: Path | None = None) -> RunConfig:
    """The base run config: a preset, a config file (relative to ``root``) or an inline mapping."""
    if isinstance(spec.base, dict):
        return parse_config(copy.deepcopy(spec.base), "in the sweep's 'base' mapping")
    if spec.base in PRESETS:
        return preset_config(spec.base)
    p = Path(spec.base)
    if not p.is_absolute() and root is not None:
        p = root / p
    if not p.is_file():
        raise ConfigError(
            f"sweep field 'base': {spec.base!r} is neither a preset ({', '.join(PRESETS)}) nor an existing config "
            f"file (looked for {str(p)!r})."
        )
    return load_config(p)


def _override(key: str, value: Any) -> str:
    # JSON is valid YAML, which apply_overrides parses back into the same value.
    return f"{key}={json.dumps(value)}"


def sweep_points(
    spec: SweepSpec, root: Path | None = None, progress: Callable[[int, int], None] | None = None
) -> list[SweepPoint]:
    """Every point of the sweep (``product x zip x seeds``, at most :data:`MAX_POINTS`), each config
    validated; ``progress(k, n)`` is called as points are built (validation of many points takes time)."""
    base = base_config(spec, root)
    if spec.set:
        base = _apply(base, spec.set, "field 'set'")
    prod_keys = list(spec.grid.product)
    zip_keys = list(spec.grid.zip)
    prod = list(itertools.product(*(spec.grid.product[k] for k in prod_keys)))
    zipped = list(zip(*(spec.grid.zip[k] for k in zip_keys))) if zip_keys else [()]
    points: list[SweepPoint] = []
    for pv in prod:
        for zv in zipped:
            params = dict(zip(prod_keys, pv)) | dict(zip(zip_keys, zv))
            cfg = _apply(base, params, f"grid point {params}")
            for seed in spec.seed_list:
                full = cfg.model_copy(update={"seed": seed}).model_dump(mode="json")
                points.append(SweepPoint(len(points), params, seed, full))
                if progress is not None and len(points) % 100 == 0:
                    progress(len(points), spec.n_points)
    ids = [p.id for p in points]
    if len(set(ids)) != len(ids):
        raise ConfigError(
            "two sweep points have the same config (a grid list repeats a value, or a grid key does not change the "
            "config); make every point distinct."
        )
    return points


def _apply(cfg: RunConfig, values: dict[str, Any], where: str) -> RunConfig:
    try:
        return apply_overrides(cfg, [_override(k, v) for k, v in values.items()])
    except ConfigError as e:
        msg = str(e).replace("invalid config after overrides: ", "")
        raise ConfigError(f"invalid sweep {where}: {msg}") from None
