"""Which kernel evaluates ``(out_h, log Z_h)``: dense (fused ``flash`` or ``stream``) or ``fast`` summation.

:func:`head_stats` is what the fields call. ``backend="auto"`` takes the fused dense kernel, and
switches to :mod:`attnflow.fastsum` when the tokens are few-dimensional (``d <= 4``), many, and the
expansion that meets the dtype's tolerance is predicted cheaper than the ``H N^2`` pairs.
"""

from __future__ import annotations

import torch

from . import fastsum
from .heads import Heads
from .kernels import KERNEL_BACKENDS, attention_stats

#: Every backend name accepted by :func:`head_stats` (and ``simulate(..., backend=...)``).
BACKENDS: tuple[str, ...] = ("auto", "flash", "stream", "fast")
#: Tolerance of the fast summation when chosen by ``auto``: below the dense kernel's own rounding.
AUTO_FAST_TOL: dict[torch.dtype, float] = {torch.float64: 1e-12, torch.float32: 1e-7}
#: ``auto`` never uses fast summation below this many tokens (the expansion's set-up dominates).
AUTO_FAST_MIN_TOKENS = 4096
#: Measured cost of one token pair of the fused kernel, in units of one float64 multiply-add of the
#: fast summation's matrix products (about 20 on the CPUs measured by ``attnflow bench``).
PAIR_COST_IN_FLOPS = 20.0


def head_stats(
    x: torch.Tensor,
    heads: Heads,
    a: torch.Tensor,
    *,
    values: bool = True,
    backend: str = "auto",
    tol: float | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """``(out, logZ)`` of every head at tokens ``x`` ``(N, d)`` with masses ``a`` (see :mod:`attnflow.kernels`).

    ``backend``: one of :data:`BACKENDS`; ``tol`` the fast summation's relative tolerance
    (default :data:`AUTO_FAST_TOL` for the dtype).
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {BACKENDS}")
    if backend == "fast" and not heads.plain:
        raise ValueError("fast summation covers the plain heads of MODEL.md; these heads carry biases, a causal "
                         "mask or rotary embeddings: use backend 'auto' (dense)")
    if backend in ("auto", "fast") and heads.plain:
        fp = choose_fast(x, heads, a, tol, force=backend == "fast")
        if fp is not None:
            res = fastsum.fast_attention_stats(x, heads.A, heads.values if values else None, a, fast_plan=fp)
            return res.out, res.logZ
    q, k, key_bias = heads.logit_features(x)
    v = heads.value_features(x) if values else None
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
            raise ValueError(f"fast summation needs one token cloud (N, d) with d <= {fastsum.MAX_DIM}; got {tuple(x.shape)}")
        return None
    if not force and N < AUTO_FAST_MIN_TOKENS:
        return None
    tol = AUTO_FAST_TOL.get(x.dtype, 1e-12) if tol is None else tol
    fp = fastsum.plan(heads.A, tol, fastsum.mean_norm(x, a))
    if fp is None:
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
