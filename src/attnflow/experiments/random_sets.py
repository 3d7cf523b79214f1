"""``attnflow reproduce NAME --random-sets K --seed S``: the predictions at parameter sets nobody chose.

Set ``k`` of ``K`` draws its parameters from :data:`RANGES` with ``numpy.random.default_rng([S, k])``
(so one set can be rerun alone: the same ``S`` and ``k`` give the same draw), turns them into ``set``
overrides of the experiment's ``--quick`` parameters and runs the experiment. Every prediction is
counted over the sets: passed (with its control rejected) or not, and each failure is listed with its
set and the experiment's own explanation. Nothing is tuned per set: the criteria are the ones every
run uses, relative to scales measured in the same run.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np

from attnflow.experiments.common import ExperimentResult, to_jsonable

#: The documented ranges (docs/reproduce.md). ``U[a, b]``: uniform; ``logU[a, b]``: log-uniform; a list:
#: one of its entries. ``d`` is drawn first, in 2..8, and sets the sphere ``S^(d-1)`` of every experiment.
RANGES: dict[str, dict[str, str]] = {
    "common": {"d": "integer in 2..8"},
    "ou/oscillating": {
        "heads.spectrum": "d eigenvalues, each U[0.5, 3], sorted decreasing",
        "heads.variety": "U[0, 0.5]",
        "heads.count": "[8, 16, 32]",
        "ou.rate": "logU[0.5, 2]",
        "ou.sigma": "U[0.1, 0.5]",
        "ou.init_spread": "U[1, 3]",
        "oscillating.amplitude": "U[1, 3]",
        "oscillating.omega": "logU[0.5, 2]",
    },
    "heads": {
        "tokens.init": "[cap, uniform] (the cloud)",
        "heads.beta": "U[1, 3]",
        "heads.counts": "[H0, 2 H0, 4 H0], H0 in [16, 32]",
        "weights.rate": "logU[0.5, 2]",
        "weights.sigma": "U[0.3, 0.8]",
    },
    "edi": {
        "heads.beta": "U[1, 3]",
        "heads.count": "[4, 8]",
        "ou.rate": "logU[0.5, 2]",
        "ou.sigma": "U[0.1, 0.8]",
        "oscillating.amplitude": "U[1, 3]",
        "oscillating.omega": "logU[0.5, 2]",
    },
    "stability": {
        "heads.beta": "U[0.5, 2]",
        "heads.count": "[4, 8]",
        "weights.rate": "logU[0.5, 2]",
        "weights.sigma": "U[0.1, 0.5]",
    },
}


def _u(rng: np.random.Generator, a: float, b: float) -> float:
    return round(float(rng.uniform(a, b)), 3)


def _logu(rng: np.random.Generator, a: float, b: float) -> float:
    return round(float(math.exp(rng.uniform(math.log(a), math.log(b)))), 3)


def draw(name: str, rng: np.random.Generator) -> list[str]:
    """One parameter set for experiment ``name`` as ``key=value`` overrides (see :data:`RANGES`)."""
    d = int(rng.integers(2, 9))
    if name in ("ou", "oscillating"):
        spec = sorted((_u(rng, 0.5, 3.0) for _ in range(d)), reverse=True)
        return [
            f"heads.spectrum={spec}",
            f"heads.variety={_u(rng, 0.0, 0.5)}",
            f"heads.count={int(rng.choice([8, 16, 32]))}",
            f"ou.rate={_logu(rng, 0.5, 2.0)}",
            f"ou.sigma={_u(rng, 0.1, 0.5)}",
            f"ou.init_spread={_u(rng, 1.0, 3.0)}",
            f"oscillating.amplitude={_u(rng, 1.0, 3.0)}",
            f"oscillating.omega={_logu(rng, 0.5, 2.0)}",
        ]
    if name == "heads":
        h0 = int(rng.choice([16, 32]))
        return [
            f"tokens.d={d}",
            f"tokens.init={rng.choice(['cap', 'uniform'])}",
            f"heads.beta={_u(rng, 1.0, 3.0)}",
            f"heads.counts={[h0, 2 * h0, 4 * h0]}",
            f"weights.rate={_logu(rng, 0.5, 2.0)}",
            f"weights.sigma={_u(rng, 0.3, 0.8)}",
        ]
    if name == "edi":
        return [
            f"tokens.d={d}",
            f"heads.beta={_u(rng, 1.0, 3.0)}",
            f"heads.count={int(rng.choice([4, 8]))}",
            f"ou.rate={_logu(rng, 0.5, 2.0)}",
            f"ou.sigma={_u(rng, 0.1, 0.8)}",
            f"oscillating.amplitude={_u(rng, 1.0, 3.0)}",
            f"oscillating.omega={_logu(rng, 0.5, 2.0)}",
        ]
    if name in ("stability-input", "stability-weights"):
        return [
            f"tokens.d={d}",
            f"heads.beta={_u(rng, 0.5, 2.0)}",
            f"heads.count={int(rng.choice([4, 8]))}",
            f"weights.rate={_logu(rng, 0.5, 2.0)}",
            f"weights.sigma={_u(rng, 0.1, 0.5)}",
        ]
    raise KeyError(name)


@dataclass
class RandomSets:
    """Pass counts per prediction over ``K`` random parameter sets, and every failure with its set."""

    name: str
    k: int
    seed: int
    sets: list[dict[str, Any]] = field(default_factory=list)  # per set: experiment -> overrides, verdicts
    rows: dict[str, dict[str, Any]] = field(default_factory=dict)  # prediction key -> counts
    seconds: float = 0.0
    ranges: dict[str, Any] = field(default_factory=lambda: RANGES)  # the documented ranges the sets come from

    @property
    def passed(self) -> bool:
        return all(r["passed"] == r["runs"] for r in self.rows.values())

    def to_json(self) -> dict[str, Any]:
        return to_jsonable(
            {
                "experiment": self.name,
                "random_sets": self.k,
                "seed": self.seed,
                "ranges": self.ranges,
                "predictions": self.rows,
                "sets": self.sets,
                "passed": self.passed,
                "seconds": round(self.seconds, 1),
            }
        )

    def markdown(self) -> str:
        lines = [
            f"# attnflow reproduce {self.name} --random-sets {self.k} --seed {self.seed}\n",
            f"{self.k} parameter sets drawn from the documented ranges (docs/reproduce.md), each run with the "
            f"--quick sizes; {self.seconds:.0f} s in all.\n",
            "| prediction | passed | min margin |",
            "|---|---|---|",
        ]
        for key, r in self.rows.items():
            lines.append(f"| {key.replace('|', '/')} | {r['passed']}/{r['runs']} | {r['min_margin']:.2g} |")
        fails = [(s["index"], f) for s in self.sets for f in s["failures"]]
        if fails:
            lines.append("\n## Failures and why\n")
            lines += [f"- set {i} ({', '.join(f['overrides'])}): **{f['prediction']}**: {f['why']}" for i, f in fails]
        return "\n".join(lines) + "\n"


def _key(res: ExperimentResult, i: int) -> str:
    """``NAME #i: claim``: the statement without its parenthetical asides, which name the set's parameters
    (``OU weights (base: d 5, beta 1.3, ...): ...``), so that one prediction keeps one row over the sets."""
    claim = re.sub(r"\s*\([^()]*\)", "", res.predictions[i].statement)
    return f"{res.name} #{i + 1}: {claim[:90]}"


def run_random_sets(
    name: str,
    k: int,
    seed: int,
    run: Callable[[str, list[str]], ExperimentResult],
    names: list[str],
    out: Path | None = None,
    on_set: Callable[[int, str, ExperimentResult], None] | None = None,
    draw_set: Callable[[str, np.random.Generator], list[str]] = draw,
    ranges: dict[str, Any] | None = None,
) -> RandomSets:
    """Run experiments ``names`` at ``k`` random sets; ``run(name, overrides)`` runs one experiment.
    ``draw_set(name, rng)``: one set's overrides (default: the built-ins' :func:`draw`), ``ranges`` what
    ``random_sets.json`` documents them as (default :data:`RANGES`)."""
    start = time.perf_counter()
    rs = RandomSets(name, k, seed, ranges=RANGES if ranges is None else ranges)
    for i in range(k):
        entry: dict[str, Any] = {"index": i, "experiments": {}, "failures": []}
        for n in names:
            overrides = draw_set(n, np.random.default_rng([seed, i]))
            res = run(n, overrides)
            entry["experiments"][n] = {
                "overrides": overrides,
                "statements": [p.statement for p in res.predictions],
                "verdicts": [p.verdict_text for p in res.predictions],
                "margins": [p.margin for p in res.predictions],
                "controls": [p.control_text for p in res.predictions],
                # The measured values (and, for heads, the seed batches used): a failure is explained from
                # them without rerunning the set.
                "measured": res.headline,
            }
            for j, p in enumerate(res.predictions):
                row = rs.rows.setdefault(_key(res, j), {"runs": 0, "passed": 0, "min_margin": math.inf})
                row["runs"] += 1
                row["passed"] += int(p.ok)
                if p.margin is not None and math.isfinite(p.margin):
                    row["min_margin"] = min(row["min_margin"], p.margin)
                if not p.ok:
                    entry["failures"].append(
                        {
                            "experiment": n,
                            "prediction": _key(res, j),
                            "verdict": p.verdict_text,
                            "overrides": overrides,
                            "why": p.explanation or "no explanation recorded",
                        }
                    )
            if on_set:
                on_set(i, n, res)
            for fig in res.figures.values():  # K sets of figures would otherwise stay open to the end
                plt.close(fig)
        rs.sets.append(entry)
        if out is not None:  # written after every set, so an interrupted run keeps what it measured
            rs.seconds = time.perf_counter() - start
            out.mkdir(parents=True, exist_ok=True)
            (out / "random_sets.json").write_text(json.dumps(rs.to_json(), indent=2))
            (out / "report.md").write_text(rs.markdown())
    rs.seconds = time.perf_counter() - start
    return rs
