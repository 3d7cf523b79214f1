"""``attnflow reproduce``: the paper's numerical predictions (docs/model.md), one command each.

Each experiment has its parameters in a config (:func:`default_config`, printed in the folder's
``configs.yaml``; ``--set key=value`` changes them) and returns an
:class:`~attnflow.experiments.common.ExperimentResult` whose predictions each carry a negative
control checked by the same criterion. Every run writes a run folder with ``results.json`` and
``report.md``; ``all`` also writes the combined ``results.json``, ``report.md`` and ``report.html``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from attnflow.experiments import edi, heads, relaxation, stability
from attnflow.experiments.common import (
    ExperimentConfigError,
    ExperimentResult,
    Progress,
    apply_sets,
    to_jsonable,
    write_experiment,
)
from attnflow.experiments.edi import experiment_edi
from attnflow.experiments.heads import experiment_heads
from attnflow.experiments.relaxation import experiment_oscillating, experiment_ou
from attnflow.experiments.report import write_reproduce_report
from attnflow.experiments.stability import experiment_stability_input, experiment_stability_weights
from attnflow.io.store import mark_folder

EXPERIMENTS: dict[str, Callable[..., ExperimentResult]] = {
    "ou": experiment_ou,
    "oscillating": experiment_oscillating,
    "heads": experiment_heads,
    "edi": experiment_edi,
    "stability-input": experiment_stability_input,
    "stability-weights": experiment_stability_weights,
}
_DEFAULTS: dict[str, Callable[[bool], dict[str, Any]]] = {
    "ou": relaxation.default_config,
    "oscillating": relaxation.default_config,
    "heads": heads.default_config,
    "edi": edi.default_config,
    "stability-input": stability.default_config,
    "stability-weights": stability.default_config,
}
NAMES = (*EXPERIMENTS, "all")


def default_config(name: str, *, quick: bool = False, full: bool = False) -> dict[str, Any]:
    """The parameters experiment ``name`` runs with (``--quick``: small sizes; ``full``: deprecated, ignored)."""
    if name not in EXPERIMENTS:
        raise ValueError(f"unknown experiment {name!r}; choose one of {', '.join(NAMES)}")
    return _DEFAULTS[name](quick)


def experiment_config(name: str, *, quick: bool = False, sets: list[str] | None = None) -> dict[str, Any]:
    """:func:`default_config` with ``--set`` overrides applied (raises :class:`ExperimentConfigError`)."""
    return apply_sets(default_config(name, quick=quick), list(sets or []))


def run_experiment(
    name: str,
    *,
    quick: bool,
    seed: int,
    sets: list[str] | None = None,
    progress: Progress | None = None,
    full: bool = False,
) -> ExperimentResult:
    """Run experiment ``name`` with its config and ``--set`` overrides (``full``: deprecated, ignored)."""
    cfg = experiment_config(name, quick=quick, sets=sets)
    kw: dict[str, Any] = {"seed": seed, "progress": progress}
    if name == "heads":
        kw["user_sets"] = list(sets or [])
        kw["quick"] = quick
    return EXPERIMENTS[name](cfg, **kw)


def reproduce(
    name: str,
    *,
    out: str | Path,
    quick: bool = False,
    seed: int = 0,
    full: bool = False,
    sets: list[str] | None = None,
    on_done: Callable[[ExperimentResult], None] | None = None,
    progress: Callable[[str], Progress] | None = None,
) -> list[ExperimentResult]:
    """Run experiment ``name`` (or ``"all"``) and write its folder(s) under ``out``.

    A single experiment writes ``out`` itself (with its ``report.md``); ``all`` writes ``out/NAME`` for
    each experiment plus ``out/results.json``, ``out/report.md`` and ``out/report.html``.
    ``sets``: ``key=value`` overrides of a single experiment's parameters. ``progress(name)`` returns
    the callback an experiment reports its work to. ``full``: deprecated and ignored (without ``quick``
    the run is the full one).
    """
    if name not in NAMES:
        raise ValueError(f"unknown experiment {name!r}; choose one of {', '.join(NAMES)}")
    if sets and name == "all":
        raise ExperimentConfigError("--set changes one experiment's parameters; give NAME (e.g. heads), not 'all'.")
    out = Path(out)
    names = list(EXPERIMENTS) if name == "all" else [name]
    if sets:
        experiment_config(name, quick=quick, sets=sets)  # fail before any work on a bad override
    results = []
    for n in names:
        res = run_experiment(n, quick=quick, seed=seed, sets=sets, progress=progress(n) if progress else None)
        write_experiment(res, out / n if name == "all" else out, seed=seed, quick=quick)
        results.append(res)
        if on_done:
            on_done(res)
    created = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    if name == "all":
        out.mkdir(parents=True, exist_ok=True)
        combined: dict[str, Any] = {
            r.name: {**to_jsonable(r.headline), "passed": r.passed, "seconds": round(r.seconds, 1)} for r in results
        }
        combined["passed"] = all(r.passed for r in results)
        (out / "results.json").write_text(json.dumps(to_jsonable(combined), indent=2))
        write_reproduce_report(results, out, quick=quick, seed=seed, created=created)
        mark_folder(out, "reproduce")  # every folder attnflow writes carries its manifest (issue 27)
    else:
        write_reproduce_report(results, out, quick=quick, seed=seed, created=created, single=True)
    return results
