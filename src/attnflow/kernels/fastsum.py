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

On the CPU (with numba) the per-token loops and the coefficient builds are compiled
(:mod:`attnflow.kernels._fastsum_cpu`); elsewhere (CUDA) torch operations do the same.

Tokens must lie on the sphere: off-sphere inputs (a Runge-Kutta stage) are evaluated at their
directions ``x / |x|``, a smooth extension of the field that keeps the integrators' order.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np
import torch
from numpy.polynomial import chebyshev
from scipy.special import ive

from attnflow.core.errors import InputError, NumericalError

#: Largest dimension handled (the monomial count grows like ``P^(d-1)``).
MAX_DIM = 4
#: Largest expansion degree used; beyond it (large ``beta`` or tiny ``tol``) the dense kernel is used.
MAX_DEGREE = 40
#: Largest feature count used; beyond it the coefficient matrices cost more than they save.
MAX_FEATURES = 2048
#: float64 unit roundoff; the monomial sums cancel down from ``~exp(beta)`` to ``Z >= exp(-beta)``-ish
#: values, and measured errors stay below ``ROUNDING * exp(beta)`` (up to beta = 12).
ROUNDING = float(np.finfo(np.float64).eps)
#: Tokens per block: the block's feature matrix (a few MiB) stays in the CPU caches between being
#: built and being multiplied, which measured 4-5x faster than blocks of 32768 (memory-bound).
BLOCK_TOKENS = 2048
#: Tokens per block of the compiled CPU path: its feature block (``M x 128`` float64, 230 KiB at
#: ``P = 14``) stays in the core's L2 cache between being built, multiplied and divided. With the
#: whole loop compiled (no Python between blocks), 128 measured fastest (0.21 s at N = 1e6 against
#: 0.24 s for 256 to 2048).
CPU_BLOCK_TOKENS = 128


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


@dataclass(frozen=True)
class FastSumResult:
    """Output of :func:`fast_stats`: ``out`` ``(H, N, d)`` (or None), ``logZ`` ``(H, N)``,
    the plan (degree, proved bound) and, when checked, the achieved error on a subset of tokens."""

    out: torch.Tensor | None
    logZ: torch.Tensor
    plan: FastSumPlan
    achieved_error: float | None = None
    checked_tokens: int = 0
    #: Precision of the query side (features and the products ``W phi``): ``"float32"`` only where
    #: the proved bound below, added to the truncation bound, stays within ``tol``.
    precision: str = "float64"
    #: Proved bound on the relative error that float32 rounding of the query side would add
    #: (:func:`float32_rounding_bound`); ``None`` when not computed (CUDA, no numba, d = 1).
    float32_bound: float | None = None
    #: The heads mixed as they were made, ``(N, d)`` (``fast_stats(mix=...)``), else ``None``.
    mixed: torch.Tensor | None = None


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
        M = _n_monomials(P, d) + _n_monomials(P - 1, d)
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


def _mean_norm_unit(xs: torch.Tensor, a: torch.Tensor) -> float:
    """:func:`mean_norm` of tokens already on the sphere: one product ``a^T x``."""
    return min(1.0, float(torch.linalg.vector_norm(a.to(xs.dtype) @ xs)) + 1e-12)


def _n_monomials(degree: int, d: int) -> int:
    return math.comb(degree + d - 1, d - 1)


@cache
def _monomials(degree: int, d: int) -> np.ndarray:
    """Exponents ``(M, d)`` of the homogeneous monomials of ``degree`` in ``d`` variables."""
    if d == 1:
        return np.array([[degree]])
    rows = [np.concatenate([[e], rest]) for e in range(degree, -1, -1) for rest in _monomials(degree - e, d - 1)]
    return np.array(rows, dtype=np.int64).reshape(-1, d)


@cache
def _raise_maps(degree: int, d: int) -> np.ndarray:
    """``up[a, m]`` = index of ``x_a * m`` among the monomials of ``degree + 1``; shape ``(d, M)``."""
    lo, hi = _monomials(degree, d), _monomials(degree + 1, d)
    index = {tuple(e): i for i, e in enumerate(hi)}
    up = np.empty((d, len(lo)), dtype=np.int64)
    for a in range(d):
        for m, e in enumerate(lo):
            f = e.copy()
            f[a] += 1
            up[a, m] = index[tuple(f)]
    return up


@cache
def _raise_index(degree: int, d: int) -> torch.Tensor:
    """:func:`_raise_maps` as a tensor, ``(d, M_n)``."""
    return torch.from_numpy(_raise_maps(degree, d))


@cache
def _square_index(degree: int, d: int) -> torch.Tensor:
    """``sq[a, m]`` = index of ``x_a^2 * m`` among the monomials of ``degree + 2``; shape ``(d, M_n)``."""
    up0, up1 = _raise_maps(degree, d), _raise_maps(degree + 1, d)
    return torch.from_numpy(np.stack([up1[a][up0[a]] for a in range(d)]))


def _times_B(C: torch.Tensor, A: torch.Tensor, n: int) -> torch.Tensor:
    """Coefficients of ``(x^T A_h y) c(x, y)`` for a bihomogeneous ``c`` of degree ``(n, n)``; ``C`` ``(H, M_n, M_n)``.

    ``x^T A y = sum_ab A_ab x_a y_b``: the ``y_b`` factors move columns (injective, a copy), the
    ``A_ab`` mix them, the ``x_a`` factors move rows (colliding, an add), all as whole-array ops.
    """
    H, M, _ = C.shape
    d = A.shape[-1]
    up = _raise_index(n, d).to(C.device)
    M1 = _n_monomials(n + 1, d)
    D = C.new_zeros(H, d, M, M1)
    for b in range(d):
        D[:, b].index_copy_(-1, up[b], C)
    Y = torch.einsum("hab,hbmk->hamk", A, D).reshape(H, d * M, M1)
    return C.new_zeros(H, M1, M1).index_add_(1, up.reshape(-1), Y)


def _times_Q(C: torch.Tensor, n: int, d: int) -> torch.Tensor:
    """Coefficients of ``|x|^2 |y|^2 c(x, y)`` for ``c`` of degree ``(n, n)``."""
    H, M, _ = C.shape
    sq = _square_index(n, d).to(C.device).reshape(-1)
    M2 = _n_monomials(n + 2, d)
    E = C.new_zeros(H, M, M2).index_add_(2, sq, C.repeat(1, 1, d))
    return C.new_zeros(H, M2, M2).index_add_(1, sq, E.repeat(1, d, 1))


def power_coefficients(beta: float, degree: int) -> np.ndarray:
    """``c_n`` with ``p(s) = sum_n c_n s^n`` the degree-``P`` truncated Chebyshev series of ``exp`` on ``[-beta, beta]``."""
    n = np.arange(degree + 1)
    cheb = 2.0 * ive(n, beta) * math.exp(beta)
    cheb[0] /= 2.0
    t_coef = chebyshev.cheb2poly(cheb)  # in t = s / beta
    return t_coef / beta**n if beta > 0 else np.eye(1, degree + 1)[0]


def kernel_coefficients(A: np.ndarray | torch.Tensor, fp: FastSumPlan) -> tuple[Any, Any]:
    """``(C_P, C_{P-1})`` with ``p(x^T A_h y) = phi_P(x)^T C_P[h] phi_P(y) + phi_{P-1}(x)^T C_{P-1}[h] phi_{P-1}(y)`` on the sphere.

    ``A`` ``(H, d, d)`` numpy or torch (float64 on ``A``'s device); the result has the same type.
    Cost ``O(P H d^2 M_P^2)``: on the CPU by compiled loops, 4.5 ms for ``H = 8``, ``d = 3``, ``P = 18`` on
    two cores; elsewhere by whole-array torch operations (18 ms there on the CPU).
    """
    if isinstance(A, np.ndarray):
        return tuple(C.numpy() for C in kernel_coefficients(torch.from_numpy(A), fp))
    A = A.detach().to(torch.float64)
    if A.device.type == "cpu" and _loops().AVAILABLE and fp.degree >= 1:
        return _kernel_coefficients_cpu(A, fp)
    return _kernel_coefficients_torch(A, fp)


@cache
def _flat_maps(P: int, d: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The monomial counts ``M_0 .. M_P``, and the raise maps (degrees ``0 .. P - 1``) and square maps
    (degrees ``0 .. P - 2``) laid end to end, for :func:`attnflow.kernels._fastsum_cpu.kernel_coefficients_heads`."""
    sizes = np.array([_n_monomials(n, d) for n in range(P + 1)], dtype=np.int64)
    up = np.concatenate([_raise_maps(n, d).ravel() for n in range(P)])
    sq = [_square_index(n, d).numpy().ravel() for n in range(P - 1)]
    return sizes, up, np.concatenate(sq) if sq else np.zeros(0, dtype=np.int64)


def _kernel_coefficients_cpu(A: torch.Tensor, fp: FastSumPlan) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`kernel_coefficients` by the compiled loops, the heads shared between the cores: every
    matrix of a head stays in its core's caches (the whole-array torch version streams ``(H, d, M, M)``
    temporaries through memory; 18 ms against 4.5 ms at ``H = 8``, ``d = 3``, ``P = 18``)."""
    H, d, _ = A.shape
    P = fp.degree
    sizes, up, sq = _flat_maps(P, d)
    c = power_coefficients(fp.beta, P)
    An = A.contiguous().numpy()
    out_P = np.empty((H, sizes[P], sizes[P]))
    out_Q = np.empty((H, sizes[P - 1], sizes[P - 1]))
    loops = _loops()
    _on_cores(lambda k, lo, hi: loops.kernel_coefficients_heads(An, c, up, sq, sizes, lo, hi, out_P, out_Q), H)
    return torch.from_numpy(out_P), torch.from_numpy(out_Q)


def _kernel_coefficients_torch(A: torch.Tensor, fp: FastSumPlan) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`kernel_coefficients` by whole-array torch operations (any device)."""
    H, d, _ = A.shape
    P = fp.degree
    c = power_coefficients(fp.beta, P)
    powers = [A.new_ones(H, 1, 1)]  # B^n, degree (n, n)
    for n in range(P):
        powers.append(_times_B(powers[-1], A, n))

    def lifted(top: int) -> torch.Tensor:
        # Horner in Q: sum_{n = top, top-2, ...} c_n B^n Q^{(top - n)/2}.
        n = top % 2
        K = c[n] * powers[n]
        while n < top:
            K = _times_Q(K, n, d)
            n += 2
            K = K + c[n] * powers[n]
        return K

    return lifted(P), lifted(P - 1)


#: Coefficient matrices of the last few weight matrices: a Runge-Kutta step visits each stage time
#: (and the energy checks revisit them), so a handful of entries saves nearly every rebuild.
COEFFICIENT_CACHE_ENTRIES = 8
#: The caches of this module (coefficients, key moments, feature buffers) are per thread: the
#: feature buffers are written in place, so two threads must never share them.
_LOCAL = threading.local()


def _cache(name: str, factory: Callable[[], Any]) -> Any:
    value = getattr(_LOCAL, name, None)
    if value is None:
        value = factory()
        setattr(_LOCAL, name, value)
    return value


class _Clock:
    """Adds the time since its last lap to ``split[name]`` (nothing when no profile is open)."""

    def __init__(self, split: dict[str, float] | None) -> None:
        self.split, self.t = split, time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        if self.split is not None:
            self.split[name] = self.split.get(name, 0.0) + now - self.t
        self.t = now


@contextmanager
def _timed(name: str) -> Iterator[_Clock]:
    clock = _Clock(getattr(_LOCAL, "split", None))
    yield clock
    clock.lap(name)


@contextmanager
def profile() -> Iterator[dict[str, float]]:
    """Seconds spent per part of :func:`fast_stats` inside the block, in this thread: ``moments``
    (key side), ``coefficients`` (``C^h`` builds and the products ``C^h G``), ``features`` (query
    side), ``evaluation`` (the products ``W phi``), ``division`` (``out`` and ``Z``), ``logZ`` and
    ``total``. The compiled query loop does the middle three block by block; a profile splits its
    time by rerunning it without its later stages (the reruns are not in ``total``)."""
    split: dict[str, float] = {}
    previous = getattr(_LOCAL, "split", None)
    _LOCAL.split = split
    start = time.perf_counter()
    try:
        yield split
    finally:
        split["total"] = split.get("total", 0.0) + time.perf_counter() - start - split.pop("rerun", 0.0)
        _LOCAL.split = previous


def _cached_coefficients(A: torch.Tensor, fp: FastSumPlan) -> tuple[torch.Tensor, torch.Tensor]:
    cache: OrderedDict[tuple, tuple[torch.Tensor, torch.Tensor]] = _cache("coefficients", OrderedDict)
    key = (A.cpu().numpy().tobytes(), tuple(A.shape), str(A.device), fp.degree, fp.beta)
    if key in cache:
        cache.move_to_end(key)
    else:
        cache[key] = kernel_coefficients(A, fp)
        while len(cache) > COEFFICIENT_CACHE_ENTRIES:
            cache.popitem(last=False)
    return cache[key]


def monomial_features(x: torch.Tensor, degree: int) -> torch.Tensor:
    """``phi(x)`` ``(N, M)``: every homogeneous monomial of ``degree`` at each row of ``x`` (order of ``_monomials``)."""
    M = _n_monomials(degree, x.shape[-1])
    return features(x, degree + 1)[:, -M:] if degree >= 0 else x.new_zeros(x.shape[0], 0)


def features(x: torch.Tensor, P: int) -> torch.Tensor:
    """``[phi_P(x), phi_{P-1}(x)]`` ``(N, M_P + M_{P-1})``."""
    return _FeatureBuilder(P, x.shape[-1], x.shape[0], x.dtype, x.device)(x).T.clone()


class _FeatureBuilder:
    """Builds ``[phi_P; phi_{P-1}]`` ``(M, n)`` for blocks of up to ``n`` tokens into reused buffers.

    Rows follow :func:`_monomials` (first exponent descending, recursively), so every piece is a
    contiguous slice: ``phi_m(x_k..x_{d-1}) = [x_k^e phi_{m-e}(x_{k+1}..)]_{e = m..0}``, one broadcast
    product per ``(m, e)`` and, for the last two variables, one product per degree. Fresh tensors per
    block would be page-faulted in by the kernel every time (glibc maps large blocks anew), which
    measured slower than the arithmetic itself.
    """

    def __init__(self, P: int, d: int, n: int, dtype: torch.dtype, device: torch.device | str) -> None:
        self.P, self.d, self.n = P, d, n
        kw: dict[str, Any] = dict(dtype=dtype, device=device)
        self.pw = torch.empty(P + 1, d, n, **kw)  # pw[i, k] = x_k^i
        self.pwr = torch.empty(P + 1, d, n, **kw)  # pwr[i, k] = x_k^(P - i)
        # tables[k]: monomials of every degree m <= P in x_k..x_{d-1}, stacked by degree
        self.tables: dict[int, tuple[torch.Tensor, list[int]]] = {}
        for k in range(1, d - 1):
            sizes = [_n_monomials(m, d - k) for m in range(P + 1)]
            self.tables[k] = (torch.empty(sum(sizes), n, **kw), [0, *np.cumsum(sizes).tolist()])
        self.F = torch.empty(_n_monomials(P, d) + _n_monomials(P - 1, d), n, **kw)
        self._full: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] | None = None

    def _slice(self, k: int, m: int, nb: int) -> torch.Tensor:
        """Monomials of degree ``m`` in ``x_k..x_{d-1}`` (``k >= 1``), ``(M, nb)``."""
        if k == self.d - 1:
            return self.pw[m, k : k + 1, :nb]
        buf, off = self.tables[k]
        return buf[off[m] : off[m + 1], :nb]

    def _products(self, nb: int) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Every product ``out = a * b`` of a block of ``nb`` tokens, in order, as buffer views."""
        P, ops = self.P, []

        def fill(k: int, m: int, out: torch.Tensor) -> None:
            if k == self.d - 2:  # x_k^e x_{k+1}^(m-e), e = m..0: two slices of the power tables
                ops.append((out, self.pwr[P - m :, k, :nb], self.pw[: m + 1, k + 1, :nb]))
                return
            r = 0
            for e in range(m, -1, -1):
                rest = self._slice(k + 1, m - e, nb)
                ops.append((out[r : r + rest.shape[0]], self.pw[e, k, :nb], rest))
                r += rest.shape[0]

        for k in range(self.d - 2, 0, -1):
            for m in range(P + 1):
                fill(k, m, self._slice(k, m, nb))
        M_P = _n_monomials(P, self.d)
        fill(0, P, self.F[:M_P, :nb])
        if P >= 1:
            fill(0, P - 1, self.F[M_P:, :nb])
        return ops

    def __call__(self, xs: torch.Tensor) -> torch.Tensor:
        """Features of the block ``xs`` ``(nb, d)``, ``nb <= n``: a view ``(M, nb)`` of the buffer."""
        nb, P = xs.shape[0], self.P
        pw = self.pw[:, :, :nb]
        pw[0].fill_(1.0)
        pw[1].copy_(xs.T)
        for i in range(2, P + 1):
            torch.mul(pw[i - 1], pw[1], out=pw[i])
        self.pwr[:, :, :nb].copy_(pw.flip(0))
        if nb == self.n:  # the views of a full block are made once (they cost more than the products)
            if self._full is None:
                self._full = self._products(nb)
            ops = self._full
        else:
            ops = self._products(nb)
        for out, a, b in ops:
            torch.mul(a, b, out=out)
        return self.F[:, :nb]


@dataclass(frozen=True)
class _QueryRows:
    """What the query side of :func:`fast_stats` needs: the unit tokens, the plan, the rows ``Wt``
    ``(H (1 + dv), M)`` (per head ``[Z_h, V_h num_h]``), their precision and float32 bound."""

    x64: torch.Tensor
    a64: torch.Tensor
    A64: torch.Tensor
    fp: FastSumPlan
    Wt: torch.Tensor
    dv: int
    precision: str
    bound32: float | None


def _unit_cloud_and_plan(
    x: torch.Tensor, A: torch.Tensor, a: torch.Tensor, tol: float, fast_plan: FastSumPlan | None, *, jensen: bool
) -> tuple[torch.Tensor, torch.Tensor, FastSumPlan, float]:
    """``(x64, a64, plan, |m|)``: the tokens at their directions and the masses in float64, the plan
    (``fast_plan``, else one for ``tol``) and the Jensen factor ``|m|`` (``nan`` unless the plan is made
    here or ``jensen`` asks for it)."""
    d = x.shape[-1]
    if d > MAX_DIM:
        raise InputError(f"fast summation handles d <= {MAX_DIM}; got d={d}. Use the dense kernel.")
    x64 = x.detach().to(torch.float64)
    x64 = x64 / torch.linalg.vector_norm(x64, dim=-1, keepdim=True)
    a64 = a.detach().to(torch.float64)
    m_norm = _mean_norm_unit(x64, a64) if fast_plan is None or jensen else math.nan
    fp = fast_plan or plan(A, tol, m_norm)
    if fp is None:
        raise InputError(
            f"fast summation would need more than degree {MAX_DEGREE} or {MAX_FEATURES} features for tol={tol} at beta="
            f"{float(torch.linalg.matrix_norm(A.double(), ord=2).max()):.3g}; use the dense kernel or a larger tol"
        )
    return x64, a64, fp, m_norm


def _query_rows(
    x: torch.Tensor, A: torch.Tensor, V: torch.Tensor | None, a: torch.Tensor, tol: float, fast_plan: FastSumPlan | None
) -> _QueryRows:
    d = x.shape[-1]
    # The Jensen factor |m| also gives the float32 bound (the compiled path's precision).
    x64, a64, fp, m_norm = _unit_cloud_and_plan(x, A, a, tol, fast_plan, jensen=_compiled(x))
    A64 = A.detach().to(torch.float64)
    with _timed("moments"):
        G = _cached_moments(x, a, x64, a64, fp.degree)
    with _timed("coefficients"):
        C_P, C_Q = _cached_coefficients(A64, fp)
        MP = C_P.shape[-1]
        W = torch.cat([C_P @ G[:MP], C_Q @ G[MP:]], dim=1)  # (H, M, d + 1)
        if V is None:
            Wt = W[:, :, 0]  # only Z is needed: (H, M)
        else:
            # V_h folded into the coefficients: the rows give Z_h and V_h num_h, so no (H, N, d) product is left.
            V64 = V.detach().to(torch.float64)
            Wt = torch.cat([W[:, None, :, 0], V64 @ W[:, :, 1:].transpose(1, 2)], dim=1).reshape(-1, fp.features)
    dv = 0 if V is None else int(V.shape[-2])  # value rows per head (V may stack extra values)
    bound32: float | None = None
    precision = "float64"
    if _compiled(x64):
        with _timed("coefficients"):
            normV = None if V is None else torch.linalg.matrix_norm(V.detach().to(torch.float64), ord=2)
            floor = math.exp(-fp.beta * m_norm) - fp.kernel_error
            bound32 = float32_rounding_bound(Wt, (C_P, C_Q), G, normV, floor, fp.degree, d)
        if fp.relative_bound + bound32 <= fp.tol:
            precision = "float32"
    return _QueryRows(x64, a64, A64, fp, Wt, dv, precision, bound32)


def fast_stats(
    x: torch.Tensor,
    A: torch.Tensor,
    V: torch.Tensor | None,
    a: torch.Tensor,
    *,
    tol: float = 1e-10,
    fast_plan: FastSumPlan | None = None,
    check: int = 0,
    seed: int = 0,
    mix: tuple[str, torch.Tensor] | None = None,
) -> FastSumResult:
    """``out_h(x_i)`` and ``log Z_h(x_i)`` (as :func:`attnflow.kernels.dense_stats`) by fast summation.

    ``x`` ``(N, d)`` tokens on the sphere (``d <= 4``), ``A`` ``(H, d, d)``, ``V`` ``(H, d, d)`` or
    ``None`` (only ``logZ``), ``a`` ``(N,)`` masses. The relative error of ``Z`` and of ``out``
    (relative to ``||V_h||``) is at most ``tol`` (proved); ``check > 0`` also measures it on that many
    random tokens against the exact sums and reports the largest value in ``achieved_error``.
    Computes in float64 and returns the dtype of ``x``.

    ``mix = (model, w)`` (``model`` in :data:`MIX_MODELS`, head weights ``w`` ``(H,)``, the CPU's
    compiled path): the heads' outputs are mixed as they are made, and ``mixed`` ``(N, d)`` (the field
    before its tangent projection, as ``FieldStats.mixed_output``) replaces ``out``, which is then
    ``None``: no ``(H, N, d)`` array is written. Elsewhere ``mix`` is ignored (``mixed`` is ``None``).
    """
    q = _query_rows(x, A, V, a, tol, fast_plan)
    H = A.shape[0]
    if _compiled(q.x64):
        mixing = mix if mix is not None and q.dv and mix[0] in MIX_MODELS else None
        dtype32 = torch.float32 if q.precision == "float32" else torch.float64
        logZ, out = _evaluate_cpu(q.x64, q.Wt, q.fp.degree, H, q.dv, dtype32, mixing)
        mixed, out = (out, None) if mixing is not None else (None, out)
    else:
        logZ, out = _evaluate_torch(q.x64, q.Wt, q.fp.degree, H, q.dv)
        mixed = None
    V64 = None if V is None else V.detach().to(torch.float64)
    achieved = _check(q.x64, q.A64, V64, q.a64, out, logZ, check, seed)
    return FastSumResult(
        mixed=None if mixed is None else mixed.to(x.dtype),
        out=None if out is None else out.to(x.dtype),
        logZ=logZ.to(x.dtype),
        plan=q.fp,
        achieved_error=achieved,
        checked_tokens=min(check, x.shape[0]),
        precision=q.precision,
        float32_bound=q.bound32,
    )


def fast_gf_field(
    x: torch.Tensor,
    A: torch.Tensor,
    V: torch.Tensor | None,
    a: torch.Tensor,
    w: torch.Tensor,
    *,
    tol: float = 1e-10,
    fast_plan: FastSumPlan | None = None,
) -> FastSumResult:
    """The ``gf`` field before ``P_x``, ``u = sum_h w_h V_h num_h / S`` with ``S = sum_h w_h Z_h``, and ``log S``.

    Both sums are linear in the heads' rows ``[Z_h, V_h num_h]``, so the rows are summed with the
    weights ``w`` before the products: ``1 + d`` rows instead of ``H (1 + d)`` (8x fewer products at
    ``H = 8``). The result reads as one head with weight 1: ``mixed`` is ``u``, ``logZ`` ``(1, N)`` is
    ``log S``, which is all the energy, mobility, metric speed and slope need
    (:class:`attnflow.dynamics.fields.FieldStats` with ``log_w = 0``). Error: ``|S~ - S| <= eps_P`` and
    ``S >= min_h exp(-beta_h |m|)``, so ``S`` and ``u`` (relative to ``max_h ||V_h||``) keep the bound of
    :func:`fast_stats`; the float32 bound of the per-head rows bounds their weighted sums too. ``V``
    ``None`` means ``V = A``.
    """
    V = A if V is None else V
    q = _query_rows(x, A, V, a, tol, fast_plan)
    H, d = A.shape[0], x.shape[-1]
    w64 = w.detach().to(torch.float64).to(q.Wt.device)
    Wt = (w64 @ q.Wt.reshape(H, -1)).reshape(1 + d, -1)
    if _compiled(q.x64):
        dtype32 = torch.float32 if q.precision == "float32" else torch.float64
        logS, u = _evaluate_cpu(q.x64, Wt, q.fp.degree, 1, d, dtype32)
    else:
        logS, u = _evaluate_torch(q.x64, Wt, q.fp.degree, 1, d)
    assert u is not None
    return FastSumResult(
        mixed=u[0].to(x.dtype),
        out=None,
        logZ=logS.to(x.dtype),
        plan=q.fp,
        precision=q.precision,
        float32_bound=q.bound32,
    )


def fast_head_means(
    x: torch.Tensor, A: torch.Tensor, a: torch.Tensor, *, tol: float = 1e-10, fast_plan: FastSumPlan | None = None
) -> torch.Tensor:
    """``T_h = sum_i a_i Z_h(x_i) = sum_ij a_i a_j exp(x_i^T A_h x_j)`` ``(H,)``, the mean partition function
    (``F = -1/2 sum_h w_h T_h``), from the key moments alone: ``T_h ~ g^T C^h g`` with ``g = sum_j a_j phi(x_j)``
    (``G[:, 0]`` of :func:`fast_stats`), no pass over the query tokens.

    Each pair's kernel is off by at most ``eps_P`` and ``sum_ij a_i a_j = 1``, so ``|T~ - T| <= eps_P``; by
    Jensen ``T_h >= exp(-beta |m|)``, so the relative error has the bound of ``Z`` in :func:`fast_stats`
    (``plan.relative_bound``, within ``tol``). Tokens off the sphere are taken at their directions.
    """
    x64, a64, fp, _ = _unit_cloud_and_plan(x, A, a, tol, fast_plan, jensen=False)
    with _timed("moments"):
        G = _cached_moments(x, a, x64, a64, fp.degree)
    with _timed("coefficients"):
        C_P, C_Q = _cached_coefficients(A.detach().to(torch.float64), fp)
        MP = C_P.shape[-1]
        g_P, g_Q = G[:MP, 0].to(C_P.device), G[MP:, 0].to(C_P.device)
        T = (C_P @ g_P) @ g_P + (C_Q @ g_Q) @ g_Q
    if not bool((T > 0).all()):
        raise NumericalError("fast summation produced a non-positive partition function; use the dense kernel")
    return T.to(x.dtype)


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


def _evaluate_torch(
    x64: torch.Tensor, Wt: torch.Tensor, P: int, H: int, dv: int
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Query side with the torch feature builder (any device): ``R = Wt phi(x_i)`` in small blocks
    (rebuilding the features is cheaper than storing them), then ``log Z`` and ``out = V num / Z``."""
    N = x64.shape[0]
    R = x64.new_empty(Wt.shape[0], N)
    build = _builder(P, x64.shape[-1], min(N, BLOCK_TOKENS), x64.device)
    part = x64.new_empty(Wt.shape[0], min(N, BLOCK_TOKENS))
    for s in range(0, N, BLOCK_TOKENS):
        F = build(x64[s : s + BLOCK_TOKENS])
        R[:, s : s + F.shape[1]] = torch.mm(Wt, F, out=part[:, : F.shape[1]])
    if dv:
        R = R.reshape(H, dv + 1, N)
        Z, num = R[:, 0], R[:, 1:].transpose(1, 2)
    else:
        Z, num = R, None
    if bool((Z <= 0).any()):  # impossible within the proved bound; guards against misuse
        raise NumericalError("fast summation produced a non-positive partition function; use the dense kernel")
    return torch.log(Z), None if num is None else num / Z.unsqueeze(-1)


def _loops() -> Any:
    """The compiled CPU loops (:mod:`attnflow.kernels._fastsum_cpu`), imported at first use: numba's
    import costs about 0.3 s, which runs that never use fast summation should not pay."""
    from attnflow.kernels import _fastsum_cpu

    return _fastsum_cpu


def _compiled(x64: torch.Tensor) -> bool:
    """Whether the compiled CPU loops serve ``x64`` (numba present, CPU tensor, ``2 <= d <= 4``)."""
    return x64.device.type == "cpu" and 2 <= x64.shape[-1] <= MAX_DIM and bool(_loops().AVAILABLE)


@cache
def _exponents(P: int, d: int) -> np.ndarray:
    """Exponents of ``[phi_P; phi_{P-1}]`` ``(M, d)``, the feature order of :class:`_FeatureBuilder`."""
    parts = [_monomials(P, d)] + ([_monomials(P - 1, d)] if P >= 1 else [])
    return np.ascontiguousarray(np.concatenate(parts), dtype=np.int64)


@cache
def _moment_exponents(P: int, d: int) -> np.ndarray:
    """Exponents ``(K, d)`` of the monomials of degree ``P + 1`` and ``P``: their weighted moments give
    the whole key side ``G`` (:func:`_moments_to_keys`), 256 sums at ``P = 14``, ``d = 3`` instead of
    ``(P + 1)^2 (d + 1) = 900``. For ``d = 3`` in pairs ``x^a y^b z^c, x^a y^b z^(c-1)`` (the compiled
    loop forms ``x^a y^b`` once for both)."""
    if d != 3:
        parts = [_monomials(P + 1, d), _monomials(P, d)]
        return np.ascontiguousarray(np.concatenate(parts), dtype=np.int64)
    rows = []
    for a in range(P + 1, -1, -1):
        for b in range(P + 1 - a, -1, -1):
            c = P + 1 - a - b
            rows.append((a, b, c))
            if c >= 1:
                rows.append((a, b, c - 1))
    return np.array(rows, dtype=np.int64)


@cache
def _moment_pairs(P: int) -> tuple[np.ndarray, np.ndarray]:
    """For ``d = 3``: where ``x^a y^b z^c`` (degree ``P + 1``) and ``x^a y^b z^(c - 1)`` (degree ``P``; ``-1``
    when ``c = 0``) sit in :func:`_moment_exponents`, for ``a`` and then ``b`` ascending (the walk of
    :func:`attnflow.kernels._fastsum_cpu.weighted_moments3`)."""
    pos = {tuple(e): i for i, e in enumerate(_moment_exponents(P, 3).tolist())}
    hi, lo = [], []
    for a in range(P + 2):
        for b in range(P + 2 - a):
            c = P + 1 - a - b
            hi.append(pos[(a, b, c)])
            lo.append(pos[(a, b, c - 1)] if c >= 1 else -1)
    return np.array(hi, dtype=np.int64), np.array(lo, dtype=np.int64)


@cache
def _moment_positions(P: int, d: int) -> tuple[np.ndarray, np.ndarray]:
    """Where the monomials of degree ``P + 1`` and ``P`` (order of :func:`_monomials`) sit in :func:`_moment_exponents`."""
    pos = {tuple(e): i for i, e in enumerate(_moment_exponents(P, d).tolist())}
    hi, lo = (np.array([pos[tuple(e)] for e in _monomials(n, d).tolist()]) for n in (P + 1, P))
    return hi, lo


def _moments_to_keys(mu: np.ndarray, P: int, d: int) -> np.ndarray:
    """``G`` ``(M, d + 1)`` (:func:`_cached_moments`) from the moments ``mu`` of :func:`_moment_exponents`.

    ``x_a phi_P`` and ``x_a phi_{P-1}`` are monomials of degree ``P + 1`` and ``P``, and so is ``phi_P``
    itself; ``phi_{P-1} = sum_a x_a^2 phi_{P-1}`` on the sphere (degree ``P + 1``).
    """
    at_hi, at_lo = _moment_positions(P, d)
    hi, lo = mu[at_hi], mu[at_lo]
    up_P, up_Q = _raise_maps(P, d), _raise_maps(P - 1, d)
    sq_Q = _square_index(P - 1, d).numpy()
    G_P = np.column_stack([lo, *(hi[up_P[a]] for a in range(d))])
    G_Q = np.column_stack([hi[sq_Q].sum(0), *(lo[up_Q[a]] for a in range(d))])
    return np.concatenate([G_P, G_Q])


_THREADS_LOCK = threading.Lock()
_SINGLE_THREADED = {"depth": 0, "threads": 1}


def _workers(tasks: int) -> int:
    """Python threads for ``tasks`` shares of work: torch's thread count (the one saved while
    :func:`_torch_on_one_thread` holds it at 1), at most one per task."""
    threads = torch.get_num_threads() if _SINGLE_THREADED["depth"] == 0 else _SINGLE_THREADED["threads"]
    return max(1, min(threads, tasks))


#: Models whose head mix the compiled loop can apply (``fast_stats(mix=...)``): ``mha`` (constant
#: weights) and ``gf`` (softmax weights, ``sum_h w_h V_h num_h / sum_h w_h Z_h``).
MIX_MODELS = {"mha": 1, "gf": 2}

_BLAS_LIMIT: list[Any] = []


@cache
def _blas_pools() -> Any:
    """The BLAS libraries' thread pools (threadpoolctl), found once: numba's ``np.dot`` in the compiled
    loops calls SciPy's OpenBLAS, whose own threads would take turns with the per-core loops."""
    from threadpoolctl import ThreadpoolController

    _loops()  # loads the BLAS that the loops call, so that the controller sees it
    # Only the BLAS pools: restoring a limit resets every pool of its controller, and torch's OpenMP
    # pool is set and restored on its own.
    return ThreadpoolController().select(user_api="blas")


@contextmanager
def _torch_on_one_thread() -> Iterator[None]:
    """torch and the BLAS libraries on one thread inside the block.

    Nested and concurrent blocks (several Python threads evaluating at once) share one saved
    count, restored when the last one leaves, so the process never keeps the lowered setting.
    torch's thread count is process-wide: torch work in other threads of the process also runs on
    one thread while a block is open (it is still correct, only not parallel).
    """
    with _THREADS_LOCK:
        if _SINGLE_THREADED["depth"] == 0:
            _SINGLE_THREADED["threads"] = torch.get_num_threads()
            torch.set_num_threads(1)
            _BLAS_LIMIT.append(_blas_pools().limit(limits=1))
        _SINGLE_THREADED["depth"] += 1
    try:
        yield
    finally:
        with _THREADS_LOCK:
            _SINGLE_THREADED["depth"] -= 1
            if _SINGLE_THREADED["depth"] == 0:
                torch.set_num_threads(_SINGLE_THREADED["threads"])
                _BLAS_LIMIT.pop().restore_original_limits()


def _on_cores(job: Callable[[int, int, int], None], tasks: int) -> None:
    """Run ``job(k, lo, hi)`` over ``tasks`` split into :func:`_workers` contiguous shares ``k`` (one
    Python thread each; the compiled loops release the GIL), torch on one thread meanwhile;
    re-raises a failure."""
    T = _workers(tasks)
    with _torch_on_one_thread():
        errors: list[BaseException] = []

        def share(k: int) -> None:
            try:
                job(k, k * tasks // T, (k + 1) * tasks // T)
            except BaseException as e:  # re-raised in the calling thread
                errors.append(e)

        workers = [threading.Thread(target=share, args=(k,), daemon=True) for k in range(1, T)]
        for w in workers:
            w.start()
        share(0)
        for w in workers:
            w.join()
        if errors:
            raise errors[0]


def _evaluate_cpu(
    x64: torch.Tensor,
    Wt: torch.Tensor,
    P: int,
    H: int,
    dv: int,
    dtype: torch.dtype = torch.float64,
    mix: tuple[str, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Query side on the CPU: one compiled loop per core over blocks of :data:`CPU_BLOCK_TOKENS`
    tokens, each block's features, product ``R = Wt F`` (BLAS; that orientation runs near the GEMM
    peak, ``F^T Wt^T`` measured 3x slower) and division made while the block is in the cache
    (:func:`attnflow.kernels._fastsum_cpu.evaluate_blocks`); then ``log Z`` in one vectorised pass.

    Nothing returns to Python between blocks: per-block calls from Python (a numba dispatch and a
    torch product each) cost ~20 us, which at small blocks outweighed what the caches gave. BLAS and
    torch run on one thread meanwhile (:func:`_torch_on_one_thread`): two thread pools taking turns
    with the per-core loops spin while the other works (at N = 1e6 under load 2.4-7.3 s against
    0.63-0.69 s). No ``(rows, N)`` array of products is made (its fresh pages alone, 256 MB at
    N = 1e6, cost ~20 ms to fault in).
    """
    N = x64.shape[0]
    xn = x64.numpy()
    exps = _exponents(P, x64.shape[-1])
    nb = min(N, CPU_BLOCK_TOKENS)
    blocks = -(-N // nb)
    Wn = Wt.to(dtype).contiguous().numpy()
    np_dtype = Wn.dtype
    loops = _loops()
    mode = 0 if mix is None else MIX_MODELS[mix[0]]
    out = np.empty((H, N, dv) if mode == 0 else (0, 0, 0))
    u = np.empty((N, dv) if mode else (0, 0))
    c = np.zeros(H) if mix is None else mix[1].detach().to(torch.float64).cpu().numpy()
    Z = np.empty((H, N))  # Z, then log Z in place

    T = _workers(blocks)  # the shares _on_cores makes: one feature and product buffer each
    kept = _cache("cpu_features", dict)
    key = (exps.shape[0], Wn.shape[0], nb, np_dtype, T)
    if kept.get("key") != key:
        kept.clear()
        kept.update(
            key=key,
            bufs=[np.empty((exps.shape[0], nb), dtype=np_dtype) for _ in range(T)],
            prods=[np.empty((Wn.shape[0], nb), dtype=np_dtype) for _ in range(T)],
        )
    bufs: list[np.ndarray] = kept["bufs"]
    prods: list[np.ndarray] = kept["prods"]
    ok: list[bool] = []

    def run(stages: int, out: np.ndarray = out, u: np.ndarray = u, Z: np.ndarray = Z) -> float:
        start = time.perf_counter()
        _on_cores(
            lambda k, lo, hi: ok.append(
                loops.evaluate_blocks(xn, exps, P, Wn, lo, hi, H, dv, out, Z, bufs[k], prods[k], stages, c, mode, u)
            ),
            blocks,
        )
        return time.perf_counter() - start

    whole = run(3)
    split: dict[str, float] | None = getattr(_LOCAL, "split", None)
    if split is not None:
        # A profile splits the loop's time by rerunning it: features only, features and products,
        # division only (into scratch arrays). The three are scaled to the fused loop's own time;
        # the reruns are left out of the profile's total.
        good = all(ok)
        built, both = run(1), run(2)
        divided = run(4, np.empty_like(out), np.empty_like(u), np.empty_like(Z))
        ok[:] = [good]
        parts = {"features": built, "evaluation": max(0.0, both - built), "division": divided}
        scale = whole / sum(parts.values())
        for name, t in parts.items():
            split[name] = split.get(name, 0.0) + t * scale
        split["rerun"] = split.get("rerun", 0.0) + built + both + divided
    if not all(ok):
        raise NumericalError("fast summation produced a non-positive partition function; use the dense kernel")
    with _timed("logZ"):
        logZ = torch.from_numpy(Z)
        torch.log(logZ, out=logZ)  # vectorised, on every thread
    if mode:
        return logZ, torch.from_numpy(u)
    return logZ, torch.from_numpy(out) if dv else None


def _cached_moments(x: torch.Tensor, a: torch.Tensor, x64: torch.Tensor, a64: torch.Tensor, P: int) -> torch.Tensor:
    """``G = sum_j a_j [phi_P; phi_{P-1}](x_j) [1, x_j^T]`` ``(M, d + 1)``, shared by every head.

    Kept for the last token cloud: a Runge-Kutta recorder evaluates the same tokens with several
    weight matrices (the energy at both ends of a step), and the moments do not depend on them.
    """
    kept: dict[str, object] = _cache("moments", dict)
    key = (P, x.device, x._version, a._version)
    if kept.get("x") is x and kept.get("a") is a and kept.get("key") == key:
        return kept["G"]  # type: ignore[return-value]
    d = x64.shape[-1]
    N = x64.shape[0]
    if _compiled(x64):
        loops = _loops()
        exps, xn, wn = _moment_exponents(P, d), x64.numpy(), a64.contiguous().numpy()
        acc = np.zeros((loops.GROUPS, exps.shape[0]))
        if d == 3:
            k_hi, k_lo = _moment_pairs(P)
            _on_cores(lambda k, lo, hi: loops.weighted_moments3(xn, wn, P + 1, k_hi, k_lo, lo, hi, acc), loops.GROUPS)
        else:
            _on_cores(lambda k, lo, hi: loops.weighted_moments(xn, wn, exps, P + 1, lo, hi, acc), loops.GROUPS)
        G = torch.from_numpy(_moments_to_keys(acc.sum(0), P, d))  # the groups in a fixed order, whatever the threads
    else:
        G = x64.new_zeros(_n_monomials(P, d) + _n_monomials(P - 1, d), d + 1)
        build = _builder(P, d, min(N, BLOCK_TOKENS), x64.device)
        for s in range(0, N, BLOCK_TOKENS):
            xs = x64[s : s + BLOCK_TOKENS]
            rhs = a64[s : s + BLOCK_TOKENS, None] * torch.cat([xs.new_ones(len(xs), 1), xs], dim=1)
            G.addmm_(build(xs), rhs)
    kept.update(x=x, a=a, key=key, G=G)
    return G


def _builder(P: int, d: int, n: int, device: torch.device) -> _FeatureBuilder:
    """The float64 feature workspace for ``(P, d)``, kept between calls (the buffers are reused)."""
    kept: dict[str, object] = _cache("builder", dict)
    key = (P, d, n, str(device))
    if kept.get("key") != key:
        kept.clear()
        kept.update(key=key, value=_FeatureBuilder(P, d, n, torch.float64, device))
    return kept["value"]  # type: ignore[return-value]


def _check(
    x: torch.Tensor,
    A: torch.Tensor,
    V: torch.Tensor | None,
    a: torch.Tensor,
    out: torch.Tensor | None,
    logZ: torch.Tensor,
    check: int,
    seed: int,
) -> float | None:
    """Largest relative error of ``Z`` and of ``out`` (per ``||V_h||``) on ``check`` random tokens."""
    if check <= 0:
        return None
    N = x.shape[0]
    g = torch.Generator().manual_seed(seed)
    idx = torch.randperm(N, generator=g)[: min(check, N)].to(x.device)
    err = 0.0
    log_a = torch.log(a)
    for h in range(A.shape[0]):  # one head at a time: (n, N) logits, not (H, n, N) (6 GiB at N = 1e6)
        logits = x[idx] @ A[h] @ x.T + log_a
        lz = torch.logsumexp(logits, dim=-1)
        err = max(err, float(torch.expm1((logZ[h, idx] - lz).abs()).max()))
        if V is not None and out is not None:
            exact = (torch.exp(logits - lz.unsqueeze(-1)) @ x) @ V[h].T
            normV = float(torch.linalg.matrix_norm(V[h], ord=2).clamp_min(1e-300))
            err = max(err, float((torch.linalg.vector_norm(out[h, idx] - exact, dim=-1) / normV).max()))
    return err


#: Former name (kept: it is public), see the naming scheme in :mod:`attnflow.kernels`.
fast_attention_stats = fast_stats
