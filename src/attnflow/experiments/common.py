"""What every ``attnflow reproduce`` experiment shares: predictions, results, figures, folders.

An experiment returns an :class:`ExperimentResult`: headline numbers, a list of
:class:`Prediction` (docs/model.md's statement, the measured number, the criterion, PASS/FAIL),
figures, the exact configs it ran and an optional dataset. :func:`write_experiment` turns it
into a run folder (the core format: ``dataset.zarr``, ``config.yaml``, ``provenance.json`` last
with ``"complete": true``) plus ``results.json``, ``configs.yaml`` and ``figures/*.png|pdf``,
written atomically like every run folder.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import xarray as xr
import yaml

from attnflow._version import __version__
from attnflow.core.figures import FIGURE_DPI
from attnflow.io.store import atomic_folder, git_commit, write_dataset


@dataclass
class Prediction:
    """One prediction of docs/model.md checked on numbers: ``passed = criterion(measured)``.

    ``control``: a negative control, a case the prediction does *not* cover, checked by the same
    criterion in the same command; ``control_measured`` its number and ``control_rejected`` whether
    the criterion rejects it (it must: a criterion that passes its control cannot tell anything).
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

    @property
    def ok(self) -> bool:
        """The prediction holds and its control is rejected."""
        return self.passed and self.control_rejected

    @property
    def verdict(self) -> str:
        if not self.control_rejected:
            return "FAIL (control passes)"
        return "PASS" if self.passed else "FAIL"

    @property
    def control_text(self) -> str:
        state = "rejected" if self.control_rejected else "NOT rejected"
        return f"rejects: {self.control}, measured {self.control_measured} ({state})"


#: ``progress(done, total, what)``: experiments report their units of work (runs) as they go.
Progress = Callable[[int, int, str], None]


class ExperimentConfigError(ValueError):
    """A ``--set`` override that names no parameter of the experiment or has the wrong type."""


def _coerce(key: str, old: Any, new: Any) -> Any:
    if isinstance(old, bool) or isinstance(new, bool):
        if isinstance(old, bool) and isinstance(new, bool):
            return new
    elif isinstance(old, float) and isinstance(new, (int, float)):
        return float(new)
    elif isinstance(old, int) and isinstance(new, int):
        return new
    elif isinstance(old, str) and isinstance(new, str):
        return new
    elif isinstance(old, list) and isinstance(new, list):
        if old and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in old):
            if not new or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in new):
                raise ExperimentConfigError(f"--set {key}: expected a non-empty list of numbers, got {new!r}.")
            return [float(v) if any(isinstance(o, float) for o in old) else v for v in new]
        return new
    elif isinstance(old, dict) and isinstance(new, dict):
        return new
    raise ExperimentConfigError(
        f"--set {key}: the parameter is a {type(old).__name__} (default {old!r}); got {new!r} ({type(new).__name__})."
    )


def apply_sets(cfg: dict[str, Any], items: list[str]) -> dict[str, Any]:
    """``cfg`` with ``key.sub=value`` overrides applied (values read as YAML, like ``attnflow run --set``).

    Every key must name an existing parameter and keep its type (an int may stand for a float).
    """
    out = copy.deepcopy(cfg)
    for item in items:
        if "=" not in item:
            raise ExperimentConfigError(f"--set {item!r} must look like key.subkey=value (e.g. heads.beta=3).")
        key, raw = (s.strip() for s in item.split("=", 1))
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError as e:
            raise ExperimentConfigError(
                f"--set {key}: the value is not valid YAML ({' '.join(str(e).split())})."
            ) from None
        node, parts = out, key.split(".")
        for i, p in enumerate(parts[:-1]):
            if not isinstance(node.get(p), dict):
                raise ExperimentConfigError(
                    f"--set {key}: {'.'.join(parts[: i + 1])!r} is not a section of this experiment's parameters "
                    f"(sections: {', '.join(k for k, v in node.items() if isinstance(v, dict)) or 'none'})."
                )
            node = node[p]
        if parts[-1] not in node:
            raise ExperimentConfigError(
                f"--set {key}: no parameter {parts[-1]!r} here; the parameters are {', '.join(node)}."
            )
        node[parts[-1]] = _coerce(key, node[parts[-1]], value)
    return out


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
            "predictions": [{**asdict(p), "verdict": p.verdict} for p in result.predictions],
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


def loglog_fit(xs: np.ndarray, ys: np.ndarray) -> tuple[float, float]:
    """Least-squares exponent ``p`` and prefactor ``c`` of ``y = c x^p``."""
    p, logc = np.polyfit(np.log(xs), np.log(ys), 1)
    return float(p), float(np.exp(logc))


def fmt(v: float, digits: int = 3) -> str:
    return f"{v:.{digits}g}"
