"""The plan of a fast summation and its error bounds: the degree ``P`` for ``beta`` and a tolerance.

On ``[-beta, beta]`` with ``beta >= ||A_h||_op >= |x^T A_h y|`` (unit ``x, y``) the truncated
Chebyshev series of ``exp`` of degree ``P`` is off by at most ``eps_P = 2 sum_{n>P} I_n(beta)``
(:func:`chebyshev_tail_bound`). By Jensen ``Z_h(x) >= exp(-beta |m|)`` (``m`` the mean token), so the
relative errors of ``Z`` and ``out`` are at most ``2 eps_P / (exp(-beta |m|) - eps_P)``
(:func:`relative_bound`); :func:`plan` takes the smallest degree meeting the tolerance together with
the float64 rounding estimate ``eps exp(beta)``. :func:`float32_rounding_bound` bounds what float32
would add on the query side.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from scipy.special import ive

from attnflow.core.errors import InputError
from attnflow.kernels.fastsum.features import n_monomials

#: Largest dimension handled (the monomial count grows like ``P^(d-1)``).
MAX_DIM = 4
#: Largest expansion degree used; beyond it (large ``beta`` or tiny ``tol``) the dense kernel is used.
MAX_DEGREE = 40
#: Largest feature count used; beyond it the coefficient matrices cost more than they save.
MAX_FEATURES = 2048
#: float64 unit roundoff; the monomial sums cancel down from ``~exp(beta)`` to ``Z >= exp(-beta)``-ish
#: values, and measured errors stay below ``ROUNDING * exp(beta)`` (up to beta = 12).
ROUNDING = float(np.finfo(np.float64).eps)


@dataclass(frozen=True)
class FastSumPlan:
    """Degree ``P`` chosen for ``beta = max_h ||A_h||_op`` and a tolerance, with its proved bounds."""

    degree: int
    beta: float
    tol: float
    kernel_error: float  # eps_P, bound on |exp(s) - p(s)| for |s| <= beta
    relative_bound: float  # bound on |Z~/Z - 1| and |out~ - out| / ||V_h||
    features: int
    rounding: float = 0.0  # float64 rounding estimate, eps exp(beta) (monomial cancellation)


def chebyshev_tail_bound(beta: float, degree: int, terms: int = 64) -> float:
    """Proved bound ``eps_P = 2 sum_{n>P} I_n(beta)`` on ``max_{|s| <= beta} |exp(s) - p_P(s)|``.

    The first ``terms`` Bessel terms are summed; the rest is bounded by the geometric majorant
    ``2 I_0(beta) (beta/2)^n / n! / (1 - beta / (2 (n + 1)))`` at ``n = P + terms + 1``.
    """
    if beta == 0.0:
        return 0.0
    n = np.arange(degree + 1, degree + terms + 1)
    head = 2.0 * math.exp(beta) * float(ive(n, beta).sum())
    m = degree + terms + 1
    ratio = beta / (2.0 * (m + 1))
    log_rest = math.log(2.0) + math.log(ive(0, beta)) + beta + m * math.log(beta / 2.0) - math.lgamma(m + 1)
    return head + (math.exp(log_rest) / (1.0 - ratio) if ratio < 1.0 else math.inf)


def relative_bound(beta: float, eps: float, mean_norm: float = 1.0) -> float:
    """``2 eps / (exp(-beta |m|) - eps)``: bound on the relative errors of ``Z`` and ``out`` (module docstring)."""
    floor = math.exp(-beta * mean_norm) - eps
    return 2.0 * eps / floor if floor > 0 else math.inf


def plan(A: torch.Tensor, tol: float, mean_norm: float = 1.0) -> FastSumPlan | None:
    """Smallest degree meeting ``tol`` for heads ``A`` ``(H, d, d)`` and tokens whose mean ``m`` has
    ``|m| <= mean_norm``; ``None`` when over :data:`MAX_DEGREE` or :data:`MAX_FEATURES`."""
    if not tol > 0:
        raise InputError(f"the fast-summation tolerance must be positive; got {tol}")
    d = int(A.shape[-1])
    beta = float(torch.linalg.matrix_norm(A.detach().to(torch.float64).cpu(), ord=2).max())
    for P in range(1, MAX_DEGREE + 1):
        eps = chebyshev_tail_bound(beta, P)
        rel = relative_bound(beta, eps, mean_norm)
        M = n_monomials(P, d) + n_monomials(P - 1, d)
        if M > MAX_FEATURES:
            return None
        rounding = ROUNDING * math.exp(beta)
        if rounding > tol:
            return None
        if rel + rounding <= tol:
            return FastSumPlan(P, beta, tol, eps, rel, M, rounding)
    return None


def mean_norm(x: torch.Tensor, a: torch.Tensor) -> float:
    """``|m| = |sum_j a_j x_j / |x_j||``, the Jensen factor of the error bound (plus rounding slack)."""
    # (a / |x|)^T x: an (N,) temporary, not a normalised (N, d) copy (5 ms against 9 ms at N = 1e6)
    weights = a.to(x.dtype) / torch.linalg.vector_norm(x, dim=-1)
    return min(1.0, float(torch.linalg.vector_norm(weights @ x)) + 1e-12)


def mean_norm_unit(xs: torch.Tensor, a: torch.Tensor) -> float:
    """:func:`mean_norm` of tokens already on the sphere: one product ``a^T x``."""
    return min(1.0, float(torch.linalg.vector_norm(a.to(xs.dtype) @ xs)) + 1e-12)


def float32_rounding_bound(
    Wt: torch.Tensor,
    C: tuple[torch.Tensor, torch.Tensor],
    G: torch.Tensor,
    normV: torch.Tensor | None,
    floor: float,
    P: int,
    d: int,
) -> float:
    """Proved bound on the relative error added by evaluating ``Wt phi(x)`` in float32 (query side).

    On the sphere every monomial has ``|phi_k(x)| <= 1``. Rounding ``Wt`` to float32 (``u``), building
    ``phi`` by at most ``2P + d`` products (``gamma_{2P+d}``) and the float32 dot product of length
    ``M`` in any order (``gamma_M``) move row ``r`` by at most ``(M + 2P + d + 1) u sum_k |Wt_rk|``
    (first order; ``gamma_n = n u / (1 - n u)`` is used); ``Wt`` itself carries the float64 error of
    ``C G``, ``gamma_M^{64} (|C| |G|)``. Rows are ``[Z_h, V_h num_h]`` (``normV``: ``||V_h||``, ``None``
    when there are no value rows); with
    ``Z >= floor`` (the Jensen floor minus the truncation bound) the relative errors of ``Z`` and of
    ``out = num / Z`` (per ``||V_h||``) are at most ``dZ / floor`` and ``(dnum / ||V|| + dZ) / (floor - dZ)``.
    ``inf`` when the float32 term alone exceeds 1 (then nothing else is computed).
    """
    M = Wt.shape[-1]
    u32, u64 = float(np.finfo(np.float32).eps) / 2, float(np.finfo(np.float64).eps) / 2

    def gamma(n: int, u: float) -> float:
        return n * u / (1.0 - n * u)

    if floor <= 0:
        return math.inf
    C_P, C_Q = C
    MP, H = C_P.shape[-1], C_P.shape[0]
    row_err = gamma(M + 2 * P + d + 1, u32) * Wt.abs().sum(-1).reshape(H, -1)  # (H, 1 + dv)
    if float(row_err[:, 0].max()) / floor > 1.0:
        return math.inf  # float32 is out of the question: skip the float64 part (|C| |G|)
    absCG = torch.cat([C_P.abs() @ G[:MP].abs(), C_Q.abs() @ G[MP:].abs()], dim=1)  # (H, M, d + 1)
    err64 = gamma(M, u64) * absCG.sum(1)  # (H, d + 1): float64 error of the columns of C G
    dZ = row_err[:, 0] + err64[:, 0]
    bounds = [dZ / floor]
    if normV is not None:
        # |d(V num)| <= ||row errors||_2 + ||V|| ||float64 column errors||_1, per ||V||
        dnum = torch.linalg.vector_norm(row_err[:, 1:], dim=-1) / normV + err64[:, 1:].sum(-1)
        bounds.append((dnum + dZ) / (floor - dZ).clamp_min(1e-300))
    return float(torch.stack(bounds).max())
