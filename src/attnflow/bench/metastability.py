"""The metastability benchmark: adaptive steps against fixed-step rk4 through clustering plateaus.

Single head, ``A = beta I``, ``V = I``, model ``mha``, ``N = 64`` tokens uniform on ``S^2``,
``beta = 9``, integrated to ``t = 10^4``: the tokens collapse into a few clusters within ``t ~ 10``,
then sit on metastable plateaus broken by fast merges (Geshkovski, Letrouit, Polyanskiy & Rigollet,
*A mathematical perspective on Transformers*, 2023). The reference final state is ``dopri5`` at
``rtol = 1e-12``; each method must reach it to ``tol = 1e-6`` (max coordinate error). Counted: field
evaluations (the cost that scales with ``N``) and wall time, the integrators of
:mod:`attnflow.schemes.integrators` and the one loop of :mod:`attnflow.solve.loop` on one lean field.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

from attnflow.analysis.diagnostics import count_clusters
from attnflow.config import defaults
from attnflow.core.figures import FIGURE_DPI
from attnflow.core.geometry import project_tangent
from attnflow.core.tokens import uniform
from attnflow.schemes.integrators import ADAPTIVE, INTEGRATORS
from attnflow.solve.controllers import FixedState, PIController
from attnflow.solve.loop import AdaptiveStats, Evaluation, StepFailed, StepState, Trial, integrate
from attnflow.solve.saveat import SaveAt


def mha_identity_field(beta: float) -> Callable[[float, torch.Tensor], torch.Tensor]:
    """``v(x_i) = P_{x_i} sum_j softmax_j(beta <x_i, x_j>) x_j``: model ``mha``, ``A = beta I``, ``V = I``, equal masses."""

    def f(t: float, x: torch.Tensor) -> torch.Tensor:
        p = torch.softmax(beta * (x @ x.T), dim=-1)
        return project_tangent(x, p @ x)

    return f


@dataclass
class Counted:
    """A field that counts its evaluations."""

    f: Callable[[float, torch.Tensor], torch.Tensor]
    calls: int = 0

    def __call__(self, t: float, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.f(t, x)


@dataclass
class AdaptiveRun:
    x: torch.Tensor
    evaluations: int
    seconds: float
    stats: AdaptiveStats
    steps: list[tuple[float, float]] = field(default_factory=list)  # (t, dt) of each accepted step
    clusters: list[tuple[float, int]] = field(default_factory=list)  # (t, count) at the save times


def adaptive_run(
    x0: torch.Tensor, beta: float, t_end: float, rtol: float, atol: float, method: str = "dopri5",
    save_times: list[float] | None = None, cluster_eps: float = defaults.CLUSTER_EPS,
) -> AdaptiveRun:  # fmt: skip
    """Integrate with an embedded pair (FSAL stages reused); records the step sizes and cluster counts."""
    pair = ADAPTIVE[method]
    f = Counted(mha_identity_field(beta))
    ctrl = PIController(rtol, atol, dt0=1e-2, dt_max=t_end).start(t_end, min(pair.order, pair.embedded_order), t_end)
    steps: list[tuple[float, float]] = []
    clusters: list[tuple[float, int]] = []

    def attempt(t: float, y: torch.Tensor, h: float, first: Evaluation | None) -> Trial:
        k1 = f(t, y) if first is None else first.v
        y1, e, k_last = pair.attempt(f, t, y, h, k1=k1)
        return Trial(y1, ctrl.norm(y, y1, e), start=Evaluation(t, k1), end=Evaluation(t + h, k_last))

    class Clusters:
        name = "clusters"

        def on_step(self, state: StepState) -> None:
            if state.save:
                clusters.append((state.t, count_clusters(state.x, cluster_eps)))

    def on_accept(t: float, h: float, hit_break: bool) -> bool:
        steps.append((t, h))
        return False

    stats = AdaptiveStats()
    start = time.perf_counter()
    x = integrate(
        attempt, x0, t=0.0, control=ctrl, saves=SaveAt(times=tuple(sorted(save_times or [t_end]))).start(0.0),
        on_accept=on_accept, observers=[Clusters()], stats=stats,
    )  # fmt: skip
    return AdaptiveRun(x, f.calls, time.perf_counter() - start, stats, steps, clusters)


def rk4_run(x0: torch.Tensor, beta: float, t_end: float, n_steps: int) -> tuple[torch.Tensor, int, float]:
    """Fixed-step rk4 with ``n_steps`` steps: (final state, evaluations, seconds); a run that fails the
    state guard ends in NaN (an infinite error)."""
    f = Counted(mha_identity_field(beta))
    step, dt = INTEGRATORS["rk4"].step, t_end / n_steps
    start = time.perf_counter()
    try:
        x = integrate(
            lambda t, y, h, first: Trial(step(f, t, y, h), 0.0), x0, t=0.0,
            control=FixedState(0.0, dt, n_steps), saves=SaveAt(every=n_steps).start(0.0),
        )  # fmt: skip
    except StepFailed as e:
        x = torch.full_like(e.x, math.nan)
    return x, f.calls, time.perf_counter() - start


def error(x: torch.Tensor, ref: torch.Tensor) -> float:
    e = (x - ref).abs().max()
    return float(e) if bool(torch.isfinite(e)) else math.inf


RTOLS = (1e-6, 5e-7, 2e-7, 1e-7, 5e-8, 2e-8, 1e-8, 5e-9, 2e-9, 1e-9)


def run_metastability(
    *, N: int = 64, beta: float = 9.0, t_end: float = 1e4, tol: float = 1e-6, seed: int = 0,
    methods: tuple[str, ...] = ("bosh3", "dopri5"), rtols: tuple[float, ...] = RTOLS, rk4_start: int = 10_000,
    bisections: int = 3, progress: Callable[[str], None] | None = None,
) -> dict:  # fmt: skip
    """The benchmark; a JSON-ready dict.

    Each adaptive method runs at the loosest ``rtol`` of ``rtols`` (factors of 2-2.5) whose final
    state is within ``tol`` of the reference. rk4 doubles its step count from ``rk4_start`` until it
    is within ``tol``, then bisects the step count ``bisections`` times between the last failing and
    the first passing count: the largest passing step found is within ``2^-bisections`` of the largest
    that passes (in step count).
    """
    say = progress or (lambda s: None)
    torch.set_num_threads(1)
    x0 = torch.from_numpy(uniform(N, 3, seed=seed))
    say("reference: dopri5 at rtol 1e-12 (and 1e-11 to check it)")
    ref = adaptive_run(x0, beta, t_end, 1e-12, 1e-14)
    check = adaptive_run(x0, beta, t_end, 1e-11, 1e-13)
    out: dict = {
        "N": N, "beta": beta, "t_end": t_end, "tol": tol, "threads": torch.get_num_threads(),
        "reference": {"rtol": 1e-12, "evaluations": ref.evaluations, "seconds": ref.seconds,
                      "vs_rtol_1e-11": error(check.x, ref.x)},
        "adaptive": {}, "rk4": [],
    }  # fmt: skip
    for method in methods:
        tried = []
        for rtol in rtols:
            say(f"{method} at rtol {rtol:g}")
            r = adaptive_run(x0, beta, t_end, rtol, rtol * 1e-2, method=method)
            row: dict[str, Any] = {"method": method, "rtol": rtol, "error": error(r.x, ref.x), "evaluations": r.evaluations,
                   "seconds": r.seconds, **r.stats.as_dict()}  # fmt: skip
            tried.append(row)
            if row["error"] <= tol:
                break
        out["adaptive"][method] = tried

    def rk4(n: int) -> dict:
        say(f"rk4 at dt {t_end / n:.4g} ({n} steps)")
        x, ev, sec = rk4_run(x0, beta, t_end, n)
        row = {"dt": t_end / n, "n_steps": n, "error": error(x, ref.x), "evaluations": ev, "seconds": sec}
        out["rk4"].append(row)
        return row

    n, last_fail = rk4_start, None
    while rk4(n)["error"] > tol and n < 64 * rk4_start:
        last_fail, n = n, 2 * n
    passing = n
    if last_fail is not None:
        lo, hi = last_fail, passing
        for _ in range(bisections):
            mid = (lo + hi) // 2
            if rk4(mid)["error"] <= tol:
                hi = mid
            else:
                lo = mid
        passing = hi
    best_rk4 = next((r for r in out["rk4"] if r["n_steps"] == passing and r["error"] <= tol), None)
    out["best_rk4"] = best_rk4
    out["best"] = {}
    for method, tried in out["adaptive"].items():
        ok = tried[-1] if tried and tried[-1]["error"] <= tol else None
        out["best"][method] = ok
        if ok and best_rk4:
            ok["evaluation_ratio"] = best_rk4["evaluations"] / ok["evaluations"]
            ok["time_ratio"] = best_rk4["seconds"] / ok["seconds"]
    return out


def plateau_trace(*, N: int = 64, beta: float = 9.0, t_end: float = 1e4, rtol: float = 1e-8, seed: int = 0) -> dict:
    """Cluster count and accepted step size over log time (for the docs figure)."""
    torch.set_num_threads(1)  # N = 64: threads only add synchronisation
    x0 = torch.from_numpy(uniform(N, 3, seed=seed))
    saves = [float(s) for s in np.unique(np.round(np.logspace(-2, math.log10(t_end), 200), 6))]
    r = adaptive_run(x0, beta, t_end, rtol, rtol * 1e-2, save_times=saves)  # cluster counts at log-spaced times
    free = adaptive_run(x0, beta, t_end, rtol, rtol * 1e-2)  # step sizes, no step cut short by a save time
    return {"steps": free.steps, "clusters": r.clusters, "stats": asdict(free.stats), "evaluations": free.evaluations}


META_HEADER = ["method", "rtol / dt", "error vs ref", "field evals", "wall (s)", "evals x fewer", "time x less"]


def meta_rows(result: dict) -> list[list[str]]:
    """String cells of the metastability table: rk4 at its largest passing step, then each adaptive method."""
    out = []
    rk = result.get("best_rk4")
    if rk is not None:
        out.append(["rk4 (fixed)", f"dt {rk['dt']:.4g}", f"{rk['error']:.1e}", f"{rk['evaluations']:,}",
                    f"{rk['seconds']:.3g}", "1", "1"])  # fmt: skip
    for method, tried in result["adaptive"].items():
        r = tried[-1]
        ok = r["error"] <= result["tol"]
        out.append([
            f"{method} (adaptive)", f"rtol {r['rtol']:g}", f"{r['error']:.1e}" + ("" if ok else " (fails)"),
            f"{r['evaluations']:,}", f"{r['seconds']:.3g}",
            f"{r['evaluation_ratio']:.1f}" if "evaluation_ratio" in r else "-",
            f"{r['time_ratio']:.1f}" if "time_ratio" in r else "-",
        ])  # fmt: skip
    return out


def meta_title(result: dict) -> str:
    return (
        f"metastability: mha, A = {result['beta']:g} I, V = I, N = {result['N']} on S^2, t = 0..{result['t_end']:g}; "
        f"each method at its cheapest setting reaching the reference (dopri5, rtol 1e-12) to {result['tol']:g}"
    )


def meta_markdown(result: dict) -> str:
    lines = [meta_title(result), "", "| " + " | ".join(META_HEADER) + " |", "|" + "---|" * len(META_HEADER)]
    lines += ["| " + " | ".join(c) + " |" for c in meta_rows(result)]
    return "\n".join(lines) + "\n"


def plateau_figure(path: str, trace: dict | None = None) -> dict:
    """Draw the cluster count and the accepted step size over log time (``docs/img/metastability_plateaus.png``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    trace = plateau_trace() if trace is None else trace
    ts, hs = np.array(trace["steps"]).T
    tc, nc = np.array(trace["clusters"]).T
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(7.5, 5.2), sharex=True)
    ax1.step(tc, nc, where="post", color="C0")
    ax1.set_ylabel("clusters (eps 1e-3)")
    ax1.set_yscale("log")
    ax1.set_title("mha, A = 9 I, V = I, N = 64 on S^2: dopri5, rtol 1e-8")
    ax2.plot(ts, hs, "-", lw=0.8, color="C1")
    ax2.set_xscale("log")
    ax2.set_yscale("log")
    ax2.set_ylabel("accepted step dt")
    ax2.set_xlabel("t")
    fig.tight_layout()
    fig.savefig(path, dpi=FIGURE_DPI)
    plt.close(fig)
    return trace
