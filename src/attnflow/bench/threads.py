"""The thread policy against one thread and torch's default, beside a CPU-bound process.

Each case runs three ways in one process, side by side: torch's default thread count (the cores),
the :class:`~attnflow.core.threads.ThreadPolicy` choice for the work size, and one thread; first on
the machine as it is, then with a second process spinning on a core (``while True: pass``). The
ratio printed is the policy's time over the one-thread time: the issue-31 target is <= 1.5 for the
preset ``ou`` run with the spinner running.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from attnflow.core.threads import ThreadPolicy, available_cores

__all__ = ["THREADS_HEADER", "run_thread_benchmarks", "thread_rows", "thread_markdown", "SPIN_TARGET"]

#: Policy time / one-thread time that the preset ``ou`` run must stay under beside a busy core.
SPIN_TARGET = 1.5

THREADS_HEADER = (
    "case",
    "N, H",
    "beside",
    "torch default (s)",
    "policy (s)",
    "one thread (s)",
    "policy / one",
    "default / one",
)


def _spinner() -> subprocess.Popen:
    """A second CPU-bound process: one core kept busy until killed."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def _cases(quick: bool) -> list[tuple[str, int, int, Callable[[int], Any]]]:
    """``(label, N, H, run)`` for the preset ``ou`` run (shortened with ``quick``) and a large dense run;
    ``run(threads)`` simulates on ``threads`` threads."""
    import inspect

    from attnflow.config import preset_config
    from attnflow.config.build import build
    from attnflow.core import tokens
    from attnflow.core.heads import identity_heads
    from attnflow.solve.simulation import simulate

    # simulate applies the thread policy itself once it takes ``threads=``: then each column passes its count
    takes_threads = "threads" in inspect.signature(simulate).parameters
    fixed = lambda k: {"threads": k} if takes_threads else {}

    cfg = preset_config("ou")
    if quick:
        integ = cfg.integration.model_copy(update={"t_end": 1.0})
        cfg = cfg.model_copy(update={"integration": integ})
    x_ou, process, kwargs = build(cfg)
    n_ou, h_ou = cfg.tokens.n, cfg.heads.count
    big_n, big_h = 2048, 8
    x0 = tokens.uniform(big_n, 3, seed=0)
    A = identity_heads(big_h, 3, beta=4.0)
    steps = 1 if quick else 4

    def preset(k: int) -> Any:
        return simulate(x_ou, process, **{**kwargs, **fixed(k)})

    def large(k: int) -> Any:
        return simulate(x0, A, model="gf", t_end=0.02 * steps, dt=0.02, method="rk4", backend="flash", **fixed(k))

    t_end = cfg.integration.t_end
    return [
        (f"preset ou (t_end {t_end:g})", n_ou, h_ou, preset),
        (f"dense gf, {steps} rk4 step(s)", big_n, big_h, large),
    ]


def _time(run: Callable[[int], Any], threads: int) -> float:
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        start = time.perf_counter()
        run(threads)
        return time.perf_counter() - start
    finally:
        torch.set_num_threads(before)


def run_thread_benchmarks(quick: bool = False, progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """One row per case and load: seconds with torch's default threads, the policy's and one thread."""
    default = max(torch.get_num_threads(), available_cores())
    rows = []
    cases = _cases(quick)
    for label, n, h, run in cases:
        _time(run, 1)  # warm-up: imports, allocations, compiled kernels
        chosen = ThreadPolicy().for_work(float(n) ** 2 * h)
        for beside in ("nothing", "a spinning process"):
            if progress:
                progress(f"threads: {label}, beside {beside}")
            spin = _spinner() if beside != "nothing" else None
            try:
                if spin is not None:
                    time.sleep(0.5)  # let it reach its core
                # interleaved so that a change of the machine's load hits all three alike
                t_def, t_pol, t_one = _time(run, default), _time(run, chosen), _time(run, 1)
            finally:
                if spin is not None:
                    spin.kill()
                    spin.wait()
            rows.append(
                {
                    "case": label,
                    "N": n,
                    "H": h,
                    "beside": beside,
                    "default_threads": default,
                    "policy_threads": chosen,
                    "default_s": t_def,
                    "policy_s": t_pol,
                    "one_s": t_one,
                }
            )
    return rows


def thread_rows(rows: list[dict[str, Any]]) -> list[list[str]]:
    """The table's cells (ratios against the one-thread time of the same row)."""
    out = []
    for r in rows:
        out.append(
            [
                r["case"],
                f"{r['N']}, {r['H']}",
                r["beside"],
                f"{r['default_s']:.3g} ({r['default_threads']} threads)",
                f"{r['policy_s']:.3g} ({r['policy_threads']} thread{'s' if r['policy_threads'] > 1 else ''})",
                f"{r['one_s']:.3g}",
                f"{r['policy_s'] / r['one_s']:.2f}",
                f"{r['default_s'] / r['one_s']:.2f}",
            ]
        )
    return out


def thread_verdict(rows: list[dict[str, Any]]) -> str:
    """PASS/FAIL of the preset ``ou`` run beside a spinning process, with its margin."""
    spun = [r for r in rows if r["case"].startswith("preset ou") and r["beside"] != "nothing"]
    if not spun:
        return ""
    ratio = spun[0]["policy_s"] / spun[0]["one_s"]
    word = "PASS" if ratio <= SPIN_TARGET else "FAIL"
    return (
        f"{word}: preset ou beside a spinning process, policy / one thread = {ratio:.2f} "
        f"(target <= {SPIN_TARGET}; margin {SPIN_TARGET - ratio:+.2f})"
    )


def thread_markdown(rows: list[dict[str, Any]]) -> str:
    """The table as Markdown, with the verdict line."""
    lines = ["| " + " | ".join(THREADS_HEADER) + " |", "|" + "---|" * len(THREADS_HEADER)]
    lines += ["| " + " | ".join(cells) + " |" for cells in thread_rows(rows)]
    verdict = thread_verdict(rows)
    return "\n".join(lines) + ("\n\n" + verdict if verdict else "") + "\n"
