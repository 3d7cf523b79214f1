"""What a simulation step costs beside its field evaluations, measured side by side in one process.

For each size ``(N, d, H)``, dtype and ``save_every``:

* ``eval_s``: one evaluation of the ``mha`` field (the stepper's unit of work), the mean over
  ``steps`` consecutive evaluations, as ``step_s`` is the mean over ``steps`` consecutive steps (the
  fastest of a few single calls would compare a minimum with a mean and overstate the overhead);
* ``step_s``: ``simulate``'s wall time per explicit Euler step (one evaluation per step), with the
  diagnostics, the float32 check and everything else it does; ``evals_per_step = step_s / eval_s``
  is the overhead (the target is <= 1.15);
* ``plain_s``: one step of the plain torch approach of the public simulators (batched logits,
  softmax, values, average over heads, Euler, retraction), the reference row; ``speedup`` is
  ``plain_s / step_s`` (the target is >= 2);
* ``split``: ``simulate``'s own account of where the time went (``provenance["seconds"]``), per
  step, in evaluations; ``python`` is what no part claims (the loop, saving the arrays).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from attnflow.bench.harness import BETA, _problem
from attnflow.kernels.dispatch import KernelOptions
from attnflow.solve.guards import PrecisionWarning
from attnflow.solve.simulation import TimeField, simulate
from attnflow.weights.processes import Constant

#: The sizes and settings of the issue's targets (``--quick``: the small size only).
LOOP_SIZES: tuple[tuple[int, int, int], ...] = ((1024, 16, 4), (4096, 64, 8))


@dataclass
class LoopRow:
    """One measured (size, dtype, save_every) cell."""

    N: int
    d: int
    H: int
    dtype: str
    save_every: int
    steps: int
    eval_s: float
    step_s: float
    evals_per_step: float
    plain_s: float
    speedup: float
    split: dict[str, float] = field(default_factory=dict)
    rounds: int = 0


def plain_torch_step(x: torch.Tensor, A: torch.Tensor, V: torch.Tensor, dt: float) -> torch.Tensor:
    """One Euler step the way the public multi-head simulators write it: ``(H, N, N)`` logits,
    softmax, values, average over heads, tangent projection, Euler, retraction."""
    logits = (x @ A) @ x.T  # (H, N, N): x_i^T A_h x_j
    attn = torch.softmax(logits, dim=-1)
    values = x @ V.transpose(-1, -2)  # (H, N, d): V_h x_j
    u = (attn @ values).mean(0)
    v = u - x * (x * u).sum(-1, keepdim=True)
    y = x + dt * v
    return y / torch.linalg.vector_norm(y, dim=-1, keepdim=True)


def _best(fn: Callable[[], object], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


#: Rounds of a cell: at least ``MIN_ROUNDS``; more, up to ``MAX_ROUNDS``, while the cell has been
#: measured for less than ``ROUND_SECONDS``. On this 2-core machine one evaluation loop's time
#: spreads by 8-25% between its fastest and its median round (30-40 rounds, four sessions), and
#: three rounds of a 1024-token cell last about one second in all. Repetitions of the 1024-token
#: float32 cells, interleaved (2026-12-01): three rounds gave 1.07 to 1.31 evaluations per step at
#: ``save_every`` 10 (standard deviation 0.08, 8 repetitions); seven rounds 1.11 to 1.21 (0.04, 6) and
#: 1.06 to 1.15 at ``save_every`` 40 (0.03); rounds for 10 s (23 to 30) 1.12 to 1.18 (0.021) and
#: 1.10 to 1.12 (0.011). A 4096-token round lasts 20 to 60 s, so those cells keep three.
MIN_ROUNDS, MAX_ROUNDS, ROUND_SECONDS = 3, 40, 10.0


def bench_loop(
    N: int, d: int, H: int, dtype: torch.dtype, save_every: int, *, steps: int = 40, repeats: int | None = None
) -> LoopRow:
    """Measure one cell (see the module docstring); ``repeats``: a fixed number of rounds instead of
    the time-bounded :data:`MIN_ROUNDS` to :data:`MAX_ROUNDS`."""
    x_np, A_np = _problem(N, d, H)
    V_np = -A_np  # mha with V != A: values, logits and the diagnostics' A-outputs all differ
    x = torch.as_tensor(x_np, dtype=dtype)
    A, V = torch.as_tensor(A_np, dtype=dtype), torch.as_tensor(V_np, dtype=dtype)
    process = Constant(A_np, V_np)
    a, w = torch.full((N,), 1.0 / N, dtype=dtype), torch.full((H,), 1.0 / H, dtype=dtype)
    f = TimeField("mha", process.sampler(0), a, w, dtype, x.device, KernelOptions())
    f(0.0, x)  # warm-up
    dt = 1e-3
    plain_torch_step(x, A, V, dt)
    # The three timings interleave, round by round, and each keeps its best of the same number of
    # rounds: on a shared machine a slow spell then hits all three instead of one, and no timing
    # gets more chances than another, so the ratios stay fair.
    eval_s = plain_s = best_step = float("inf")
    secs: dict[str, float] = {}

    def evaluations() -> None:
        for _ in range(steps):
            f(0.0, x)

    began, rounds = time.perf_counter(), 0
    while rounds < (repeats or MIN_ROUNDS) or (
        repeats is None and rounds < MAX_ROUNDS and time.perf_counter() - began < ROUND_SECONDS
    ):
        rounds += 1
        eval_s = min(eval_s, _best(evaluations, 1) / steps)
        plain_s = min(plain_s, _best(lambda: plain_torch_step(x, A, V, dt), 1))
        with warnings.catch_warnings():  # a float32 run at this dt is flagged (rounding > truncation): not news here
            warnings.simplefilter("ignore", PrecisionWarning)
            traj = simulate(x, process, model="mha", t_end=steps * dt, dt=dt, method="euler", save_every=save_every)
        per = traj.provenance["wall_time_s"] / steps
        if per < best_step:
            best_step = per
            secs = dict(traj.provenance.get("seconds", {}))
            secs["python"] = max(0.0, traj.provenance["wall_time_s"] - sum(secs.values()))
    split = {k: v / steps / eval_s for k, v in secs.items()}
    return LoopRow(
        N, d, H, str(dtype).replace("torch.", ""), save_every, steps, eval_s, best_step, best_step / eval_s,
        plain_s, plain_s / best_step, split, rounds,
    )  # fmt: skip


def run_loop_benchmarks(quick: bool = False, progress: Callable[[str], None] | None = None) -> list[dict]:
    """Every cell of the overhead table; JSON-ready."""
    torch.manual_seed(0)
    rows = []
    for N, d, H in LOOP_SIZES[:1] if quick else LOOP_SIZES:
        for dtype in (torch.float32, torch.float64):
            for save_every in (10, 40):
                if progress:
                    progress(f"loop N={N} d={d} H={H} {dtype} save_every={save_every}")
                # --quick: the fixed minimum of rounds (a smoke run, about a minute in all)
                row = bench_loop(N, d, H, dtype, save_every, steps=40, repeats=MIN_ROUNDS if quick else None)
                rows.append(row.__dict__)
    return rows


LOOP_HEADER = ("N", "d", "H", "dtype", "save_every", "eval", "simulate / step", "evals / step", "plain torch / step",
               "speedup vs plain", "split (evaluations per step)")  # fmt: skip


def loop_table_rows(rows: list[dict]) -> list[tuple[str, ...]]:
    """The overhead table as strings."""
    out: list[tuple[str, ...]] = []
    for r in rows:
        split = ", ".join(f"{k} {v:.2f}" for k, v in sorted(r["split"].items(), key=lambda kv: -kv[1]))
        out.append((
            str(r["N"]), str(r["d"]), str(r["H"]), r["dtype"], str(r["save_every"]), f"{r['eval_s'] * 1e3:.1f} ms",
            f"{r['step_s'] * 1e3:.1f} ms", f"{r['evals_per_step']:.2f}", f"{r['plain_s'] * 1e3:.1f} ms",
            f"{r['speedup']:.2f}x", split,
        ))  # fmt: skip
    return out


def _span(values: set[int]) -> str:
    lo, hi = min(values, default=0), max(values, default=0)
    return str(lo) if lo == hi else f"{lo} to {hi}"


def loop_markdown(rows: list[dict]) -> str:
    """The overhead table in Markdown (for the README), with the beta used."""
    steps, rounds = _span({int(r["steps"]) for r in rows}), _span({int(r["rounds"]) for r in rows})
    lines = [
        f"| {' | '.join(LOOP_HEADER)} |",
        "|" + "---|" * len(LOOP_HEADER),
        *(f"| {' | '.join(r)} |" for r in loop_table_rows(rows)),
        "",
        f"Explicit Euler, `mha` with V = -A, heads of operator norm {BETA:g}, {steps} steps; each timing the best of "
        f"{rounds} interleaved rounds; targets: evals / step <= 1.15, speedup vs plain >= 2.",
    ]
    return "\n".join(lines) + "\n"
