"""Fast summation of the attention kernel in low dimension (``d <= 4``): ``O(N)`` instead of ``O(N^2)``.

Expansion. On ``[-beta, beta]`` with ``beta >= ||A_h||_op >= |x^T A_h y|`` (unit ``x, y``) the
truncated Chebyshev series of ``exp`` (coefficients ``I_0(beta)``, ``2 I_n(beta)``, ``I_n`` the
modified Bessel functions) gives a polynomial ``p`` of degree ``P`` with

    ``|exp(s) - p(s)| <= eps_P := 2 sum_{n>P} I_n(beta)``

(``|T_n| <= 1``; the far tail is bounded through ``I_n(beta) <= (beta/2)^n I_0(beta) / n!``). ``p(x^T A y)`` is a polynomial in ``x`` and ``y``;
on the sphere ``|x|^2 = 1``, so every term of degree ``n`` can be lifted to degree ``P`` or
``P - 1`` (same parity) by powers of ``|x|^2 |y|^2``. The kernel becomes two bilinear forms in the
homogeneous monomials ``phi_P`` and ``phi_{P-1}`` of degree ``P`` and ``P - 1``,

    ``p(x^T A_h y) = phi_P(x)^T C^h_P phi_P(y) + phi_{P-1}(x)^T C^h_{P-1} phi_{P-1}(y)``,

with ``(P+1)^2`` features in all for ``d = 3``. The key side collapses to the moments
``G = sum_j a_j phi(x_j) [1, x_j^T]`` (shared by every head, since ``V_h x_j`` is linear; every entry
is a moment of a monomial of degree ``P + 1`` or ``P``, using ``|x|^2 = 1`` for ``phi_{P-1}``, so the
compiled path sums those ``(P + 2)^2`` moments, not ``(d + 1) (P + 1)^2`` products), so
``Z_h(x_i) ~ phi(x_i)^T C^h G[:, 0]`` and ``sum_j a_j k_h(x_i, x_j) V_h x_j ~ V_h G[:, 1:]^T C^h phi(x_i)``
cost ``O(N (P+1)^2 H d)``.

Error (per token, per head): ``|Z~ - Z| <= eps_P`` and, since ``out_h`` is a convex combination of
the ``V_h x_j``, ``|out~ - out| <= 2 eps_P ||V_h|| / Z~``. By Jensen,
``Z_h(x) >= exp(x^T A_h m) >= exp(-beta |m|) =: z`` with ``m = sum_j a_j x_j`` the mean token, so both
relative errors are at most ``2 eps_P / (z - eps_P)``; the degree is the smallest making this plus
the float64 rounding estimate ``2.2e-16 exp(beta)`` (cancellation in the monomial basis, measured,
not proved) ``<= tol``; when the rounding alone exceeds ``tol`` (large ``beta``) no plan is made. The achieved error on a random subset of tokens,
against the exact dense sums, is reported when asked (``check``).

Precision of the query side. The products ``W phi(x_i)`` (``W = C^h G``, rows ``[Z_h, V_h num_h]``)
run in float32 when :func:`float32_rounding_bound`, a proved bound from ``sum_k |W_rk|`` (every
monomial is at most 1 on the sphere), plus the truncation bound stays within ``tol``; otherwise in
float64. In the monomial basis the sums cancel (``sum_k |W_k|`` is about 1e4 at ``beta = 4``, degree
14, against ``Z ~ 1``), so float32 qualifies only at small ``beta`` or loose tolerances.

Two shortcuts of the same bound: the ``gf`` field ``sum_h w_h V_h num_h / sum_h w_h Z_h`` is linear in
the rows ``[Z_h, V_h num_h]``, so :func:`fast_gf_field` sums them with the head weights before the
products (``1 + d`` rows instead of ``H (1 + d)``); and ``sum_i a_i Z_h(x_i) ~ g^T C^h g`` needs only the
key moments ``g = G[:, 0]`` (:func:`fast_head_means`, the energy).

Tokens must lie on the sphere: off-sphere inputs (a Runge-Kutta stage) are evaluated at their
directions ``x / |x|``, a smooth extension of the field that keeps the integrators' order.

The package, one part a module:

* :mod:`~attnflow.kernels.fastsum.bounds`: the plan (degree for ``beta`` and ``tol``) and the error bounds;
* :mod:`~attnflow.kernels.fastsum.coefficients`: the matrices ``C^h_P``, ``C^h_{P-1}``;
* :mod:`~attnflow.kernels.fastsum.features`: the monomials, their index tables, the feature builder;
* :mod:`~attnflow.kernels.fastsum.cpu`: the per-token loops compiled for the CPU (numba); elsewhere
  (CUDA) torch operations do the same;
* :mod:`~attnflow.kernels.fastsum.parallel`: the loops on several cores, the pools on one thread meanwhile;
* :mod:`~attnflow.kernels.fastsum.evaluator`: :class:`FastSumEvaluator`, a run's caches and thread
  policy (:class:`~attnflow.core.threads.ThreadPolicy`), and the evaluations;
* :mod:`~attnflow.kernels.fastsum.profiling`: :func:`profile`, where the time goes;
* :mod:`~attnflow.kernels.fastsum.circle`: on the circle (``d = 2``) with conformal heads the same series read
  as a Fourier series (``T_k(cos u) = cos(k u)``), ``O(N K)`` and exact to rounding; the dispatcher
  (:func:`attnflow.kernels.head_stats`) and the fields take it wherever fast summation is chosen there.
"""

from __future__ import annotations

from attnflow.kernels.fastsum.bounds import (
    MAX_DEGREE,
    MAX_DIM,
    MAX_FEATURES,
    ROUNDING,
    FastSumPlan,
    chebyshev_tail_bound,
    float32_rounding_bound,
    mean_norm,
    plan,
    relative_bound,
)
from attnflow.kernels.fastsum.coefficients import (
    kernel_coefficients,
    kernel_coefficients_cpu,
    kernel_coefficients_torch,
    power_coefficients,
)
from attnflow.kernels.fastsum.evaluator import (
    COEFFICIENT_CACHE_ENTRIES,
    CPU_BLOCK_TOKENS,
    MIX_MODELS,
    FastSumEvaluator,
    FastSumResult,
    fast_gf_field,
    fast_head_means,
    fast_stats,
)
from attnflow.kernels.fastsum.features import (
    BLOCK_TOKENS,
    MonomialTables,
    feature_exponents,
    features,
    moment_exponents,
    moment_pairs,
    moments_to_keys,
    monomial_features,
    monomials,
    n_monomials,
)
from attnflow.kernels.fastsum.profiling import _LOCAL as _LOCAL  # the open profile of this thread (tests read it)
from attnflow.kernels.fastsum.profiling import profile

#: Former name (kept: it is public), see the naming scheme in :mod:`attnflow.kernels`.
fast_attention_stats = fast_stats

__all__ = [
    "BLOCK_TOKENS",
    "COEFFICIENT_CACHE_ENTRIES",
    "CPU_BLOCK_TOKENS",
    "MAX_DEGREE",
    "MAX_DIM",
    "MAX_FEATURES",
    "MIX_MODELS",
    "ROUNDING",
    "FastSumEvaluator",
    "FastSumPlan",
    "FastSumResult",
    "MonomialTables",
    "chebyshev_tail_bound",
    "fast_attention_stats",
    "fast_gf_field",
    "fast_head_means",
    "fast_stats",
    "feature_exponents",
    "features",
    "float32_rounding_bound",
    "kernel_coefficients",
    "kernel_coefficients_cpu",
    "kernel_coefficients_torch",
    "mean_norm",
    "moment_exponents",
    "moment_pairs",
    "moments_to_keys",
    "monomial_features",
    "monomials",
    "n_monomials",
    "plan",
    "power_coefficients",
    "profile",
    "relative_bound",
]
