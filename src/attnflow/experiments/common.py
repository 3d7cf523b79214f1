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
from attnflow.io.store import atomic_folder, git_commit, write_dataset


@dataclass
class Prediction:
    """One prediction of docs/model.md checked on numbers: ``passed = criterion(measured)``."""

    experiment: str
    statement: str
    measured: str
    criterion: str
    passed: bool


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

    @property
    def passed(self) -> bool:
        return all(p.passed for p in self.predictions)


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
            fig.savefig(figdir / f"{stem}.png", dpi=120)
            fig.savefig(figdir / f"{stem}.pdf")
            plt.close(fig)
        if result.dataset is not None:
            write_dataset(result.dataset, tmp / "dataset.zarr")
        (tmp / "configs.yaml").write_text(yaml.safe_dump(to_jsonable(result.configs), sort_keys=False))
        (tmp / "config.yaml").write_text(
            yaml.safe_dump({"experiment": result.name, "seed": seed, "quick": quick}, sort_keys=False)
        )
        payload = {
            result.name: to_jsonable(result.headline),
            "predictions": [asdict(p) for p in result.predictions],
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
