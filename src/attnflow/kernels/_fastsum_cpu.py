"""Compiled CPU loops of fast summation (numba): feature blocks, key moments, and the final division.

torch builds the monomial features of :mod:`attnflow.kernels.fastsum` with one broadcast product
per slice, about 57 small operations per block of 2048 tokens; at a million tokens their dispatch
cost more than the arithmetic (0.35 s per pass, against 0.05 s for the loops below). These loops
compute the same products in the same order of factors, so the features are identical to the torch
builder's up to the rounding of the order of their factors (tested to 1e-13 relative).

Every loop runs over fixed chunks of tokens with one private accumulator per fixed group of
chunks, so the sums do not depend on the number of threads: a run gives the same bits on one core
or two, and a resumed run repeats the uninterrupted one. numba's default threading layer is kept:
unlike its ``workqueue`` layer it may be called from several Python threads at once (Dask
workers, servers), which aborts the process under ``workqueue``.
"""

from __future__ import annotations

import numpy as np

try:  # numba is a declared dependency; the torch builder stays as the fallback (and for CUDA).
    from numba import njit, prange

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

    @njit(parallel=True, cache=True, fastmath={"reassoc", "contract"})
    def key_moments(x: np.ndarray, w: np.ndarray, exps: np.ndarray, P: int) -> np.ndarray:  # pragma: no cover
        """``G[k] = sum_j w_j phi_k(x_j) [1, x_j]`` ``(M, d + 1)``, summed in :data:`GROUPS` fixed groups."""
        N, d = x.shape
        M = exps.shape[0]
        nch = (N + CHUNK - 1) // CHUNK
        acc = np.zeros((GROUPS, M, d + 1))
        for g in prange(GROUPS):
            pw = np.empty((d, P + 1, CHUNK))
            rhs = np.empty((d + 1, CHUNK))
            phi = np.empty(CHUNK)
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
        G = np.zeros((M, d + 1))
        for g in range(GROUPS):  # in a fixed order
            G += acc[g]
        return G

    @njit(parallel=True, cache=True)
    def divide(R: np.ndarray, N: int, H: int, d: int, out: np.ndarray, logZ: np.ndarray) -> bool:  # pragma: no cover
        """From the blocks ``R`` ``(B, H (d + 1), nb)`` (rows ``[Z_h, V_h num_h]`` per head, or ``[Z_h]``
        when ``d = 0``): ``out[h, i] = V_h num_h / Z_h`` and ``logZ[h, i] = log Z_h`` for the first
        ``N`` tokens. Returns ``False`` when some ``Z <= 0`` (impossible within the proved bound)."""
        B, _, nb = R.shape
        bad = np.zeros(B * H, dtype=np.bool_)
        # One (block, head) pair per task: every read of R and every write of out is contiguous.
        for t in prange(B * H):
            b = t // H
            h = t - b * H
            lo = b * nb
            m = min(N, lo + nb) - lo
            zr = R[b, h * (d + 1)]
            for j in range(m):
                z = np.float64(zr[j])  # float64 from here on, whatever the precision of R
                if not z > 0.0:
                    bad[t] = True
                    z = np.float64(1.0)
                logZ[h, lo + j] = np.log(z)
                for c in range(d):
                    out[h, lo + j, c] = np.float64(R[b, h * (d + 1) + 1 + c, j]) / z
        return not bad.any()
