"""The monomial features of fast summation: ``phi_P(x)`` and ``phi_{P-1}(x)``, their index tables and
the key side's moments.

``phi_n(x)`` lists every homogeneous monomial of degree ``n`` in ``d`` variables, first exponent
descending (recursively). The kernel is a bilinear form in ``[phi_P; phi_{P-1}]``; the maps that
multiply a monomial by ``x_a`` or ``x_a^2`` (:class:`MonomialTables`) build the coefficients, and the
moments of the monomials of degree ``P + 1`` and ``P`` give the whole key side ``G``
(:func:`moments_to_keys`).

The tables are pure functions of ``(P, d)``. A :class:`MonomialTables` builds each on first use and
keeps it; the evaluator of a run (:class:`~attnflow.kernels.fastsum.evaluator.FastSumEvaluator`) owns
one per ``(P, d)``, so nothing is kept at module level.
"""

from __future__ import annotations

import math
from functools import cached_property
from typing import Any

import numpy as np
import torch

#: Tokens per block of the torch feature builder: the block's feature matrix (a few MiB) stays in the
#: CPU caches between being built and being multiplied, which measured 4-5x faster than blocks of
#: 32768 (memory-bound).
BLOCK_TOKENS = 2048


def n_monomials(degree: int, d: int) -> int:
    """``M_n = C(n + d - 1, d - 1)``, the number of homogeneous monomials of ``degree`` in ``d`` variables."""
    return math.comb(degree + d - 1, d - 1)


class MonomialTables:
    """The index tables of the expansion of degree ``P`` in ``d`` variables, each built on first use.

    ``monomials(n)``: exponents ``(M_n, d)``; ``raise_map(n)[a, m]``: index of ``x_a * m`` among the
    monomials of degree ``n + 1``; ``square_map(n)[a, m]``: of ``x_a^2 * m`` in degree ``n + 2``;
    ``exponents``: of ``[phi_P; phi_{P-1}]``; ``moment_exponents``, ``moment_pairs``,
    ``moment_positions``: the key side's moments; ``flat``: the maps laid end to end for the compiled
    coefficient build.
    """

    def __init__(self, P: int, d: int) -> None:
        self.P, self.d = P, d
        self._monomials: dict[tuple[int, int], np.ndarray] = {}
        self._raise: dict[int, np.ndarray] = {}
        self._square: dict[int, np.ndarray] = {}
        self._torch: dict[tuple[str, int], torch.Tensor] = {}

    def monomials(self, degree: int, d: int | None = None) -> np.ndarray:
        """Exponents ``(M, d)`` of the homogeneous monomials of ``degree`` in ``d`` variables."""
        d = self.d if d is None else d
        key = (degree, d)
        if key not in self._monomials:
            if d == 1:
                value = np.array([[degree]])
            else:
                rows = [
                    np.concatenate([[e], rest])
                    for e in range(degree, -1, -1)
                    for rest in self.monomials(degree - e, d - 1)
                ]
                value = np.array(rows, dtype=np.int64).reshape(-1, d)
            self._monomials[key] = value
        return self._monomials[key]

    def raise_map(self, degree: int) -> np.ndarray:
        """``up[a, m]`` = index of ``x_a * m`` among the monomials of ``degree + 1``; shape ``(d, M)``."""
        if degree not in self._raise:
            lo, hi = self.monomials(degree), self.monomials(degree + 1)
            index = {tuple(e): i for i, e in enumerate(hi.tolist())}
            up = np.empty((self.d, len(lo)), dtype=np.int64)
            for a in range(self.d):
                for m, e in enumerate(lo.tolist()):
                    e[a] += 1
                    up[a, m] = index[tuple(e)]
            self._raise[degree] = up
        return self._raise[degree]

    def square_map(self, degree: int) -> np.ndarray:
        """``sq[a, m]`` = index of ``x_a^2 * m`` among the monomials of ``degree + 2``; shape ``(d, M_n)``."""
        if degree not in self._square:
            up0, up1 = self.raise_map(degree), self.raise_map(degree + 1)
            self._square[degree] = np.stack([up1[a][up0[a]] for a in range(self.d)])
        return self._square[degree]

    def raise_index(self, degree: int) -> torch.Tensor:
        """:meth:`raise_map` as a tensor (the torch coefficient build)."""
        key = ("raise", degree)
        if key not in self._torch:
            self._torch[key] = torch.from_numpy(self.raise_map(degree))
        return self._torch[key]

    def square_index(self, degree: int) -> torch.Tensor:
        """:meth:`square_map` as a tensor."""
        key = ("square", degree)
        if key not in self._torch:
            self._torch[key] = torch.from_numpy(self.square_map(degree))
        return self._torch[key]

    @cached_property
    def exponents(self) -> np.ndarray:
        """Exponents of ``[phi_P; phi_{P-1}]`` ``(M, d)``, the feature order of :class:`FeatureBuilder`."""
        P = self.P
        parts = [self.monomials(P)] + ([self.monomials(P - 1)] if P >= 1 else [])
        return np.ascontiguousarray(np.concatenate(parts), dtype=np.int64)

    @cached_property
    def moment_exponents(self) -> np.ndarray:
        """Exponents ``(K, d)`` of the monomials of degree ``P + 1`` and ``P``: their weighted moments give
        the whole key side ``G`` (:func:`moments_to_keys`), 256 sums at ``P = 14``, ``d = 3`` instead of
        ``(P + 1)^2 (d + 1) = 900``. For ``d = 3`` in pairs ``x^a y^b z^c, x^a y^b z^(c-1)`` (the compiled
        loop forms ``x^a y^b`` once for both)."""
        P, d = self.P, self.d
        if d != 3:
            parts = [self.monomials(P + 1), self.monomials(P)]
            return np.ascontiguousarray(np.concatenate(parts), dtype=np.int64)
        rows = []
        for a in range(P + 1, -1, -1):
            for b in range(P + 1 - a, -1, -1):
                c = P + 1 - a - b
                rows.append((a, b, c))
                if c >= 1:
                    rows.append((a, b, c - 1))
        return np.array(rows, dtype=np.int64)

    @cached_property
    def moment_pairs(self) -> tuple[np.ndarray, np.ndarray]:
        """For ``d = 3``: where ``x^a y^b z^c`` (degree ``P + 1``) and ``x^a y^b z^(c - 1)`` (degree ``P``;
        ``-1`` when ``c = 0``) sit in :attr:`moment_exponents`, for ``a`` and then ``b`` ascending (the walk
        of :func:`attnflow.kernels.fastsum.cpu.weighted_moments3`)."""
        P = self.P
        pos = {tuple(e): i for i, e in enumerate(self.moment_exponents.tolist())}
        hi, lo = [], []
        for a in range(P + 2):
            for b in range(P + 2 - a):
                c = P + 1 - a - b
                hi.append(pos[(a, b, c)])
                lo.append(pos[(a, b, c - 1)] if c >= 1 else -1)
        return np.array(hi, dtype=np.int64), np.array(lo, dtype=np.int64)

    @cached_property
    def moment_positions(self) -> tuple[np.ndarray, np.ndarray]:
        """Where the monomials of degree ``P + 1`` and ``P`` sit in :attr:`moment_exponents`."""
        pos = {tuple(e): i for i, e in enumerate(self.moment_exponents.tolist())}
        hi, lo = (np.array([pos[tuple(e)] for e in self.monomials(n).tolist()]) for n in (self.P + 1, self.P))
        return hi, lo

    @cached_property
    def flat(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The monomial counts ``M_0 .. M_P``, and the raise maps (degrees ``0 .. P - 1``) and square maps
        (degrees ``0 .. P - 2``) laid end to end, for :func:`attnflow.kernels.fastsum.cpu.kernel_coefficients_heads`."""
        P, d = self.P, self.d
        sizes = np.array([n_monomials(n, d) for n in range(P + 1)], dtype=np.int64)
        up = np.concatenate([self.raise_map(n).ravel() for n in range(P)])
        sq = [self.square_map(n).ravel() for n in range(P - 1)]
        return sizes, up, np.concatenate(sq) if sq else np.zeros(0, dtype=np.int64)


def monomials(degree: int, d: int) -> np.ndarray:
    """Exponents ``(M, d)`` of the homogeneous monomials of ``degree`` in ``d`` variables."""
    return MonomialTables(degree, d).monomials(degree)


def feature_exponents(P: int, d: int) -> np.ndarray:
    """Exponents of ``[phi_P; phi_{P-1}]`` (:attr:`MonomialTables.exponents`)."""
    return MonomialTables(P, d).exponents


def moment_exponents(P: int, d: int) -> np.ndarray:
    """:attr:`MonomialTables.moment_exponents`."""
    return MonomialTables(P, d).moment_exponents


def moment_pairs(P: int) -> tuple[np.ndarray, np.ndarray]:
    """:attr:`MonomialTables.moment_pairs` (``d = 3``)."""
    return MonomialTables(P, 3).moment_pairs


def moments_to_keys(mu: np.ndarray, P: int, d: int, tables: MonomialTables | None = None) -> np.ndarray:
    """``G`` ``(M, d + 1)`` (the key side) from the moments ``mu`` of :attr:`MonomialTables.moment_exponents`.

    ``x_a phi_P`` and ``x_a phi_{P-1}`` are monomials of degree ``P + 1`` and ``P``, and so is ``phi_P``
    itself; ``phi_{P-1} = sum_a x_a^2 phi_{P-1}`` on the sphere (degree ``P + 1``).
    """
    t = MonomialTables(P, d) if tables is None else tables
    at_hi, at_lo = t.moment_positions
    hi, lo = mu[at_hi], mu[at_lo]
    up_P, up_Q = t.raise_map(P), t.raise_map(P - 1)
    sq_Q = t.square_map(P - 1)
    G_P = np.column_stack([lo, *(hi[up_P[a]] for a in range(d))])
    G_Q = np.column_stack([hi[sq_Q].sum(0), *(lo[up_Q[a]] for a in range(d))])
    return np.concatenate([G_P, G_Q])


def monomial_features(x: torch.Tensor, degree: int) -> torch.Tensor:
    """``phi(x)`` ``(N, M)``: every homogeneous monomial of ``degree`` at each row of ``x`` (order of :func:`monomials`)."""
    M = n_monomials(degree, x.shape[-1])
    return features(x, degree + 1)[:, -M:] if degree >= 0 else x.new_zeros(x.shape[0], 0)


def features(x: torch.Tensor, P: int) -> torch.Tensor:
    """``[phi_P(x), phi_{P-1}(x)]`` ``(N, M_P + M_{P-1})``."""
    return FeatureBuilder(P, x.shape[-1], x.shape[0], x.dtype, x.device)(x).T.clone()


class FeatureBuilder:
    """Builds ``[phi_P; phi_{P-1}]`` ``(M, n)`` for blocks of up to ``n`` tokens into reused buffers.

    Rows follow :func:`monomials` (first exponent descending, recursively), so every piece is a
    contiguous slice: ``phi_m(x_k..x_{d-1}) = [x_k^e phi_{m-e}(x_{k+1}..)]_{e = m..0}``, one broadcast
    product per ``(m, e)`` and, for the last two variables, one product per degree. Fresh tensors per
    block would be page-faulted in by the kernel every time (glibc maps large blocks anew), which
    measured slower than the arithmetic itself. The buffers are written in place: one builder serves
    one thread at a time.
    """

    def __init__(self, P: int, d: int, n: int, dtype: torch.dtype, device: torch.device | str) -> None:
        self.P, self.d, self.n = P, d, n
        kw: dict[str, Any] = dict(dtype=dtype, device=device)
        self.pw = torch.empty(P + 1, d, n, **kw)  # pw[i, k] = x_k^i
        self.pwr = torch.empty(P + 1, d, n, **kw)  # pwr[i, k] = x_k^(P - i)
        # tables[k]: monomials of every degree m <= P in x_k..x_{d-1}, stacked by degree
        self.tables: dict[int, tuple[torch.Tensor, list[int]]] = {}
        for k in range(1, d - 1):
            sizes = [n_monomials(m, d - k) for m in range(P + 1)]
            self.tables[k] = (torch.empty(sum(sizes), n, **kw), [0, *np.cumsum(sizes).tolist()])
        self.F = torch.empty(n_monomials(P, d) + n_monomials(P - 1, d), n, **kw)
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
        M_P = n_monomials(P, self.d)
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
