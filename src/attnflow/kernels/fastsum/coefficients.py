"""The coefficients of the expansion: ``p(x^T A_h y)`` as two bilinear forms in the monomial features.

``p`` is the degree-``P`` truncated Chebyshev series of ``exp`` on ``[-beta, beta]``
(:func:`power_coefficients`). On the sphere ``|x|^2 = 1``, so every term of degree ``n`` is lifted to
degree ``P`` or ``P - 1`` (same parity) by powers of ``|x|^2 |y|^2``:

    ``p(x^T A_h y) = phi_P(x)^T C^h_P phi_P(y) + phi_{P-1}(x)^T C^h_{P-1} phi_{P-1}(y)``.

:func:`kernel_coefficients` builds ``(C_P, C_{P-1})``: on the CPU by compiled loops, a head per core
(:func:`kernel_coefficients_cpu`), elsewhere by whole-array torch operations
(:func:`kernel_coefficients_torch`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from numpy.polynomial import chebyshev
from scipy.special import ive

from attnflow.kernels.fastsum.bounds import FastSumPlan
from attnflow.kernels.fastsum.features import MonomialTables, n_monomials
from attnflow.kernels.fastsum.parallel import loops, on_cores


def power_coefficients(beta: float, degree: int) -> np.ndarray:
    """``c_n`` with ``p(s) = sum_n c_n s^n`` the degree-``P`` truncated Chebyshev series of ``exp`` on ``[-beta, beta]``."""
    n = np.arange(degree + 1)
    cheb = 2.0 * ive(n, beta) * math.exp(beta)
    cheb[0] /= 2.0
    t_coef = chebyshev.cheb2poly(cheb)  # in t = s / beta
    return t_coef / beta**n if beta > 0 else np.eye(1, degree + 1)[0]


def _times_B(C: torch.Tensor, A: torch.Tensor, n: int, tables: MonomialTables) -> torch.Tensor:
    """Coefficients of ``(x^T A_h y) c(x, y)`` for a bihomogeneous ``c`` of degree ``(n, n)``; ``C`` ``(H, M_n, M_n)``.

    ``x^T A y = sum_ab A_ab x_a y_b``: the ``y_b`` factors move columns (injective, a copy), the
    ``A_ab`` mix them, the ``x_a`` factors move rows (colliding, an add), all as whole-array ops.
    """
    H, M, _ = C.shape
    d = A.shape[-1]
    up = tables.raise_index(n).to(C.device)
    M1 = n_monomials(n + 1, d)
    D = C.new_zeros(H, d, M, M1)
    for b in range(d):
        D[:, b].index_copy_(-1, up[b], C)
    Y = torch.einsum("hab,hbmk->hamk", A, D).reshape(H, d * M, M1)
    return C.new_zeros(H, M1, M1).index_add_(1, up.reshape(-1), Y)


def _times_Q(C: torch.Tensor, n: int, tables: MonomialTables) -> torch.Tensor:
    """Coefficients of ``|x|^2 |y|^2 c(x, y)`` for ``c`` of degree ``(n, n)``."""
    H, M, _ = C.shape
    d = tables.d
    sq = tables.square_index(n).to(C.device).reshape(-1)
    M2 = n_monomials(n + 2, d)
    E = C.new_zeros(H, M, M2).index_add_(2, sq, C.repeat(1, 1, d))
    return C.new_zeros(H, M2, M2).index_add_(1, sq, E.repeat(1, d, 1))


def kernel_coefficients(
    A: np.ndarray | torch.Tensor, fp: FastSumPlan, *, tables: MonomialTables | None = None, workers: int = 1
) -> tuple[Any, Any]:
    """``(C_P, C_{P-1})`` with ``p(x^T A_h y) = phi_P(x)^T C_P[h] phi_P(y) + phi_{P-1}(x)^T C_{P-1}[h] phi_{P-1}(y)`` on the sphere.

    ``A`` ``(H, d, d)`` numpy or torch (float64 on ``A``'s device); the result has the same type.
    Cost ``O(P H d^2 M_P^2)``: on the CPU by compiled loops on ``workers`` threads, 4.5 ms for
    ``H = 8``, ``d = 3``, ``P = 18`` on two cores; elsewhere by whole-array torch operations (18 ms
    there on the CPU). ``tables``: the :class:`MonomialTables` of ``(P, d)`` to reuse.
    """
    if isinstance(A, np.ndarray):
        return tuple(C.numpy() for C in kernel_coefficients(torch.from_numpy(A), fp, tables=tables, workers=workers))
    A = A.detach().to(torch.float64)
    if A.device.type == "cpu" and loops().AVAILABLE and fp.degree >= 1:
        return kernel_coefficients_cpu(A, fp, tables=tables, workers=workers)
    return kernel_coefficients_torch(A, fp, tables=tables)


def kernel_coefficients_cpu(
    A: torch.Tensor, fp: FastSumPlan, *, tables: MonomialTables | None = None, workers: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`kernel_coefficients` by the compiled loops, the heads shared between ``workers`` threads:
    every matrix of a head stays in its core's caches (the whole-array torch version streams
    ``(H, d, M, M)`` temporaries through memory; 18 ms against 4.5 ms at ``H = 8``, ``d = 3``, ``P = 18``)."""
    H, d, _ = A.shape
    P = fp.degree
    t = MonomialTables(P, d) if tables is None else tables
    sizes, up, sq = t.flat
    c = power_coefficients(fp.beta, P)
    An = A.contiguous().numpy()
    out_P = np.empty((H, sizes[P], sizes[P]))
    out_Q = np.empty((H, sizes[P - 1], sizes[P - 1]))
    compiled = loops()
    on_cores(
        lambda k, lo, hi: compiled.kernel_coefficients_heads(An, c, up, sq, sizes, lo, hi, out_P, out_Q), H, workers
    )
    return torch.from_numpy(out_P), torch.from_numpy(out_Q)


def kernel_coefficients_torch(
    A: torch.Tensor, fp: FastSumPlan, *, tables: MonomialTables | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`kernel_coefficients` by whole-array torch operations (any device)."""
    H, d, _ = A.shape
    P = fp.degree
    t = MonomialTables(P, d) if tables is None else tables
    c = power_coefficients(fp.beta, P)
    powers = [A.new_ones(H, 1, 1)]  # B^n, degree (n, n)
    for n in range(P):
        powers.append(_times_B(powers[-1], A, n, t))

    def lifted(top: int) -> torch.Tensor:
        # Horner in Q: sum_{n = top, top-2, ...} c_n B^n Q^{(top - n)/2}.
        n = top % 2
        K = c[n] * powers[n]
        while n < top:
            K = _times_Q(K, n, t)
            n += 2
            K = K + c[n] * powers[n]
        return K

    return lifted(P), lifted(P - 1)
