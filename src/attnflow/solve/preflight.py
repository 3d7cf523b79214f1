"""Pre-flight: the memory and time a run will take, estimated from its config before it starts.

The estimate is an order of magnitude, not a promise. Memory: the recorded trajectory
(``S = n_steps / save_every + 1`` saved states of ``N d`` token coordinates and ``2 H d^2`` head
entries, held about three times: the records, the stacked arrays and the checkpoint/dataset being
written) plus the working set of one field evaluation (features ``q, k, v`` of ``H N d`` entries per
stage, the ``N x N`` Gram matrix of the cluster count when ``N`` is small enough to form it, and the
kernel's blocks). Time: ``n_steps x stages`` field evaluations at :data:`FLOPS_PER_SECOND`, each
``H N^2 (d + 20)`` floating-point operations for the dense kernel and ``2 N M (H + 1) (d + 1)`` for
fast summation (``d <= 4``, many tokens; ``M =`` :data:`FAST_FEATURES`; ``d + 1`` rows instead of
``H (d + 1)`` for model ``gf``, whose rows are summed over the heads before the products) at
:data:`FAST_FLOPS_PER_SECOND` (BLAS products). The 100,000-token ``ou`` preset run (model ``gf``) of
1000 rk4 steps is estimated at 7 minutes; it took 2.8 minutes at tolerance 1e-6 on 2026-12-01 (27
minutes at 1e-10 with the code of 2026-11-29; the old ``N x 1000`` pairs said 10 hours, the products
at the dense kernel's rate 2.5 hours, the products of ``H (d + 1)`` rows 31 minutes).

:func:`preflight` refuses (``PreflightError``) what cannot fit in the machine's memory and flags
(``Estimate.heavy``) what exceeds :data:`WARN_SECONDS` or :data:`WARN_MEMORY_FRACTION` of memory,
so that the CLI can ask before it starts (``--yes`` proceeds without asking).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from attnflow.config import defaults
from attnflow.config.errors import ConfigError
from attnflow.config.schema import RunConfig
from attnflow.schemes.integrators import evaluations_per_step

#: Assumed sustained rate of the attention kernel (float64, one core); conservative on purpose.
FLOPS_PER_SECOND = 2e9
#: Features per token of fast summation assumed by the estimate: ``(P + 1)^2`` at degree 24, what the
#: ``auto`` tolerance 1e-10 needs at beta about 6 in d = 3 (tolerance 1e-6 at beta 4 needs 225).
FAST_FEATURES = 625.0
#: Assumed rate of fast summation's products (BLAS, float64): a quarter of one core's measured rate
#: (about 45 GFLOP/s on this machine's CPUs), conservative on purpose.
FAST_FLOPS_PER_SECOND = 1e10
#: Fixed cost of one step (Python, sampler, bookkeeping).
SECONDS_PER_STEP = 2e-5
#: Warn (and ask) above this estimated wall time ...
WARN_SECONDS = 3600.0
#: ... or above this fraction of the machine's memory.
WARN_MEMORY_FRACTION = 0.5
#: Fixed working memory of a run (interpreter, torch, kernel blocks): about 400 MB.
BASE_BYTES = 4e8
#: The cluster count forms one N x N Gram matrix up to this many tokens (analysis.diagnostics).
GRAM_TOKENS = 4096


class PreflightError(ConfigError):
    """A run that cannot fit in this machine's memory (or is too heavy to start unasked)."""


@dataclass(frozen=True)
class Estimate:
    """Estimated ``memory_bytes`` and ``seconds`` of a run (or a sweep), and the machine's ``available_bytes``."""

    memory_bytes: float
    seconds: float
    n_steps: float
    saved: float
    available_bytes: float | None

    @property
    def fits(self) -> bool:
        return self.available_bytes is None or self.memory_bytes <= self.available_bytes

    @property
    def heavy(self) -> bool:
        big = self.available_bytes is not None and self.memory_bytes > WARN_MEMORY_FRACTION * self.available_bytes
        return big or self.seconds > WARN_SECONDS

    def describe(self) -> str:
        mem = "" if self.available_bytes is None else f" of the {human_bytes(self.available_bytes)} this machine has"
        return (
            f"about {human_bytes(self.memory_bytes)} of memory{mem} and {human_seconds(self.seconds)} "
            f"({self.n_steps:.3g} steps, {self.saved:.3g} saved states; a rough estimate)"
        )


def machine_memory() -> float | None:
    """Physical memory of this machine in bytes (``psutil`` if present, else ``os.sysconf``)."""
    try:
        import psutil  # optional

        return float(psutil.virtual_memory().total)
    except Exception:
        pass
    try:
        return float(os.sysconf("SC_PHYS_PAGES")) * float(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def estimate(cfg: RunConfig | dict, *, available_bytes: float | None = None) -> Estimate:
    """Memory and time of the run ``cfg`` (a config, or its ``model_dump(mode="json")`` mapping).

    Floats throughout: absurd sizes give huge estimates, never an overflow.
    """
    c = cfg.model_dump(mode="json") if isinstance(cfg, RunConfig) else cfg
    tok, heads, integ = c["tokens"], c["heads"], c["integration"]
    N, d, H = float(tok["n"]), float(tok["d"]), float(heads["count"])
    steps = float(integ["t_end"]) / float(integ["dt"])
    saved = math.floor(steps / float(integ["save_every"])) + 2.0 if math.isfinite(steps) else math.inf
    item = 8.0 if c.get("dtype", "float64") == "float64" else 4.0
    recorded = 3.0 * saved * (N * d + 2.0 * H * d * d + 16.0) * 8.0
    stages = evaluations_per_step(str(integ.get("method", defaults.METHOD)))
    working = (stages + 6.0) * N * d * item + 4.0 * H * N * d * item + 6.0 * H * d * d * 8.0
    if N <= GRAM_TOKENS:
        working += N * N * (item + 1.0)
    memory = BASE_BYTES + recorded + working
    backend = (c.get("kernel") or {}).get("backend", "auto")
    fast = backend == "fast" or (backend == "auto" and d <= 4 and N >= 4096)
    if fast:
        # Fast summation: the query-side products W phi (H (d + 1) rows of FAST_FEATURES features per
        # token; d + 1 for model gf, whose rows are summed over the heads first) and the key moments
        # (d + 1 columns), 2 flops per term, at the BLAS rate.
        rows = (d + 1.0) * (1.0 if c.get("model", defaults.MODEL) == "gf" else H)
        seconds_per_eval = 2.0 * N * FAST_FEATURES * (rows + d + 1.0) / FAST_FLOPS_PER_SECOND
    else:
        seconds_per_eval = H * N * N * (d + 20.0) / FLOPS_PER_SECOND
    per_step = stages * seconds_per_eval + SECONDS_PER_STEP
    seconds = steps * per_step + saved * (N * min(N, GRAM_TOKENS) * d / FLOPS_PER_SECOND)
    if available_bytes is None:
        available_bytes = machine_memory()
    return Estimate(memory, seconds, steps, saved, available_bytes)


def sweep_estimate(configs: list[RunConfig | dict], workers: int, *, available_bytes: float | None = None) -> Estimate:
    """A sweep: the points' times summed and shared by ``workers``; memory of the largest point per worker."""
    if not configs:
        return Estimate(0.0, 0.0, 0.0, 0.0, available_bytes)
    if available_bytes is None:
        available_bytes = machine_memory()
    one = [estimate(c, available_bytes=available_bytes) for c in configs]
    w = max(1, int(workers))
    worst = max(one, key=lambda e: e.memory_bytes)
    return Estimate(
        memory_bytes=worst.memory_bytes * min(w, len(one)),
        seconds=sum(e.seconds for e in one) / w,
        n_steps=sum(e.n_steps for e in one),
        saved=sum(e.saved for e in one),
        available_bytes=one[0].available_bytes,
    )


def preflight(est: Estimate, *, what: str = "this run") -> Estimate:
    """Refuse ``est`` when it cannot fit in memory (:class:`PreflightError` naming both figures)."""
    if not est.fits:
        raise PreflightError(
            f"{what} cannot fit in memory: it needs {est.describe()}. Make it smaller (fewer tokens, heads or "
            "saved times: a larger integration.save_every or a shorter t_end)."
        )
    return est


def human_bytes(n: float) -> str:
    """``n`` bytes as ``'1.5 GB'`` (decimal units; ``inf`` stays ``inf``)."""
    if not math.isfinite(n):
        return "an unbounded amount"
    for unit in ("B", "kB", "MB", "GB", "TB", "PB", "EB"):
        if abs(n) < 1000 or unit == "EB":
            return f"{n:.3g} {unit}"
        n /= 1000.0
    return f"{n:.3g} EB"


def human_seconds(s: float) -> str:
    """``s`` seconds as ``'3.2 hours'`` (up to years; ``inf``: 'forever')."""
    if not math.isfinite(s):
        return "forever"
    for unit, size in (("years", 3.15e7), ("days", 86400.0), ("hours", 3600.0), ("minutes", 60.0)):
        if s >= size:
            return f"{s / size:.3g} {unit}"
    return f"{s:.2g} seconds"
