"""Compiled CPU loops of fast summation (numba): feature blocks, key moments, and the final division.

torch builds the monomial features of :mod:`attnflow.kernels.fastsum` with one broadcast product
per slice, about 57 small operations per block of 2048 tokens; at a million tokens their dispatch
cost more than the arithmetic (0.35 s per pass, against 0.05 s for the loops below). These loops
compute the same products in the same order of factors, so the features are identical to the torch
builder's up to the rounding of the order of their factors (tested to 1e-13 relative).

The loops are serial and release the GIL: the caller runs one Python thread per core over shares
of the work (with torch on one thread meanwhile), so no second thread pool takes turns with
torch's, each spinning while the other works. The moments are summed over fixed chunks with one
private accumulator per fixed group of chunks, so the sums do not depend on the number of threads:
a run gives the same bits on one core or two, and a resumed run repeats the uninterrupted one.
"""

from __future__ import annotations

import numpy as np

try:  # numba is a declared dependency; the torch builder stays as the fallback (and for CUDA).
    from numba import njit

    AVAILABLE = True
except ImportError:  # pragma: no cover - exercised only in installs without numba
    AVAILABLE = False


#: Tokens per chunk of the loops (their power tables stay in the L1 cache).
CHUNK = 128
#: Private accumulators of the moment sums; fixed, so the rounding does not depend on the threads.
GROUPS = 64

if AVAILABLE:

    @njit(cache=True, inline="always")
    def _powers(x: np.ndarray, lo: int, n: int, P: int, pw: np.ndarray) -> None:  # pragma: no cover - compiled
        d = x.shape[1]
        for a in range(d):
            for i in range(n):
                pw[a, 0, i] = 1.0
            for e in range(1, P + 1):
                for i in range(n):
                    pw[a, e, i] = pw[a, e - 1, i] * x[lo + i, a]

    @njit(cache=True, inline="always")
    def _product(pw: np.ndarray, e: np.ndarray, m: int, row: np.ndarray) -> None:  # pragma: no cover - compiled
        # One fixed-arity product per dimension: a loop over the factors inside the loop over the
        # tokens would not vectorise.
        d = pw.shape[0]
        r0 = pw[0, e[0]]
        r1 = pw[1, e[1]]
        if d == 2:
            for i in range(m):
                row[i] = r0[i] * r1[i]
        elif d == 3:
            r2 = pw[2, e[2]]
            for i in range(m):
                row[i] = r0[i] * r1[i] * r2[i]
        else:
            r2 = pw[2, e[2]]
            r3 = pw[3, e[3]]
            for i in range(m):
                row[i] = r0[i] * r1[i] * r2[i] * r3[i]

    @njit(cache=True, nogil=True)
    def build_features(x: np.ndarray, exps: np.ndarray, P: int, out: np.ndarray) -> None:  # pragma: no cover
        """``out[k, i] = prod_a x[i, a] ** exps[k, a]`` for the block ``x`` ``(n, d)``, ``2 <= d <= 4``;
        ``out`` ``(M, >= n)``. On one thread, without the GIL: the caller runs one block per core
        (:func:`attnflow.kernels.fastsum._evaluate_cpu`)."""
        n, d = x.shape
        M = exps.shape[0]
        nch = (n + CHUNK - 1) // CHUNK
        for c in range(nch):
            lo = c * CHUNK
            m = min(n, lo + CHUNK) - lo
            pw = np.empty((d, P + 1, CHUNK))
            _powers(x, lo, m, P, pw)
            for k in range(M):
                _product(pw, exps[k], m, out[k, lo : lo + m])

    @njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
    def key_moments(
        x: np.ndarray, w: np.ndarray, exps: np.ndarray, P: int, g_lo: int, g_hi: int, acc: np.ndarray
    ) -> None:  # pragma: no cover
        """Groups ``g_lo <= g < g_hi`` of the key moments: ``acc[g, k] = sum_j w_j phi_k(x_j) [1, x_j]``
        over the chunks ``c = g, g + GROUPS, ...``; ``acc`` ``(GROUPS, M, d + 1)``. The caller sums the
        groups in a fixed order (:func:`attnflow.kernels.fastsum._cached_moments`)."""
        N, d = x.shape
        M = exps.shape[0]
        nch = (N + CHUNK - 1) // CHUNK
        pw = np.empty((d, P + 1, CHUNK))
        rhs = np.empty((d + 1, CHUNK))
        phi = np.empty(CHUNK)
        for g in range(g_lo, g_hi):
            for c in range(g, nch, GROUPS):
                lo = c * CHUNK
                m = min(N, lo + CHUNK) - lo
                _powers(x, lo, m, P, pw)
                for i in range(m):
                    rhs[0, i] = w[lo + i]
                for a in range(d):
                    for i in range(m):
                        rhs[a + 1, i] = w[lo + i] * x[lo + i, a]
                for k in range(M):
                    _product(pw, exps[k], m, phi)
                    for col in range(d + 1):
                        s = 0.0
                        rc = rhs[col]
                        for i in range(m):
                            s += rc[i] * phi[i]
                        acc[g, k, col] += s

    @njit(cache=True, nogil=True)
    def divide(
        R: np.ndarray, N: int, H: int, d: int, out: np.ndarray, logZ: np.ndarray, t_lo: int, t_hi: int
    ) -> bool:  # pragma: no cover
        """Tasks ``t_lo <= t < t_hi`` (one per block and head) of: from the blocks ``R`` ``(B, H (d + 1), nb)``
        (rows ``[Z_h, V_h num_h]`` per head, or ``[Z_h]`` when ``d = 0``), ``out[h, i] = V_h num_h / Z_h``
        and ``logZ[h, i] = log Z_h`` for the first ``N`` tokens. Returns ``False`` when some ``Z <= 0``
        (impossible within the proved bound). Every read of ``R`` and write of ``out`` is contiguous."""
        nb = R.shape[2]
        ok = True
        for t in range(t_lo, t_hi):
            b = t // H
            h = t - b * H
            lo = b * nb
            m = min(N, lo + nb) - lo
            zr = R[b, h * (d + 1)]
            for j in range(m):
                z = np.float64(zr[j])  # float64 from here on, whatever the precision of R
                if not z > 0.0:
                    ok = False
                    z = np.float64(1.0)
                logZ[h, lo + j] = np.log(z)
                for c in range(d):
                    out[h, lo + j, c] = np.float64(R[b, h * (d + 1) + 1 + c, j]) / z
        return ok
