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

from attnflow.core.errors import Hint
from attnflow.experiments import edi, heads, relax_runs, stability
from attnflow.experiments.common import (
    ExperimentConfigError,
    ExperimentParams,
    ExperimentResult,
    Progress,
    to_jsonable,
    write_experiment,
)
from attnflow.experiments.edi import experiment_edi
from attnflow.experiments.heads import experiment_heads
from attnflow.experiments.oscillating import experiment_oscillating
from attnflow.experiments.ou import experiment_ou
from attnflow.experiments.random_sets import RandomSets, run_random_sets
from attnflow.experiments.report import write_reproduce_report
from attnflow.experiments.stability import experiment_stability_input
from attnflow.experiments.stability_weights import experiment_stability_weights
from attnflow.io.store import mark_folder

EXPERIMENTS: dict[str, Callable[..., ExperimentResult]] = {
    "ou": experiment_ou,
    "oscillating": experiment_oscillating,
    "heads": experiment_heads,
    "edi": experiment_edi,
    "stability-input": experiment_stability_input,
    "stability-weights": experiment_stability_weights,
}
#: Each experiment's parameter model and its defaults (``quick`` or full).
PARAMS: dict[str, type[ExperimentParams]] = {
    "ou": relax_runs.RelaxationParams,
    "oscillating": relax_runs.RelaxationParams,
    "heads": heads.HeadsParams,
    "edi": edi.EdiParams,
    "stability-input": stability.StabilityParams,
    "stability-weights": stability.StabilityParams,
}
_DEFAULTS: dict[str, Callable[[bool], ExperimentParams]] = {
    "ou": relax_runs.default_params,
    "oscillating": relax_runs.default_params,
    "heads": heads.default_params,
    "edi": edi.default_params,
    "stability-input": stability.default_params,
    "stability-weights": stability.default_params,
}
NAMES = (*EXPERIMENTS, "all")


def default_params(name: str, *, quick: bool = False) -> ExperimentParams:
    """The parameter model experiment ``name`` runs with by default (``quick``: small sizes)."""
    if name not in EXPERIMENTS:
        raise ExperimentConfigError(f"unknown experiment {name!r}; choose one of {', '.join(NAMES)}")
    return _DEFAULTS[name](quick)


def default_config(name: str, *, quick: bool = False, full: bool = False) -> dict[str, Any]:
    """:func:`default_params` as a dict (``full``: deprecated, ignored)."""
    return default_params(name, quick=quick).to_dict()


def experiment_config(name: str, *, quick: bool = False, sets: list[str] | None = None) -> dict[str, Any]:
    """The parameters with ``set`` overrides applied and validated (raises :class:`ExperimentConfigError`)."""
    return default_params(name, quick=quick).with_sets(list(sets or [])).to_dict()


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
        raise ExperimentConfigError(f"unknown experiment {name!r}; choose one of {', '.join(NAMES)}")
    if sets and name == "all":
        raise ExperimentConfigError(
            "sets change one experiment's parameters; give its name (e.g. 'heads'), not 'all'.", hint=Hint("sets")
        )
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


def reproduce_random(
    name: str,
    k: int,
    *,
    out: str | Path,
    seed: int = 0,
    progress: Callable[[str], Progress] | None = None,
    on_set: Callable[[int, str, ExperimentResult], None] | None = None,
) -> RandomSets:
    """Run experiment ``name`` (or ``"all"``) at ``k`` random parameter sets (``--quick`` sizes) and write
    ``out/random_sets.json`` and ``out/report.md``: the pass count of every prediction and each failure
    with its set and explanation (:mod:`attnflow.experiments.random_sets`)."""
    if name not in NAMES:
        raise ExperimentConfigError(f"unknown experiment {name!r}; choose one of {', '.join(NAMES)}")
    if k < 1:
        raise ExperimentConfigError(f"random_sets must be at least 1; got {k}")
    names = list(EXPERIMENTS) if name == "all" else [name]

    def run(n: str, overrides: list[str]) -> ExperimentResult:
        return run_experiment(n, quick=True, seed=seed, sets=overrides, progress=progress(n) if progress else None)

    return run_random_sets(name, k, seed, run, names, out=Path(out), on_set=on_set)
