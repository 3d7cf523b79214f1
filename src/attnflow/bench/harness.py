"""Benchmarks of the attention field, measured side by side in one process (not part of the tests).

For each size ``(N, d, H)`` it times one evaluation of the ``mha`` field and a 100-step explicit
Euler run for (a) the numpy float64 full-matrix reference (what the public simulators do),
(b) the dense backend of :mod:`attnflow.kernels` and (c) fast summation (:mod:`attnflow.kernels.fastsum`)
where ``d <= 4``; it reports ratios against (a), the peak extra resident memory, and the rate in
token pairs per second against this machine's ``exp`` throughput (a large ``torch.exp``).
"""

from __future__ import annotations

import math
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any

import numpy as np
import torch

from attnflow.core.geometry import project_tangent, retract
from attnflow.core.heads import Heads, goe_heads
from attnflow.core.tokens import uniform
from attnflow.dynamics.fields import FieldStats, mixed_field
from attnflow.kernels.dispatch import KernelOptions, fast_plan_for, head_stats

#: Operator norm of every head in the benchmark (the "beta" of the targets).
BETA = 4.0


@dataclass
class BenchRow:
    """One measured (size, backend) cell."""

    N: int
    d: int
    H: int
    backend: str
    dtype: str
    eval_s: float | None
    run100_s: float | None
    run_note: str
    speedup: float | None  # reference eval time / this eval time
    peak_extra_mib: float | None
    pairs_per_s: float | None
    exp_fraction: float | None
    rel_error: float | None
    note: str = ""


def exp_throughput(n: int = 1 << 25, repeats: int = 3) -> float:
    """Elements per second of ``torch.exp`` on a large float32 tensor (best of ``repeats``)."""
    x = torch.rand(n, dtype=torch.float32)
    torch.exp(x)
    best = min(_timed(lambda: torch.exp(x, out=x)) for _ in range(repeats))
    return n / best


def _timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _best(fn: Callable[[], object], repeats: int) -> float:
    return min(_timed(fn) for _ in range(repeats))


def _rss_mib(field: str) -> float | None:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


def peak_extra_mib(fn: Callable[[], object]) -> float | None:
    """Peak resident memory of ``fn()`` above the resident memory before it (Linux ``VmHWM`` reset)."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        return None
    before = _rss_mib("VmRSS")
    fn()
    after = _rss_mib("VmHWM")
    if before is None or after is None:
        return None
    return max(0.0, after - before)


def reference_field(x: np.ndarray, A: np.ndarray, V: np.ndarray, a: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``mha`` velocity with full ``N x N`` matrices in numpy float64, one head at a time."""
    u = np.zeros_like(x)
    log_a = np.log(a)
    for h in range(A.shape[0]):
        S = x @ A[h] @ x.T + log_a[None, :]
        S -= S.max(axis=1, keepdims=True)
        E = np.exp(S)
        u += w[h] * (E @ (x @ V[h].T)) / E.sum(axis=1, keepdims=True)
    return u - x * np.sum(x * u, axis=1, keepdims=True)


def _problem(N: int, d: int, H: int, seed: int = 0):
    x = uniform(N, d, seed=seed)
    A = goe_heads(H, d, 1.0, seed=seed + 1)
    A *= BETA / np.linalg.norm(A, ord=2, axis=(1, 2)).max()
    return x, A


def _torch_field(
    heads: Heads, a: torch.Tensor, w: torch.Tensor, backend: str
) -> Callable[[torch.Tensor], torch.Tensor]:
    def f(x: torch.Tensor) -> torch.Tensor:
        out, logZ = head_stats(x, heads, a, backend=backend)
        return project_tangent(x, FieldStats(out, logZ, torch.log(w)).mixed_output("mha"))

    return f


def _euler_numpy(x, A, a, w, steps, dt=0.01):
    for _ in range(steps):
        x = x + dt * reference_field(x, A, A, a, w)
        x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x


def _euler_torch(f, x, steps, dt=0.01):
    for _ in range(steps):
        x = retract(x + dt * f(x))
    return x


def bench_size(
    N: int,
    d: int,
    H: int,
    *,
    exp_rate: float,
    reference: bool = True,
    fast: bool = True,
    dense: bool = True,
    steps: int = 100,
    time_budget_s: float = 60.0,
    repeats: int = 2,
    fast_tol: float = 1e-6,
) -> list[BenchRow]:
    """Measure the three backends at one size (see the module docstring)."""
    x, A = _problem(N, d, H)
    a = np.full(N, 1.0 / N)
    w = np.full(H, 1.0 / H)
    pairs = H * float(N) ** 2
    rows: list[BenchRow] = []
    ref_eval = None
    if reference:
        ref_eval = _best(lambda: reference_field(x, A, A, a, w), repeats)
        mem = peak_extra_mib(lambda: reference_field(x, A, A, a, w))
        run, note = _run_time(lambda k: _euler_numpy(x, A, a, w, k), ref_eval, steps, time_budget_s)
        rows.append(
            BenchRow(
                N,
                d,
                H,
                "numpy reference",
                "float64",
                ref_eval,
                run,
                note,
                1.0,
                mem,
                pairs / ref_eval,
                pairs / ref_eval / exp_rate,
                0.0,
            )
        )
    idx = np.random.default_rng(0).choice(N, size=min(64, N), replace=False)
    if dense:
        for dtype in (torch.float32,):
            xt = torch.as_tensor(x, dtype=dtype)
            heads = Heads.from_matrices(torch.as_tensor(A, dtype=dtype))
            at, wt = torch.full((N,), 1.0 / N, dtype=dtype), torch.full((H,), 1.0 / H, dtype=dtype)
            f = _torch_field(heads, at, wt, "flash")
            f(xt)
            evaluate = partial(f, xt)  # bound now, not at call time (no late-binding closure)
            t_eval = _best(evaluate, repeats)
            mem = peak_extra_mib(evaluate)
            err = _subset_error(f(xt).double().numpy(), x, A, a, w, idx)
            run, note = _run_time(partial(_euler_torch, f, xt), t_eval, steps, time_budget_s)
            rows.append(
                BenchRow(
                    N,
                    d,
                    H,
                    "dense (flash)",
                    str(dtype).replace("torch.", ""),
                    t_eval,
                    run,
                    note,
                    ref_eval / t_eval if ref_eval else None,
                    mem,
                    pairs / t_eval,
                    pairs / t_eval / exp_rate,
                    err,
                )
            )
    if fast and d <= 4:
        xt = torch.as_tensor(x)
        At = torch.as_tensor(A)
        at, wt = torch.full((N,), 1.0 / N, dtype=torch.float64), torch.full((H,), 1.0 / H, dtype=torch.float64)
        heads, opts = Heads(K=At), KernelOptions("fast", fast_tol)
        fp, _ = fast_plan_for(xt, heads, at, options=opts)  # the plan each call below makes again
        assert fp is not None  # backend "fast" raises instead

        def f_fast(y: torch.Tensor) -> torch.Tensor:
            # what a run's step calls (the plan made per call, the heads mixed inside the loop)
            return project_tangent(y, mixed_field(y, heads, at, wt, "mha", options=opts))

        f_fast(xt)  # warm-up: compiles the loops and builds the coefficients
        # a new cloud each time (a copy of the same tokens): the key moments are recomputed, as at
        # every step of a run (the same tensor would find them cached)
        t_eval = _best(lambda: f_fast(xt.clone()), repeats)
        mem = peak_extra_mib(lambda: f_fast(xt))
        err = _subset_error(f_fast(xt).numpy(), x, A, a, w, idx)
        run, note = _run_time(lambda k: _euler_torch(f_fast, xt, k), t_eval, steps, time_budget_s)
        rows.append(
            BenchRow(
                N,
                d,
                H,
                f"fast (P={fp.degree}, tol={fast_tol:g})",
                "float64",
                t_eval,
                run,
                note,
                ref_eval / t_eval if ref_eval else None,
                mem,
                pairs / t_eval,
                pairs / t_eval / exp_rate,
                err,
                note=f"proved bound {fp.relative_bound:.1e}",
            )
        )
    return rows


def _subset_error(v: np.ndarray, x, A, a, w, idx) -> float:
    """``max_i |v~(x_i) - v(x_i)| / max_i |v(x_i)|`` over the subset ``idx``, exact sums in float64."""
    u = np.zeros((len(idx), x.shape[1]))
    log_a = np.log(a)
    for h in range(A.shape[0]):
        S = x[idx] @ A[h] @ x.T + log_a[None, :]
        S -= S.max(axis=1, keepdims=True)
        E = np.exp(S)
        u += w[h] * (E @ (x @ A[h].T)) / E.sum(axis=1, keepdims=True)
    exact = u - x[idx] * np.sum(x[idx] * u, axis=1, keepdims=True)
    return float(np.abs(v[idx] - exact).max() / np.abs(exact).max())


def _run_time(run: Callable[[int], object], eval_s: float, steps: int, budget: float) -> tuple[float, str]:
    """Time ``steps`` Euler steps, or fewer (scaled up, and said so) when the full run would exceed ``budget``."""
    k = steps if eval_s * steps <= budget else max(1, int(budget / max(eval_s, 1e-9)))
    t = _timed(lambda: run(k))
    return t * steps / k, ("" if k == steps else f"{k} steps x {steps / k:.3g}")


def run_benchmarks(quick: bool = False, progress: Callable[[str], None] | None = None) -> dict:
    """All sizes of the quick or full suite; returns a JSON-ready dict."""
    torch.manual_seed(0)
    exp_rate = exp_throughput(1 << 24 if quick else 1 << 26)
    plan_: list[dict[str, Any]]
    if quick:
        plan_ = [
            dict(N=1024, d=3, H=8),
            dict(N=4096, d=3, H=8),
            dict(N=65536, d=3, H=8, reference=False, dense=False, time_budget_s=20.0),
        ]
    else:
        plan_ = [
            dict(N=4096, d=3, H=8),
            dict(N=4096, d=64, H=8),
            dict(N=16384, d=3, H=4),
            dict(N=65536, d=3, H=8, reference=False, time_budget_s=30.0),
            dict(N=1_000_000, d=3, H=8, reference=False, dense=False, time_budget_s=60.0, repeats=3),
        ]
    rows: list[BenchRow] = []
    for p in plan_:
        if progress:
            progress(f"N={p['N']} d={p['d']} H={p['H']}")
        rows += bench_size(exp_rate=exp_rate, **p)
    return {
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor(),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "exp_per_s": exp_rate,
        },
        "quick": quick,
        "beta": BETA,
        "rows": [asdict(r) for r in rows],
    }


def _fmt(v, spec: str, none: str = "-") -> str:
    return none if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


def table_rows(result: dict) -> list[list[str]]:
    """String cells of the results table (shared by the terminal and Markdown renderings)."""
    out = []
    for r in result["rows"]:
        out.append(
            [
                f"{r['N']:,}, {r['d']}, {r['H']}",
                r["backend"],
                r["dtype"],
                _fmt(r["eval_s"], ".3g"),
                _fmt(r["run100_s"], ".3g") + (f" ({r['run_note']})" if r["run_note"] else ""),
                _fmt(r["speedup"], ".1f"),
                _fmt(r["peak_extra_mib"], ".0f"),
                _fmt(r["pairs_per_s"], ".2e"),
                _fmt(100 * r["exp_fraction"] if r["exp_fraction"] is not None else None, ".0f"),
                _fmt(r["rel_error"], ".1e"),
            ]
        )
    return out


HEADER = [
    "N, d, H",
    "backend",
    "dtype",
    "eval (s)",
    "100 steps (s)",
    "x ref",
    "peak MiB",
    "pairs/s",
    "% exp",
    "rel. error",
]


def markdown(result: dict) -> str:
    m = result["machine"]
    lines = [
        f"exp throughput: {m['exp_per_s']:.3g} /s ({m['threads']} torch threads, torch {m['torch']}); beta = {result['beta']}",
        "",
        "| " + " | ".join(HEADER) + " |",
        "|" + "---|" * len(HEADER),
    ]
    lines += ["| " + " | ".join(c) + " |" for c in table_rows(result)]
    if result.get("startup_s"):
        lines += ["", "| command-line start-up (fresh process, best of 3) | seconds |", "|---|---|"]
        lines += [f"| `{label}` | {s:.3f} |" for label, s in result["startup_s"].items()]
    return "\n".join(lines) + "\n"
