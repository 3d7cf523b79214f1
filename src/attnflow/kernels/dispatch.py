"""Which kernel evaluates ``(out_h, log Z_h)``: dense (fused ``flash`` or ``stream``) or ``fast`` summation.

:func:`head_stats` is what the fields call. ``backend="auto"`` takes the fused dense kernel, and
switches to :mod:`attnflow.kernels.fastsum` when the tokens are few-dimensional (``d <= 4``), many, and the
expansion that meets the tolerance is predicted cheaper than the ``H N^2`` pairs. On the circle (``d = 2``)
with conformal heads ``A_h = rho_h R(psi_h)`` (``beta I`` among them) that expansion is evaluated as its
Fourier series (:mod:`attnflow.kernels.fastsum.circle`), exact to rounding.

A run carries its choice in the open: one :class:`KernelOptions` (backend, tolerance and thread
policy), built from ``simulate(..., backend=, fast_tol=)`` or the config's ``kernel:`` section, is
passed as an argument to every kernel call of the run (the field, the EDI budget's energies, the
diagnostics, the float32 monitor). Each :class:`KernelOptions` owns a fast-summation evaluator
(:class:`~attnflow.kernels.fastsum.FastSumEvaluator`): the caches of one run belong to that run.
:func:`kernel_options` remains as a convenience for interactive use: calls that are given no options
take the ones of the innermost ``with kernel_options(...)`` block (outside any block, a fresh set of
defaults per call, so nothing is cached at module level).
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field

import torch

from attnflow.core.errors import Hint, InputError
from attnflow.core.heads import Heads
from attnflow.core.threads import ThreadPolicy
from attnflow.kernels import fastsum
from attnflow.kernels.dense import attention_stats, resolve_backend
from attnflow.kernels.fastsum import circle

#: Every backend name accepted by :func:`head_stats` (and ``simulate(..., backend=...)``).
BACKENDS: tuple[str, ...] = ("auto", "flash", "stream", "fast")
#: Tolerance (proved relative error of ``Z_h`` and ``out_h``) of the fast summation when ``auto``
#: chooses it: in float64 about 1e3 below the error of one rk4 step at the presets' ``dt`` and, as
#: its rounding estimate ``eps exp(beta)`` must stay below it, usable up to ``beta ~ 13``.
AUTO_FAST_TOL: dict[torch.dtype, float] = {torch.float64: 1e-10, torch.float32: 1e-7}
#: ``auto`` never uses fast summation below this many tokens (the expansion's set-up dominates).
AUTO_FAST_MIN_TOKENS = 4096
#: Measured cost of one token pair of the fused kernel, in units of one float64 multiply-add of the
#: fast summation's matrix products (about 20 on the CPUs measured by ``attnflow bench``).
PAIR_COST_IN_FLOPS = 20.0
#: From this many tokens on, ``auto`` warns when it has to fall back to the dense ``O(N^2)`` kernel.
SLOW_DENSE_TOKENS = 50_000


@dataclass(frozen=True)
class KernelOptions:
    """How the kernel evaluates a run: ``backend`` (one of :data:`BACKENDS`), ``tol``, the fast
    summation's proved relative error (``None``: :data:`AUTO_FAST_TOL` of the dtype), and ``threads``,
    the :class:`~attnflow.core.threads.ThreadPolicy` of fast summation's compiled loops (default: from
    each call's size).

    ``evaluator``: the run's :class:`~attnflow.kernels.fastsum.FastSumEvaluator` (its caches), made
    here with ``threads`` when not given; options built once per run therefore cache per run.
    Validated on construction, so a bad name is refused where it is written, not at the first call.
    """

    backend: str = "auto"
    tol: float | None = None
    threads: ThreadPolicy = field(default_factory=ThreadPolicy)
    evaluator: fastsum.FastSumEvaluator = field(default=None, compare=False, repr=False)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if not isinstance(self.threads, ThreadPolicy):
            raise InputError(f"threads must be a ThreadPolicy; got {self.threads!r}")
        if self.evaluator is None:
            object.__setattr__(self, "evaluator", fastsum.FastSumEvaluator(self.threads))
        if self.backend not in BACKENDS:
            raise InputError(f"unknown backend {self.backend!r}; choose one of {BACKENDS}")
        if self.tol is not None and not (
            isinstance(self.tol, (int, float)) and math.isfinite(self.tol) and 0 < self.tol < 1
        ):
            raise InputError(f"the fast-summation tolerance must be positive and below 1; got {self.tol!r}")


#: The options of calls that are given none (see :func:`kernel_options`).
DEFAULT_OPTIONS = KernelOptions()

_OPTIONS: ContextVar[KernelOptions] = ContextVar("attnflow_kernel_options", default=DEFAULT_OPTIONS)


class SlowKernelWarning(UserWarning):
    """``auto`` could not use fast summation for a large token cloud: each evaluation is ``O(N^2)``."""


@contextlib.contextmanager
def kernel_options(backend: str = "auto", tol: float | None = None) -> Iterator[KernelOptions]:
    """Interactive convenience: within this block, kernel calls given no :class:`KernelOptions` use
    ``backend`` and fast-summation tolerance ``tol``. Yields the options object, to pass on explicitly."""
    options = KernelOptions(backend, tol)
    token = _OPTIONS.set(options)
    try:
        yield options
    finally:
        _OPTIONS.reset(token)


def current_options() -> tuple[str, float | None]:
    """``(backend, tol)`` of calls given no options (see :func:`kernel_options`)."""
    opts = _OPTIONS.get()
    return opts.backend, opts.tol


def resolve_options(options: KernelOptions | None = None) -> KernelOptions:
    """``options`` when given, else those of the innermost :func:`kernel_options` block (else fresh
    defaults: a call outside any run keeps no cache)."""
    if options is not None:
        return options
    ambient = _OPTIONS.get()
    return KernelOptions() if ambient is DEFAULT_OPTIONS else ambient


def head_stats(
    x: torch.Tensor,
    heads: Heads,
    a: torch.Tensor,
    *,
    values: bool = True,
    options: KernelOptions | None = None,
    backend: str | None = None,
    tol: float | None = None,
    extra_values: torch.Tensor | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """``(out, logZ)`` of every head at tokens ``x`` ``(N, d)`` with masses ``a`` (see :mod:`attnflow.kernels`).

    ``options``: the :class:`KernelOptions` of the run (``None``: :func:`resolve_options`);
    ``backend`` / ``tol``, when given, override its fields for this call.
    ``extra_values`` ``(H, e, d)``: matrices ``E_h`` whose averages ``sum_j p_hij E_h x_j`` are appended
    to ``out`` (shape ``(H, N, d + e)``) from the same pass (the EDI recorder's ``dA/dt``).
    """
    fp, backend = fast_plan_for(x, heads, a, options=options, backend=backend, tol=tol)
    if fp is not None and circle.applies(x, heads):
        # On the circle with conformal heads the expansion is a Fourier series: exact to rounding (below any tol)
        return circle.circle_stats(x, heads, a, values=values, extra_values=extra_values)
    if fp is not None:
        V = heads.values if values else None
        if V is not None and extra_values is not None:
            V = torch.cat([V, extra_values.to(V)], dim=-2)
        evaluator = resolve_options(options).evaluator  # the run's caches and thread policy
        res = fastsum.fast_attention_stats(x, heads.A, V, a, fast_plan=fp, evaluator=evaluator)
        return res.out, res.logZ
    q, k, key_bias = heads.logit_features(x)
    v = heads.value_features(x) if values else None
    if v is not None and extra_values is not None:
        v = torch.cat([v, x.unsqueeze(-3) @ extra_values.to(x).transpose(-1, -2)], dim=-1)
    return attention_stats(q, k, v, torch.log(a), key_bias=key_bias, causal=heads.causal, backend=backend)


def fast_plan_for(
    x: torch.Tensor,
    heads: Heads,
    a: torch.Tensor,
    *,
    options: KernelOptions | None = None,
    backend: str | None = None,
    tol: float | None = None,
) -> tuple[fastsum.FastSumPlan | None, str]:
    """The fast-summation plan :func:`head_stats` uses for these arguments and the backend it resolved;
    the one home of that choice. With no plan the backend is the concrete dense one (``"flash"`` or
    ``"stream"``), so a caller passing it on is not given the choice to make again."""
    opts = resolve_options(options)
    if backend is not None and backend not in BACKENDS:
        raise InputError(f"unknown backend {backend!r}; choose one of {BACKENDS}")
    backend = opts.backend if backend is None else backend
    tol = opts.tol if tol is None else tol
    if backend == "fast" and not heads.plain:
        raise InputError(
            "fast summation covers the plain heads of docs/model.md; these heads carry biases, a causal "
            "mask or rotary embeddings: use backend 'auto' (dense)",
            hint=Hint("kernel.backend", "auto"),
        )
    if backend in ("auto", "fast") and heads.plain:
        fp = choose_fast(x, heads, a, tol, force=backend == "fast")
        if fp is not None:
            return fp, backend
    return None, backend if backend in ("flash", "stream") else resolve_backend("auto", x)


def choose_fast(
    x: torch.Tensor, heads: Heads, a: torch.Tensor, tol: float | None, *, force: bool = False
) -> fastsum.FastSumPlan | None:
    """The fast-summation plan to use, or ``None`` for the dense kernel.

    With ``force`` (backend ``"fast"``) a plan is required and its absence is a clear error.
    """
    N, d = x.shape[-2], x.shape[-1]
    if x.ndim != 2 or d > fastsum.MAX_DIM:
        if force:
            raise InputError(
                f"fast summation needs one token cloud (N, d) with d <= {fastsum.MAX_DIM}; got {tuple(x.shape)}"
            )
        return None
    if not force and N < AUTO_FAST_MIN_TOKENS:
        return None
    tol = AUTO_FAST_TOL.get(x.dtype, 1e-10) if tol is None else tol
    fp = fastsum.plan(heads.A, tol, fastsum.mean_norm(x, a))
    if fp is None:
        if not force and N >= SLOW_DENSE_TOKENS:
            warnings.warn(
                f"fast summation cannot reach tol={tol:g} at beta=max ||A_h|| = "
                f"{float(torch.linalg.matrix_norm(heads.A.double(), ord=2).max()):.3g}, so the {N} tokens use the dense "
                f"kernel ({heads.H} x {N}^2 pairs per evaluation, much slower); a larger tolerance (kernel.tolerance) "
                "may allow fast summation",
                SlowKernelWarning,
                stacklevel=2,
            )
        if force:
            raise InputError(
                f"fast summation cannot reach tol={tol:g} at beta=max ||A_h|| = "
                f"{float(torch.linalg.matrix_norm(heads.A.double(), ord=2).max()):.3g} within "
                f"{fastsum.MAX_FEATURES} features; use backend 'auto' (dense) or a larger tolerance (kernel.tolerance)",
                hint=Hint("kernel.backend", "auto"),
            )
        return None
    if force:
        return fp
    H = heads.H
    fast_flops = 2.0 * N * fp.features * (H + 1) * (d + 1)
    dense_flops = PAIR_COST_IN_FLOPS * H * float(N) ** 2
    return fp if fast_flops < dense_flops else None
