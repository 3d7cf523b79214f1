"""Which kernel evaluates ``(out_h, log Z_h)``: dense (fused ``flash`` or ``stream``) or ``fast`` summation.

:func:`head_stats` is what the fields call. ``backend="auto"`` takes the fused dense kernel, and
switches to :mod:`attnflow.fastsum` when the tokens are few-dimensional (``d <= 4``), many, and the
expansion that meets the tolerance is predicted cheaper than the ``H N^2`` pairs.

:func:`kernel_options` sets the backend and tolerance for everything evaluated inside it (the
field, the energies of the EDI budget, the diagnostics, the float32 monitor); ``simulate`` enters it
with its ``backend=`` and ``fast_tol=`` so one choice covers a whole run.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from contextvars import ContextVar

import torch

from attnflow.core.heads import Heads
from attnflow.kernels import fastsum
from attnflow.kernels.dense import KERNEL_BACKENDS, attention_stats

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

_OPTIONS: ContextVar[tuple[str, float | None]] = ContextVar("attnflow_kernel_options", default=("auto", None))


class SlowKernelWarning(UserWarning):
    """``auto`` could not use fast summation for a large token cloud: each evaluation is ``O(N^2)``."""


@contextlib.contextmanager
def kernel_options(backend: str = "auto", tol: float | None = None) -> Iterator[None]:
    """Within this block, kernel calls that do not name a backend use ``backend`` and fast-summation
    tolerance ``tol`` (``None``: :data:`AUTO_FAST_TOL` of the dtype)."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {BACKENDS}")
    if tol is not None and not tol > 0:
        raise ValueError(f"the fast-summation tolerance must be positive; got {tol}")
    token = _OPTIONS.set((backend, tol))
    try:
        yield
    finally:
        _OPTIONS.reset(token)


def current_options() -> tuple[str, float | None]:
    """``(backend, tol)`` in force (see :func:`kernel_options`)."""
    return _OPTIONS.get()


def head_stats(
    x: torch.Tensor,
    heads: Heads,
    a: torch.Tensor,
    *,
    values: bool = True,
    backend: str | None = None,
    tol: float | None = None,
    extra_values: torch.Tensor | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """``(out, logZ)`` of every head at tokens ``x`` ``(N, d)`` with masses ``a`` (see :mod:`attnflow.kernels`).

    ``backend``: one of :data:`BACKENDS` (``None``: the one of :func:`kernel_options`); ``tol`` the
    fast summation's relative tolerance (default: :func:`kernel_options`, then :data:`AUTO_FAST_TOL`).
    ``extra_values`` ``(H, e, d)``: matrices ``E_h`` whose averages ``sum_j p_hij E_h x_j`` are appended
    to ``out`` (shape ``(H, N, d + e)``) from the same pass (the EDI recorder's ``dA/dt``).
    """
    ctx_backend, ctx_tol = _OPTIONS.get()
    backend = ctx_backend if backend is None else backend
    tol = ctx_tol if tol is None else tol
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {BACKENDS}")
    if backend == "fast" and not heads.plain:
        raise ValueError(
            "fast summation covers the plain heads of docs/model.md; these heads carry biases, a causal "
            "mask or rotary embeddings: use backend 'auto' (dense)"
        )
    if backend in ("auto", "fast") and heads.plain:
        fp = choose_fast(x, heads, a, tol, force=backend == "fast")
        if fp is not None:
            V = heads.values if values else None
            if V is not None and extra_values is not None:
                V = torch.cat([V, extra_values.to(V)], dim=-2)
            res = fastsum.fast_attention_stats(x, heads.A, V, a, fast_plan=fp)
            return res.out, res.logZ
    q, k, key_bias = heads.logit_features(x)
    v = heads.value_features(x) if values else None
    if v is not None and extra_values is not None:
        v = torch.cat([v, x.unsqueeze(-3) @ extra_values.to(x).transpose(-1, -2)], dim=-1)
    dense = backend if backend in KERNEL_BACKENDS else "auto"
    return attention_stats(q, k, v, torch.log(a), key_bias=key_bias, causal=heads.causal, backend=dense)


def choose_fast(
    x: torch.Tensor, heads: Heads, a: torch.Tensor, tol: float | None, *, force: bool = False
) -> fastsum.FastSumPlan | None:
    """The fast-summation plan to use, or ``None`` for the dense kernel.

    With ``force`` (backend ``"fast"``) a plan is required and its absence is a clear error.
    """
    N, d = x.shape[-2], x.shape[-1]
    if x.ndim != 2 or d > fastsum.MAX_DIM:
        if force:
            raise ValueError(
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
            raise ValueError(
                f"fast summation cannot reach tol={tol:g} at beta=max ||A_h|| = "
                f"{float(torch.linalg.matrix_norm(heads.A.double(), ord=2).max()):.3g} within "
                f"{fastsum.MAX_FEATURES} features; use backend 'auto' (dense) or a larger tolerance"
            )
        return None
    if force:
        return fp
    H = heads.H
    fast_flops = 2.0 * N * fp.features * (H + 1) * (d + 1)
    dense_flops = PAIR_COST_IN_FLOPS * H * float(N) ** 2
    return fp if fast_flops < dense_flops else None
