"""Plateau durations against ``beta`` (and ``H``): many small adaptive runs, one staircase each.

For every ``(beta, H, seed)``: ``n`` tokens uniform on ``S^{d-1}`` (the seed), heads ``A_h = beta I``
(``identity``) or ``beta`` times the project's GOE preset (``goe``, drawn with the seed), integrated with
``dopri5`` on log-spaced save grids (one segment per decade, ``saves`` saves each, so that a run to
``t = 1e4`` costs a few hundred steps on its plateaus), then :func:`attnflow.analysis.metastability.detect_plateaus`
and :func:`attnflow.analysis.stationary.classify_stationary` of the final state.

The *first metastable plateau* of a run is its first plateau entered from motion that is either closed
(left again: its duration is measured) or censored at a final state that is not a stationary minimiser
(a saddle, or clusters still creeping together at ``t_end``: its duration is a lower bound). A run that
goes straight to a minimiser has none.
Per ``(beta, H)``: the geometric mean of the measured durations with a bootstrap 95% interval over
seeds; censored and plateau-free seeds are counted, not averaged in. The trend: the least-squares slope
of ``log10(duration)`` against ``beta`` (censored seeds at their lower bound, which can only flatten it),
with a stratified bootstrap interval over seeds.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from attnflow.analysis.metastability import Staircase, detect_plateaus
from attnflow.analysis.stationary import classify_stationary
from attnflow.core import tokens
from attnflow.core.errors import InputError
from attnflow.core.figures import FIGURE_DPI
from attnflow.core.heads import goe_heads, identity_heads
from attnflow.solve.simulation import simulate

HEADS_KINDS = ("identity", "goe")
#: Bootstrap resamples for every interval.
BOOTSTRAP = 2000


def log_segments(t_end: float, first: float = 1.0) -> list[tuple[float, float]]:
    """``[(0, first), (first, 10 first), ...]`` up to ``t_end``: one segment per decade."""
    edges = [0.0]
    b = first
    while b < t_end:
        edges.append(b)
        b *= 10.0
    edges.append(float(t_end))
    return list(zip(edges[:-1], edges[1:]))


def simulate_log(
    x0: np.ndarray,
    A: np.ndarray,
    *,
    model: str = "gf",
    t_end: float,
    saves: int = 100,
    first: float = 1.0,
    rtol: float = 1e-8,
    atol: float = 1e-10,
) -> dict[str, np.ndarray]:
    """``dopri5`` from ``t = 0`` to ``t_end`` with ``saves`` evenly spaced saves per decade (constant heads
    ``A``): ``t``, ``energy``, ``slope``, ``clusters`` and the final tokens ``x_end``."""
    x = np.asarray(x0, dtype=np.float64)
    parts: dict[str, list[np.ndarray]] = {"t": [], "energy": [], "slope": [], "clusters": []}
    for i, (t0, t1) in enumerate(log_segments(t_end, first)):
        h = (t1 - t0) / saves
        traj = simulate(
            x, A, model=model, t0=t0, t_end=t1, dt=h, save_every=1, method="dopri5", rtol=rtol, atol=atol,
            record_steps=False, dt_max=h,
        )  # fmt: skip
        keep = slice(0 if i == 0 else 1, None)  # the segment's first save repeats the previous last one
        parts["t"].append(np.asarray(traj.t)[keep])
        for name in ("energy", "slope", "clusters"):
            parts[name].append(np.asarray(traj.diagnostics[name])[keep])
        x = np.asarray(traj.x[-1], dtype=np.float64)
    out = {k: np.concatenate(v) for k, v in parts.items()}
    out["x_end"] = x
    return out


@dataclass(frozen=True)
class RunRecord:
    """One ``(beta, H, seed)`` run: its first metastable plateau and what it ended at."""

    beta: float
    H: int
    seed: int
    plateau_start: float | None
    plateau_end: float | None
    duration: float | None  # None: no metastable plateau
    censored: bool  # the duration is a lower bound (still on the plateau at t_end)
    plateau_clusters: int | None  # clusters on the first metastable plateau
    plateaus: int  # closed plateaus in the run
    merges: int
    clusters_end: int
    end_kind: str  # minimiser or saddle (stationary ends), moving (not yet stationary), unknown
    end_index: int | None
    staircase: Staircase = field(repr=False, compare=False)

    def row(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "staircase"}


def first_metastable(st: Staircase, end_kind: str) -> tuple[float, float, bool, int | None] | None:
    """``(start, end, censored, clusters)`` of the first plateau entered from motion that is closed, or censored at an
    end that is not a stationary minimiser (a saddle, or still moving); ``None`` when the run has none."""
    for p in st.plateaus:
        if p.from_start:
            continue
        if p.closed:
            return p.start, p.end, False, p.clusters
        if p.censored and end_kind != "minimiser":
            return p.start, p.end, True, p.clusters
        return None
    return None


def heads_for(kind: str, beta: float, H: int, d: int, seed: int) -> np.ndarray:
    """The heads of one run: ``beta I`` (``identity``) or ``beta`` times GOE matrices (``goe``, seeded)."""
    if kind == "identity":
        return identity_heads(H, d, beta)
    if kind == "goe":
        return goe_heads(H, d, beta, seed=seed)
    raise InputError(f"heads kind must be one of {HEADS_KINDS}; got {kind!r}")


def run_one(
    beta: float, H: int, seed: int, *, n: int, d: int, t_end: float, heads_kind: str, model: str, saves: int,
    rtol: float, atol: float, rel_rate: float,
) -> RunRecord:  # fmt: skip
    """Simulate one ``(beta, H, seed)``, detect its staircase, classify its end (:class:`RunRecord`)."""
    A = heads_for(heads_kind, beta, H, d, seed)
    x0 = tokens.uniform(n, d, seed=seed)
    s = simulate_log(x0, A, model=model, t_end=t_end, saves=saves, rtol=rtol, atol=atol)
    slope = s["slope"] if model == "gf" else None  # -dF/dt = |dF|^2 along gf
    st = detect_plateaus(s["t"], s["energy"], slope, s["clusters"], rel_rate=rel_rate)
    try:
        end = classify_stationary(s["x_end"], A, model=model)
        end_kind, end_index = (end.kind if end.stationary else "moving"), end.index
    except InputError:
        end_kind, end_index = "unknown", None
    first = first_metastable(st, end_kind)
    return RunRecord(
        beta=float(beta),
        H=int(H),
        seed=int(seed),
        plateau_start=None if first is None else first[0],
        plateau_end=None if first is None else first[1],
        duration=None if first is None else first[1] - first[0],
        censored=False if first is None else first[2],
        plateau_clusters=None if first is None else first[3],
        plateaus=len(st.closed),
        merges=len(st.merges),
        clusters_end=int(s["clusters"][-1]),
        end_kind=end_kind,
        end_index=end_index,
        staircase=st,
    )


def _geomean_ci(values: np.ndarray, rng: np.random.Generator) -> tuple[float, float, float]:
    logs = np.log10(values)
    if len(logs) == 0:
        return math.nan, math.nan, math.nan
    if len(logs) == 1:  # one seed: a value, no interval
        return float(10 ** logs[0]), math.nan, math.nan
    boots = rng.choice(logs, size=(BOOTSTRAP, len(logs)), replace=True).mean(axis=1)
    lo, hi = np.percentile(boots, [2.5, 97.5])
    return float(10 ** logs.mean()), float(10**lo), float(10**hi)


def _slope(betas: np.ndarray, logs: np.ndarray) -> float:
    if len(np.unique(betas)) < 2:
        return math.nan
    return float(np.polyfit(betas, logs, 1)[0])


@dataclass
class PlateauStudy:
    """Every run's record, the per-``(beta, H)`` summary with bootstrap intervals, and the trend in ``beta``."""

    records: list[RunRecord]
    settings: dict[str, Any]
    summary: list[dict[str, Any]] = field(default_factory=list)
    trend: dict[int, dict[str, float]] = field(default_factory=dict)

    def compute(self, seed: int = 0) -> PlateauStudy:
        rng = np.random.default_rng(seed)
        self.summary = []
        for beta, H in sorted({(r.beta, r.H) for r in self.records}):
            group = [r for r in self.records if r.beta == beta and r.H == H]
            measured = np.array([r.duration for r in group if r.duration is not None and not r.censored])
            gm, lo, hi = _geomean_ci(measured, rng)
            self.summary.append(
                {
                    "beta": beta,
                    "H": H,
                    "seeds": len(group),
                    "measured": len(measured),
                    "censored": sum(r.censored for r in group),
                    "no_plateau": sum(r.duration is None for r in group),
                    "duration_geomean": gm,
                    "ci_low": lo,
                    "ci_high": hi,
                    "censored_min": min((r.duration for r in group if r.censored and r.duration), default=math.nan),
                    "ended_saddle": sum(r.end_kind == "saddle" for r in group),
                }
            )
        self.trend = {}
        for H in sorted({r.H for r in self.records}):
            rows = [r for r in self.records if r.H == H and r.duration is not None and r.duration > 0]
            if not rows:
                continue
            b = np.array([r.beta for r in rows])
            y = np.log10(np.array([r.duration for r in rows], dtype=np.float64))
            slope = _slope(b, y)
            boots = []
            strata = [np.nonzero(b == v)[0] for v in np.unique(b)]
            for _ in range(BOOTSTRAP):
                idx = np.concatenate([rng.choice(s, size=len(s), replace=True) for s in strata])
                boots.append(_slope(b[idx], y[idx]))
            finite = np.array([v for v in boots if math.isfinite(v)])
            lo, hi = np.percentile(finite, [2.5, 97.5]) if len(finite) else (math.nan, math.nan)
            self.trend[H] = {"slope": slope, "ci_low": float(lo), "ci_high": float(hi), "runs": len(rows)}
        return self

    def verdict(self, H: int) -> str:
        """``grows`` when the trend's interval is above 0, ``shrinks`` below, else ``undecided``."""
        tr = self.trend.get(H)
        if tr is None or not math.isfinite(tr["ci_low"]):
            return "undecided"
        return "grows" if tr["ci_low"] > 0 else ("shrinks" if tr["ci_high"] < 0 else "undecided")


def plateau_study(
    betas: Sequence[float],
    *,
    heads: Sequence[int] = (1,),
    seeds: int = 8,
    n: int = 16,
    d: int = 2,
    t_end: float = 1e3,
    heads_kind: str = "identity",
    model: str = "gf",
    saves: int = 100,
    rtol: float = 1e-8,
    atol: float = 1e-10,
    rel_rate: float = 0.1,
    progress: Callable[[int, int], None] | None = None,
) -> PlateauStudy:
    """Run every ``(beta, H, seed)`` (seeds ``0 .. seeds-1``) and summarise (module docstring)."""
    betas = [float(b) for b in betas]
    if not betas or not all(math.isfinite(b) and b > 0 for b in betas):
        raise InputError(f"betas must be positive numbers; got {betas}")
    if not heads or not all(int(h) >= 1 for h in heads):
        raise InputError(f"heads must be positive integers; got {list(heads)}")
    if seeds < 1 or n < 2 or d < 2:
        raise InputError(f"need seeds >= 1, n >= 2 tokens and d >= 2; got seeds={seeds}, n={n}, d={d}")
    if not (math.isfinite(t_end) and t_end > 0) or saves < 10:
        raise InputError(f"t_end must be > 0 and saves >= 10; got t_end={t_end}, saves={saves}")
    if heads_kind not in HEADS_KINDS:
        raise InputError(f"heads kind must be one of {HEADS_KINDS}; got {heads_kind!r}")
    if model not in ("gf", "usa", "mha"):
        raise InputError(f"model must be gf, usa or mha; got {model!r}")
    jobs = [(b, int(h), s) for b in betas for h in heads for s in range(seeds)]
    records = []
    for k, (b, h, s) in enumerate(jobs):
        records.append(
            run_one(
                b,
                h,
                s,
                n=n,
                d=d,
                t_end=t_end,
                heads_kind=heads_kind,
                model=model,
                saves=saves,
                rtol=rtol,
                atol=atol,
                rel_rate=rel_rate,
            )  # fmt: skip
        )
        if progress is not None:
            progress(k + 1, len(jobs))
    settings = {
        "betas": betas, "heads": [int(h) for h in heads], "seeds": seeds, "n": n, "d": d, "t_end": t_end,
        "heads_kind": heads_kind, "model": model, "saves_per_decade": saves, "rtol": rtol, "atol": atol,
        "rel_rate": rel_rate,
    }  # fmt: skip
    return PlateauStudy(records, settings).compute()


def _md_table(rows: list[dict[str, Any]]) -> str:
    cols = list(rows[0])
    fmt = lambda v: f"{v:.4g}" if isinstance(v, float) else str(v)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(r[c]) for c in cols) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def plot_study(study: PlateauStudy, path: Path) -> Path:
    """Duration of the first metastable plateau against ``beta``: seeds as points (censored: triangles at
    their lower bound), geometric means with bootstrap 95% intervals, one colour per ``H``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = study.settings
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    all_d = [r.duration for r in study.records if r.duration]
    for i, H in enumerate(sorted({r.H for r in study.records})):
        col = f"C{i}"
        rs = [r for r in study.records if r.H == H and r.duration]
        jitter = lambda r: r.beta * (1 + 0.02 * (r.seed - s["seeds"] / 2) / max(s["seeds"], 1))
        ax.scatter([jitter(r) for r in rs if not r.censored], [float(r.duration or 0) for r in rs if not r.censored], s=14,
                   color=col, alpha=0.5, label=f"H = {H}: seeds")  # fmt: skip
        cens = [r for r in rs if r.censored]
        if cens:
            ax.scatter([jitter(r) for r in cens], [float(r.duration or 0) for r in cens], marker="^", s=24, color=col,
                       alpha=0.7, label=f"H = {H}: censored (lower bound)")  # fmt: skip
        rows = [row for row in study.summary if row["H"] == H and row["measured"]]
        if rows:
            b = np.array([row["beta"] for row in rows])
            g = np.array([row["duration_geomean"] for row in rows])
            err = np.nan_to_num(np.array([[row["duration_geomean"] - row["ci_low"] for row in rows],
                                          [row["ci_high"] - row["duration_geomean"] for row in rows]]))  # fmt: skip
            ax.errorbar(b, g, yerr=err, color=col, marker="o", capsize=4, lw=1.5,
                        label=f"H = {H}: geometric mean, 95% bootstrap CI")  # fmt: skip
    if all_d and max(all_d) / max(min(all_d), 1e-300) > 10:
        ax.set_yscale("log")
    if max(s["betas"]) / min(s["betas"]) >= 10:
        ax.set_xscale("log")
    ax.set_xticks(s["betas"])
    ax.set_xticklabels([f"{b:g}" for b in s["betas"]])
    kind = "A_h = β I" if s["heads_kind"] == "identity" else "A_h = β GOE"
    ax.set_xlabel(f"β  ({kind})")
    ax.set_ylabel("duration of the first metastable plateau (time)")
    ax.set_title(
        f"model {s['model']}, N = {s['n']}, d = {s['d']}, {s['seeds']} seeds, t_end = {s['t_end']:g}", fontsize=10
    )
    ax.legend(fontsize=7)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=FIGURE_DPI)
    plt.close(fig)
    return path


def write_study(study: PlateauStudy, out: Path) -> list[Path]:
    """Write ``runs.csv`` (one row per run), ``summary.csv`` and ``summary.md`` (per ``(beta, H)``, and the
    trend) and ``plateaus.png`` into the new folder ``out`` (written whole, or not at all)."""
    import pandas as pd

    from attnflow.io.store import atomic_folder

    with atomic_folder(out) as tmp:
        pd.DataFrame([r.row() for r in study.records]).to_csv(tmp / "runs.csv", index=False)
        pd.DataFrame(study.summary).to_csv(tmp / "summary.csv", index=False)
        md = [
            "# Plateau durations against beta\n",
            "Settings: " + ", ".join(f"{k} = {v}" for k, v in study.settings.items()) + "\n",
        ]
        md.append(_md_table(study.summary))
        for H, tr in study.trend.items():
            md.append(
                f"\nH = {H}: d log10(duration) / d beta = {tr['slope']:.4g} (95% bootstrap CI {tr['ci_low']:.4g} .. "
                f"{tr['ci_high']:.4g}, {tr['runs']} runs): duration {study.verdict(H)} with beta.\n"
            )
        (tmp / "summary.md").write_text("".join(md))
        plot_study(study, tmp / "plateaus.png")
    return [out / "runs.csv", out / "summary.csv", out / "summary.md", out / "plateaus.png"]
