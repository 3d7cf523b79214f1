"""What every ``attnflow reproduce`` experiment shares: predictions, results, figures, folders.

An experiment returns an :class:`ExperimentResult`: headline numbers, a list of
:class:`Prediction` (docs/model.md's statement, the measured number, the criterion, PASS/FAIL),
figures, the exact configs it ran and an optional dataset. :func:`write_experiment` turns it
into a run folder (the core format: ``dataset.zarr``, ``config.yaml``, ``provenance.json`` last
with ``"complete": true``) plus ``results.json``, ``configs.yaml`` and ``figures/*.png|pdf``,
written atomically like every run folder.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any, TypeVar

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import xarray as xr
import yaml
from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt, ValidationError

from attnflow._version import __version__
from attnflow.core.errors import InputError
from attnflow.core.figures import FIGURE_DPI
from attnflow.io.store import atomic_folder, git_commit, write_dataset
from attnflow.verdicts.margins import (  # noqa: F401  (their home is verdicts.margins)
    MIN_MARGIN,
    margin_above,
    margin_below,
    margin_inside,
)
from attnflow.verdicts.stats import local_slopes, loglog_fit  # noqa: F401  (their home is verdicts.stats)


@dataclass
class Prediction:
    """One prediction of docs/model.md checked on numbers: ``passed = criterion(measured)``.

    ``control``: a negative control, a case the prediction does *not* cover, checked by the same
    criterion in the same command; ``control_measured`` its number and ``control_rejected`` whether
    the criterion rejects it (it must: a criterion that passes its control cannot tell anything).

    ``margin``: how far the measured number is from the criterion's threshold, on the passing side, in
    the criterion's own scale (:func:`margin_below`, :func:`margin_above`, :func:`margin_inside`);
    ``control_margin`` the same for the control on the rejecting side. A pass (or a rejection) by less
    than ``min_margin`` does not count: ``passed`` (``control_rejected``) is set to ``False`` and the
    explanation says so. ``model``: the dynamics the prediction ran with, and ``model_reason`` why.
    """

    experiment: str
    statement: str
    measured: str
    criterion: str
    passed: bool
    control: str = ""
    control_measured: str = ""
    control_rejected: bool = False
    #: Why it failed, in physical terms (filled by the experiment when the prediction or its control fails).
    explanation: str = ""
    margin: float | None = None
    control_margin: float | None = None
    min_margin: float = MIN_MARGIN
    model: str = "gf"
    model_reason: str = ""
    #: The criterion could not decide (an interval too wide, too few points): not a PASS, reported as such.
    undecided: bool = False

    def __post_init__(self) -> None:
        self.passed = bool(self.passed)
        self.control_rejected = bool(self.control_rejected)
        if self.passed and self.margin is not None and not self.margin >= self.min_margin:
            self.passed = False
            self.explanation = (
                f"the criterion holds by a margin of {self.margin:.3g}, below the minimum {self.min_margin:g}: "
                "too close to its threshold to count. " + self.explanation
            ).strip()
        if self.control_rejected and self.control_margin is not None and not self.control_margin >= self.min_margin:
            self.control_rejected = False
            self.explanation = (
                f"the control is rejected by a margin of only {self.control_margin:.3g} (minimum "
                f"{self.min_margin:g}). " + self.explanation
            ).strip()

    @property
    def ok(self) -> bool:
        """The prediction holds and its control is rejected."""
        return self.passed and self.control_rejected

    @property
    def verdict(self) -> str:
        if self.undecided:
            return "UNDECIDED"
        if not self.control_rejected:
            return "FAIL (control passes)"
        return "PASS" if self.passed else "FAIL"

    @property
    def verdict_text(self) -> str:
        """The verdict with its margin, e.g. ``PASS (margin 0.42)``."""
        return self.verdict if self.margin is None else f"{self.verdict} (margin {self.margin:.2g})"

    @property
    def control_text(self) -> str:
        state = "rejected" if self.control_rejected else "NOT rejected"
        if self.control_margin is not None:
            state += f", margin {self.control_margin:.2g}"
        return f"rejects: {self.control}, measured {self.control_measured} ({state})"


#: ``progress(done, total, what)``: experiments report their units of work (runs) as they go.
Progress = Callable[[int, int, str], None]


class ExperimentConfigError(InputError):
    """A ``--set`` override that names no parameter of the experiment or has the wrong type."""


Self = TypeVar("Self", bound="ExperimentParams")


class Section(BaseModel):
    """A section of an experiment's parameters (``heads``, ``weights``, ...): strict, like the whole."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class CloudSection(Section):
    """``tokens``: ``n`` tokens on ``S^{d-1}`` (the section of the ``edi`` and ``stability-*`` experiments)."""

    n: PositiveInt = 64
    d: Annotated[int, Field(ge=2)] = 3


class OscillatingSection(Section):
    """``oscillating``: the weights ``A(t)`` oscillate with this amplitude and angular frequency (the section
    of the ``ou``/``oscillating`` and ``edi`` experiments)."""

    amplitude: float = 2.0
    omega: PositiveFloat = 1.0


class ExperimentParams(BaseModel):
    """The shared base of every experiment's parameters: a strict pydantic model that takes ``--set``.

    ``params.with_sets(["heads.beta=3"])`` reads each value as YAML (as ``attnflow run --set`` does),
    puts it at its dotted key and validates the whole again: an unknown key, a wrong type or an
    out-of-range value raises :class:`ExperimentConfigError` in one sentence. ``to_dict()`` is what
    ``configs.yaml`` stores, and ``model_validate`` of it gives the same parameters back.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    @classmethod
    def parse(cls: type[Self], data: Any, where: str = "parameters") -> Self:
        """Validate ``data`` (e.g. a ``configs.yaml``'s ``parameters``), errors in one sentence."""
        try:
            return cls.model_validate(data)
        except ValidationError as e:
            raise ExperimentConfigError(f"{where}: {_one_sentence(e)}") from None

    def with_sets(self: Self, items: list[str]) -> Self:
        """These parameters with ``key.sub=value`` overrides applied and validated."""
        data = self.to_dict()
        for item in items:
            if "=" not in item:
                raise ExperimentConfigError(f"set {item!r} must look like key.subkey=value (e.g. heads.beta=3).")
            key, raw = (s.strip() for s in item.split("=", 1))
            try:
                value = yaml.safe_load(raw)
            except yaml.YAMLError as e:
                raise ExperimentConfigError(
                    f"{key}: the value is not valid YAML ({' '.join(str(e).split())})."
                ) from None
            node, parts = data, key.split(".")
            for i, p in enumerate(parts[:-1]):
                if not isinstance(node.get(p), dict):
                    raise ExperimentConfigError(
                        f"{key}: {'.'.join(parts[: i + 1])!r} is not a section of this experiment's parameters "
                        f"(sections: {', '.join(k for k, v in node.items() if isinstance(v, dict)) or 'none'})."
                    )
                node = node[p]
            if parts[-1] not in node:
                raise ExperimentConfigError(
                    f"{key}: no parameter {parts[-1]!r} here; the parameters are {', '.join(node)}."
                )
            node[parts[-1]] = value
        return type(self).parse(data, "the parameters with " + ", ".join(items) if items else "parameters")


def _one_sentence(e: ValidationError) -> str:
    errs = e.errors()
    parts = []
    for err in errs[:3]:
        loc = ".".join(str(v) for v in err.get("loc", ())) or "(top level)"
        parts.append(f"{loc}: {err.get('msg', 'invalid')} (got {err.get('input')!r})")
    more = f" and {len(errs) - 3} more" if len(errs) > 3 else ""
    return "; ".join(parts) + more + "."


@dataclass
class ExperimentResult:
    name: str
    headline: dict[str, Any]
    predictions: list[Prediction]
    figures: dict[str, Any] = field(default_factory=dict)  # stem -> matplotlib Figure
    configs: list[dict[str, Any]] = field(default_factory=list)
    dataset: xr.Dataset | None = None
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    parameters: dict[str, Any] = field(default_factory=dict)  # the experiment's config (after --set)

    @property
    def passed(self) -> bool:
        """Every prediction holds and every negative control is rejected."""
        return all(p.ok for p in self.predictions)


def to_jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, (np.floating, float)):
        v = float(obj)
        return v if np.isfinite(v) else str(v)
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, np.ndarray):
        return to_jsonable(obj.tolist())
    return obj


def write_experiment(result: ExperimentResult, out: Path, *, seed: int, quick: bool) -> Path:
    """Write ``result`` as the run folder ``out`` (atomically, replacing an older one)."""
    out = Path(out)
    with atomic_folder(out, overwrite=True) as tmp:
        figdir = tmp / "figures"
        figdir.mkdir()
        for stem, fig in result.figures.items():
            fig.savefig(figdir / f"{stem}.png", dpi=FIGURE_DPI)
            fig.savefig(figdir / f"{stem}.pdf")
            plt.close(fig)
        if result.dataset is not None:
            write_dataset(result.dataset, tmp / "dataset.zarr")
        (tmp / "configs.yaml").write_text(
            "# The experiment's parameters (change them with attnflow reproduce NAME --set key=value),\n"
            "# then every run it made.\n"
            + yaml.safe_dump(to_jsonable({"parameters": result.parameters, "runs": result.configs}), sort_keys=False)
        )
        (tmp / "config.yaml").write_text(
            yaml.safe_dump(
                to_jsonable({"experiment": result.name, "seed": seed, "quick": quick, "parameters": result.parameters}),
                sort_keys=False,
            )
        )
        payload = {
            result.name: to_jsonable(result.headline),
            "predictions": [
                {**asdict(p), "verdict": p.verdict, "verdict_text": p.verdict_text} for p in result.predictions
            ],
            "passed": result.passed,
            "seconds": round(result.seconds, 2),
            "notes": result.notes,
        }
        (tmp / "results.json").write_text(json.dumps(to_jsonable(payload), indent=2))
        prov = {
            "attnflow_version": __version__,
            "git_commit": git_commit(),
            "seed": seed,
            "quick": quick,
            "experiment": result.name,
            "wall_time_s": result.seconds,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "complete": True,
        }
        (tmp / "provenance.json").write_text(json.dumps(prov, indent=2))
    return out


def fmt(v: float, digits: int = 3) -> str:
    return f"{v:.{digits}g}"
