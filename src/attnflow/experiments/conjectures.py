"""``attnflow reproduce FILE.py``: the experiments a researcher wrote in a file, run like a built-in.

The file is named on the command line and loaded from that path alone (``importlib``, as pytest loads a
test file it is given; never by scanning a folder). Every ``@attnflow.verdicts.experiment`` it registers
runs at its space's default set, or at ``--random-sets K`` sets drawn with ``default_rng([seed, k])``,
and writes what a built-in writes: per-prediction verdicts with margins and controls, ``results.json``,
``report.md``, figures and the folder's manifest (:func:`reproduce_file`).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import yaml

from attnflow.core.errors import InputError
from attnflow.experiments.common import ExperimentResult, Prediction, write_experiment
from attnflow.experiments.random_sets import RandomSets, run_random_sets
from attnflow.experiments.report import write_reproduce_report
from attnflow.io.store import mark_folder
from attnflow.verdicts import Experiment, collecting
from attnflow.verdicts import Prediction as Claimed


class ConjectureError(InputError):
    """A conjecture file that cannot be run: missing, not Python, defining no experiment, or raising."""


def load_file(path: str | Path) -> list[Experiment]:
    """The experiments registered by executing the Python file at ``path`` (and nothing else)."""
    p = Path(path)
    if p.suffix != ".py":
        raise ConjectureError(f"{p}: a conjecture file is a Python file ending in .py")
    if not p.is_file():
        raise ConjectureError(f"{p}: no such file")
    p = p.resolve()
    mod_name = "attnflow_conjecture_" + hashlib.sha256(str(p).encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(mod_name, p)
    if spec is None or spec.loader is None:
        raise ConjectureError(f"{p}: cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(spec)
    with collecting() as found:
        sys.modules[mod_name] = module  # dataclasses and pickling look their module up by name
        try:
            spec.loader.exec_module(module)
        except Exception as e:
            raise ConjectureError(f"{p}: loading it raised {type(e).__name__}: {e}") from None
        finally:
            sys.modules.pop(mod_name, None)
    if not found:
        raise ConjectureError(
            f"{p} defines no experiment; decorate a function claim(params, seed) with "
            "@attnflow.verdicts.experiment(name, space=..., seeds=...)"
        )
    names = [e.name for e in found]
    if len(set(names)) != len(names):
        raise ConjectureError(f"{p}: two experiments share a name ({', '.join(names)})")
    return found


def _as_report(exp: Experiment, p: Claimed, seed_label: str) -> Prediction:
    """A claimed :class:`attnflow.verdicts.Prediction` as the report's record (verdicts from its criterion)."""
    mv, cv = p.measured_verdict, p.control_verdict
    outcome = p.outcome
    why = ""
    if outcome != "PASS":
        why = f"measured: {mv}; control: {cv}" if cv.outcome != "FAIL" else f"measured: {mv}"
    return Prediction(
        exp.name,
        f"{p.name}{seed_label}",
        f"{p.measured}: {mv.outcome}, margin {mv.margin:.3g} {mv.unit}",
        str(p.criterion),
        outcome == "PASS",
        "the same measurement on the control case",
        f"{p.control}: {cv.outcome}",
        cv.failed,
        explanation=why,
        margin=mv.margin,
        control_margin=-cv.margin,
        min_margin=0.0,  # the criterion's own interval already decided; its margin is stated, not re-thresholded
        undecided=outcome == "UNDECIDED",
    )


def run_experiment_file(exp: Experiment, params: dict[str, Any], seed: int) -> ExperimentResult:
    """Run ``exp`` at ``params`` for each of its seeds (``seed + j``) and collect the verdicts and a figure."""
    start = time.perf_counter()
    preds: list[Prediction] = []
    pairs: list[Claimed] = []
    for j in range(exp.seeds):
        s = seed + j
        try:
            out = exp.run(dict(params), s)
        except Exception as e:
            raise ConjectureError(
                f"experiment {exp.name!r} raised {type(e).__name__}: {e} (parameters {params}, seed {s})"
            ) from None
        label = f" (seed {s})" if exp.seeds > 1 else ""
        preds += [_as_report(exp, p, label) for p in out]
        pairs += out
    headline = {"parameters": params, "seeds": [seed + j for j in range(exp.seeds)]}
    res = ExperimentResult(exp.name, headline, preds, parameters=dict(params))
    if pairs:
        res.figures["verdicts"] = _figure(exp.name, pairs)
    res.notes = [exp.doc] if exp.doc else []
    res.seconds = time.perf_counter() - start
    return res


def _figure(name: str, pairs: list[Claimed]) -> Any:
    """Each prediction's measured and control intervals, one panel each (at most 8)."""
    shown = pairs[:8]
    fig, axes = plt.subplots(len(shown), 1, figsize=(6, 1.2 + 0.9 * len(shown)), squeeze=False)
    for ax, p in zip(axes[:, 0], shown):
        for row, (est, colour) in enumerate(((p.measured, "tab:green"), (p.control, "tab:grey"))):
            lo, hi = est.interval
            if all(math.isfinite(v) for v in (lo, hi, est.value)):
                ax.errorbar([est.value], [row], xerr=[[est.value - lo], [hi - est.value]], fmt="o", color=colour)
        ax.set_yticks([0, 1], ["measured", "control"])
        ax.set_ylim(-0.6, 1.6)
        ax.set_title(f"{p.name[:70]}: {p.outcome}", fontsize=8)
    fig.suptitle(name)
    fig.tight_layout()
    return fig


def _overrides(params: dict[str, Any]) -> list[str]:
    return [f"{k}={json.dumps(v)}" for k, v in params.items()]


def _params(overrides: list[str]) -> dict[str, Any]:
    return {k: yaml.safe_load(v) for k, v in (o.split("=", 1) for o in overrides)}


def reproduce_file(
    path: str | Path,
    *,
    out: str | Path,
    seed: int = 0,
    random_sets: int | None = None,
    on_done: Callable[[ExperimentResult], None] | None = None,
) -> list[ExperimentResult] | RandomSets:
    """Run every experiment of the file at ``path`` and write ``out`` as a built-in does.

    Without ``random_sets``: each experiment at its space's default set; one experiment writes ``out``
    itself, several write ``out/NAME`` each plus the combined ``results.json`` and ``report.md``.
    With ``random_sets = K``: set ``k`` of each experiment is ``space.draw_set(seed, k)``; ``out`` gets
    ``random_sets.json`` (every set's verdicts and margins) and ``report.md``."""
    exps = load_file(path)
    out = Path(out)
    by_name = {e.name: e for e in exps}
    created = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    if random_sets is not None:
        if random_sets < 1:
            raise ConjectureError(f"random_sets must be at least 1; got {random_sets}")

        def draw(n: str, rng: np.random.Generator) -> list[str]:
            return _overrides(by_name[n].space.draw(rng))

        def run(n: str, overrides: list[str]) -> ExperimentResult:
            return run_experiment_file(by_name[n], _params(overrides), seed)

        ranges = {e.name: e.space.describe() for e in exps}
        label = Path(path).name
        rs = run_random_sets(label, random_sets, seed, run, list(by_name), out=out, draw_set=draw, ranges=ranges)
        mark_folder(out, "reproduce")
        return rs
    results = []
    single = len(exps) == 1
    for e in exps:
        res = run_experiment_file(e, e.space.default(), seed)
        write_experiment(res, out if single else out / e.name, seed=seed, quick=False)
        results.append(res)
        if on_done:
            on_done(res)
    out.mkdir(parents=True, exist_ok=True)
    if not single:
        combined: dict[str, Any] = {r.name: {"passed": r.passed, "seconds": round(r.seconds, 2)} for r in results}
        combined["passed"] = all(r.passed for r in results)
        (out / "results.json").write_text(json.dumps(combined, indent=2))
    write_reproduce_report(results, out, quick=False, seed=seed, created=created, single=single)
    mark_folder(out, "reproduce")
    return results
