"""``attnflow reproduce``: the paper's numerical predictions (docs/model.md), one command each.

Each experiment returns an :class:`~attnflow.experiments.common.ExperimentResult` and is written as a
run folder with ``results.json``; ``all`` runs every one and writes ``report.md`` / ``report.html``
listing each prediction, the measured number and PASS/FAIL.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from attnflow.experiments.common import ExperimentResult, to_jsonable, write_experiment
from attnflow.experiments.edi import experiment_edi
from attnflow.experiments.heads import experiment_heads
from attnflow.experiments.relaxation import experiment_oscillating, experiment_ou
from attnflow.experiments.report import write_reproduce_report
from attnflow.experiments.stability import experiment_stability_input, experiment_stability_weights

EXPERIMENTS: dict[str, Callable[..., ExperimentResult]] = {
    "ou": experiment_ou,
    "oscillating": experiment_oscillating,
    "heads": experiment_heads,
    "edi": experiment_edi,
    "stability-input": experiment_stability_input,
    "stability-weights": experiment_stability_weights,
}
NAMES = (*EXPERIMENTS, "all")


def run_experiment(name: str, *, quick: bool, seed: int, full: bool = False) -> ExperimentResult:
    if name not in EXPERIMENTS:
        raise ValueError(f"unknown experiment {name!r}; choose one of {', '.join(NAMES)}")
    fn = EXPERIMENTS[name]
    return fn(quick, seed, full=full) if name == "heads" else fn(quick, seed)


def reproduce(
    name: str,
    *,
    out: str | Path,
    quick: bool = False,
    seed: int = 0,
    full: bool = False,
    on_done: Callable[[ExperimentResult], None] | None = None,
) -> list[ExperimentResult]:
    """Run experiment ``name`` (or ``"all"``) and write its folder(s) under ``out``.

    A single experiment writes ``out`` itself; ``all`` writes ``out/NAME`` for each experiment plus
    ``out/results.json``, ``out/report.md`` and ``out/report.html``.
    """
    out = Path(out)
    names = list(EXPERIMENTS) if name == "all" else [name]
    if name not in NAMES:
        raise ValueError(f"unknown experiment {name!r}; choose one of {', '.join(NAMES)}")
    results = []
    for n in names:
        res = run_experiment(n, quick=quick, seed=seed, full=full)
        write_experiment(res, out / n if name == "all" else out, seed=seed, quick=quick)
        results.append(res)
        if on_done:
            on_done(res)
    if name == "all":
        out.mkdir(parents=True, exist_ok=True)
        combined: dict[str, Any] = {
            r.name: {**to_jsonable(r.headline), "passed": r.passed, "seconds": round(r.seconds, 1)} for r in results
        }
        combined["passed"] = all(r.passed for r in results)
        (out / "results.json").write_text(json.dumps(to_jsonable(combined), indent=2))
        write_reproduce_report(
            results, out, quick=quick, seed=seed, created=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        )
    return results
