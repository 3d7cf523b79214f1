"""Compiled CPU loops of fast summation (numba): feature blocks, key moments, and the final division.

torch builds the monomial features (:class:`attnflow.kernels.fastsum.features.FeatureBuilder`) with one broadcast product
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
    import scipy.linalg.cython_blas  # noqa: F401  (numba's np.dot calls this BLAS: loaded before any thread limit)
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

    @njit(cache=True, nogil=True)
    def build_features(x: np.ndarray, exps: np.ndarray, P: int, out: np.ndarray) -> None:  # pragma: no cover
        """``out[k, i] = prod_a x[i, a] ** exps[k, a]`` for the block ``x`` ``(n, d)``, ``2 <= d <= 4``;
        ``out`` ``(M, >= n)``. On one thread, without the GIL: the caller runs one block per core
        (:meth:`attnflow.kernels.fastsum.evaluator.FastSumEvaluator.evaluate_cpu`)."""
        n, d = x.shape
        M = exps.shape[0]
        nch = (n + CHUNK - 1) // CHUNK
        pw = np.empty((d, P + 1, CHUNK))
        for c in range(nch):
            lo = c * CHUNK
            m = min(n, lo + CHUNK) - lo
            _powers(x, lo, m, P, pw)
            # Indexing pw directly (no row views per monomial) measured 1.5x faster.
            for k in range(M):
                e0, e1 = exps[k, 0], exps[k, 1]
                if d == 2:
                    for i in range(m):
                        out[k, lo + i] = pw[0, e0, i] * pw[1, e1, i]
                elif d == 3:
                    e2 = exps[k, 2]
                    for i in range(m):
                        out[k, lo + i] = pw[0, e0, i] * pw[1, e1, i] * pw[2, e2, i]
                else:
                    e2, e3 = exps[k, 2], exps[k, 3]
                    for i in range(m):
                        out[k, lo + i] = pw[0, e0, i] * pw[1, e1, i] * pw[2, e2, i] * pw[3, e3, i]

    @njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
    def weighted_moments(
        x: np.ndarray, w: np.ndarray, exps: np.ndarray, P: int, g_lo: int, g_hi: int, acc: np.ndarray
    ) -> None:  # pragma: no cover
        """Groups ``g_lo <= g < g_hi`` of the weighted monomial moments ``acc[g, k] = sum_j w_j
        prod_a x_ja ** exps[k, a]`` (degrees ``<= P``) over the chunks ``c = g, g + GROUPS, ...``;
        ``acc`` ``(GROUPS, K)``. The caller sums the groups in a fixed order
        (:meth:`attnflow.kernels.fastsum.evaluator.FastSumEvaluator.moments`)."""
        N, d = x.shape
        K = exps.shape[0]
        nch = (N + CHUNK - 1) // CHUNK
        pw = np.empty((d, P + 1, CHUNK))
        for g in range(g_lo, g_hi):
            for c in range(g, nch, GROUPS):
                lo = c * CHUNK
                m = min(N, lo + CHUNK) - lo
                _powers(x, lo, m, P, pw)
                for e in range(P + 1):  # w_j x_j0^e: the weight rides on the first factor
                    for i in range(m):
                        pw[0, e, i] *= w[lo + i]
                # Indexing pw directly (no row views per monomial) measured 1.5x faster here.
                k = 0
                while k < K:
                    e0, e1 = exps[k, 0], exps[k, 1]
                    if (
                        d == 3
                        and k + 1 < K
                        and exps[k + 1, 0] == e0
                        and exps[k + 1, 1] == e1
                        and exps[k + 1, 2] == exps[k, 2] - 1
                    ):
                        # a pair x^a y^b z^c, x^a y^b z^(c-1): x^a y^b formed once for both (1.3x faster)
                        e2 = exps[k, 2]
                        s1 = 0.0
                        s0 = 0.0
                        for i in range(m):
                            t = pw[0, e0, i] * pw[1, e1, i]
                            s1 += t * pw[2, e2, i]
                            s0 += t * pw[2, e2 - 1, i]
                        acc[g, k] += s1
                        acc[g, k + 1] += s0
                        k += 2
                        continue
                    s = 0.0
                    if d == 2:
                        for i in range(m):
                            s += pw[0, e0, i] * pw[1, e1, i]
                    elif d == 3:
                        e2 = exps[k, 2]
                        for i in range(m):
                            s += pw[0, e0, i] * pw[1, e1, i] * pw[2, e2, i]
                    else:
                        e2, e3 = exps[k, 2], exps[k, 3]
                        for i in range(m):
                            s += pw[0, e0, i] * pw[1, e1, i] * pw[2, e2, i] * pw[3, e3, i]
                    acc[g, k] += s
                    k += 1

    @njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
    def weighted_moments3(
        x: np.ndarray, w: np.ndarray, P: int, k_hi: np.ndarray, k_lo: np.ndarray, g_lo: int, g_hi: int, acc: np.ndarray
    ) -> None:  # pragma: no cover
        """:func:`weighted_moments` for ``d = 3`` and the monomials of degrees ``P`` and ``P - 1`` (here
        ``P`` is the higher one), walked as ``w x^a y^b`` times ``z^c`` and ``z^(c - 1)``: for ``a`` and then
        ``b`` ascending, ``t = w x^a y^b`` is updated in place (``t *= y``, a loop of its own) before both
        sums, so a chunk reads only its ``z`` powers and a few rows, all in the L1 cache (the general
        loop reads three power tables, 61 KB at ``P = 19``, from L2: 1.5x slower). Pair ``p`` (in that order) adds
        to ``acc[g, k_hi[p]]`` (``z^c``) and ``acc[g, k_lo[p]]`` (``z^(c - 1)``; ``-1`` when ``c = 0``)."""
        N = x.shape[0]
        nch = (N + CHUNK - 1) // CHUNK
        zp = np.empty((P + 1, CHUNK))
        xa = np.empty(CHUNK)
        t = np.empty(CHUNK)
        xv = np.empty(CHUNK)
        yv = np.empty(CHUNK)
        for g in range(g_lo, g_hi):
            for c in range(g, nch, GROUPS):
                lo = c * CHUNK
                m = min(N, lo + CHUNK) - lo
                for i in range(m):
                    zp[0, i] = 1.0
                    xa[i] = w[lo + i]
                    xv[i] = x[lo + i, 0]
                    yv[i] = x[lo + i, 1]
                for e in range(1, P + 1):
                    for i in range(m):
                        zp[e, i] = zp[e - 1, i] * x[lo + i, 2]
                p = 0
                for a in range(P + 1):
                    if a > 0:
                        for i in range(m):
                            xa[i] *= xv[i]
                    for b in range(P + 1 - a):
                        e = P - a - b
                        # t = w x^a y^b, updated in its own loop: a store inside the sums below keeps
                        # them from being vectorised (the rows might alias, as far as LLVM knows)
                        if b == 0:
                            for i in range(m):
                                t[i] = xa[i]
                        else:
                            for i in range(m):
                                t[i] *= yv[i]
                        if e >= 1:
                            s1 = 0.0
                            s0 = 0.0
                            for i in range(m):
                                s1 += t[i] * zp[e, i]
                                s0 += t[i] * zp[e - 1, i]
                            acc[g, k_hi[p]] += s1
                            acc[g, k_lo[p]] += s0
                        else:
                            s = 0.0
                            for i in range(m):
                                s += t[i]
                            acc[g, k_hi[p]] += s
                        p += 1

    @njit(cache=True, nogil=True)
    def divide_block(
        R: np.ndarray, s: int, m: int, H: int, d: int, out: np.ndarray, Z: np.ndarray
    ) -> bool:  # pragma: no cover
        """From one block ``R`` ``(H (d + 1), >= m)`` of tokens ``s .. s + m`` (rows ``[Z_h, V_h num_h]``
        per head, or ``[Z_h]`` when ``d = 0``): ``out[h, s + j] = V_h num_h / Z_h`` and ``Z[h, s + j] = Z_h``
        (the caller takes the logarithms in one vectorised pass). Returns ``False`` when some
        ``Z <= 0`` (impossible within the proved bound). Run right after the block's product, while
        ``R`` is in the cache."""
        ok = True
        for h in range(H):
            zr = R[h * (d + 1)]
            for j in range(m):
                z = np.float64(zr[j])  # float64 from here on, whatever the precision of R
                if not z > 0.0:
                    ok = False
                    z = np.float64(1.0)
                Z[h, s + j] = z
                inv = 1.0 / z  # one division per token and head, not per coordinate
                for c in range(d):
                    out[h, s + j, c] = np.float64(R[h * (d + 1) + 1 + c, j]) * inv
        return ok

    @njit(cache=True, nogil=True)
    def mix_block(
        R: np.ndarray,
        s: int,
        m: int,
        H: int,
        d: int,
        c: np.ndarray,
        gf: bool,
        u: np.ndarray,
        Z: np.ndarray,
        acc: np.ndarray,
    ) -> bool:  # pragma: no cover
        """Like :func:`divide_block`, but the heads mixed at once into ``u`` ``(N, d)``, the field before
        its tangent projection (``attnflow.dynamics.fields.FieldStats.mixed_output``): ``mha``
        ``u = sum_h c_h V_h num_h / Z_h``; ``gf`` (softmax weights ``c_h Z_h / sum_h' c_h' Z_h'``)
        ``u = sum_h c_h V_h num_h / sum_h c_h Z_h``. ``c`` ``(H,)`` the head weights; ``Z[h, s + j]`` as there;
        ``acc`` ``(d + 2, >= m)`` scratch rows. Heads outermost, tokens innermost: the inner loops run
        along ``R``'s rows (SIMD), 5x faster than a token at a time; the sums over the heads are made
        in the same order, so the result is the same to the bit."""
        ok = True
        zs = acc[d]
        f = acc[d + 1]
        for k in range(d + 1):
            for j in range(m):
                acc[k, j] = 0.0
        for h in range(H):
            zr = R[h * (d + 1)]
            ch = c[h]
            for j in range(m):
                z = np.float64(zr[j])
                if not z > 0.0:
                    ok = False
                    z = np.float64(1.0)
                Z[h, s + j] = z
                zs[j] += ch * z
                f[j] = ch if gf else ch / z
            for k in range(d):
                rk = R[h * (d + 1) + 1 + k]
                ak = acc[k]
                for j in range(m):
                    ak[j] += np.float64(rk[j]) * f[j]
        for j in range(m):
            norm = 1.0 / zs[j] if gf else 1.0
            for k in range(d):
                u[s + j, k] = acc[k, j] * norm
        return ok

    @njit(cache=True, nogil=True)
    def evaluate_blocks(
        x: np.ndarray,
        exps: np.ndarray,
        P: int,
        Wt: np.ndarray,
        b_lo: int,
        b_hi: int,
        H: int,
        d: int,
        out: np.ndarray,
        Z: np.ndarray,
        buf: np.ndarray,
        R: np.ndarray,
        stages: int,
        c: np.ndarray,
        mix: int,
        u: np.ndarray,
    ) -> bool:  # pragma: no cover
        """Blocks ``b_lo <= b < b_hi`` of ``nb = buf.shape[1]`` tokens of the query side, each while the
        last is in the cache: the features into ``buf`` ``(M, nb)`` (:func:`build_features`; a partial
        block is padded with zeros), the product ``R = Wt buf`` (BLAS through ``np.dot``; float32 or
        float64 as ``Wt`` and ``buf`` are), and :func:`divide_block`. A profile reruns the loop to split
        its time: ``stages`` 1 stops after the features, 2 after the product, 4 only divides (the
        ``R`` left by the last run, into scratch ``out`` and ``Z``). ``mix`` 0 writes ``out`` per head;
        1 (``mha``) and 2 (``gf``) mix the heads with weights ``c`` into ``u`` (:func:`mix_block`;
        ``out`` is not written). Returns ``False`` when some ``Z <= 0``."""
        N = x.shape[0]
        nb = buf.shape[1]
        ok = True
        acc = np.empty((d + 2, nb))
        for b in range(b_lo, b_hi):
            s = b * nb
            m = min(N, s + nb) - s
            if stages != 4:
                if m < nb:
                    buf[:, m:] = 0.0
                build_features(x[s : s + m], exps, P, buf)
            if stages in (2, 3):
                np.dot(Wt, buf, R)
            if stages >= 3:
                if mix == 0:
                    ok = divide_block(R, s, m, H, d, out, Z) and ok
                else:
                    ok = mix_block(R, s, m, H, d, c, mix == 2, u, Z, acc) and ok
        return ok

    @njit(cache=True)
    def _times_B(C: np.ndarray, A: np.ndarray, up: np.ndarray, out: np.ndarray) -> None:  # pragma: no cover
        """``out += `` the coefficients of ``(x^T A y) c(x, y)`` (``c`` of degree ``(n, n)``, ``C`` ``(M, M)``,
        ``out`` ``(M1, M1)``, ``up`` ``(d, M)`` the raise maps of degree ``n``): row ``alpha`` of ``C``
        is spread to the columns ``up[b]`` (one scalar scatter per ``b``), the rows ``sum_b A_ab s_b``
        are made and added to row ``up[a, alpha]``, both along whole rows (SIMD)."""
        M = C.shape[0]
        d = A.shape[0]
        M1 = out.shape[0]
        s = np.zeros((d, M1))  # the positions outside up[b] stay zero: every row writes the same ones
        z = np.empty(M1)
        for al in range(M):
            for b in range(d):
                upb = up[b]
                sb = s[b]
                for be in range(M):
                    sb[upb[be]] = C[al, be]
            for a in range(d):
                for k in range(M1):
                    z[k] = 0.0
                for b in range(d):
                    ab = A[a, b]
                    sb = s[b]
                    for k in range(M1):
                        z[k] += ab * sb[k]
                row = out[up[a, al]]
                for k in range(M1):
                    row[k] += z[k]

    @njit(cache=True)
    def _times_Q_plus(K: np.ndarray, sq: np.ndarray, out: np.ndarray) -> None:  # pragma: no cover
        """``out += `` the coefficients of ``|x|^2 |y|^2 k(x, y)`` (``K`` ``(M, M)`` of degree ``(n, n)``,
        ``sq`` ``(d, M)``: the index of ``x_a^2 m`` among the monomials of degree ``n + 2``)."""
        M = K.shape[0]
        d = sq.shape[0]
        M2 = out.shape[0]
        s = np.empty(M2)
        for al in range(M):
            for k in range(M2):
                s[k] = 0.0
            for b in range(d):
                sqb = sq[b]
                for be in range(M):
                    s[sqb[be]] += K[al, be]
            for a in range(d):
                row = out[sq[a, al]]
                for k in range(M2):
                    row[k] += s[k]

    @njit(cache=True, nogil=True)
    def kernel_coefficients_heads(
        A: np.ndarray,
        c: np.ndarray,
        up_flat: np.ndarray,
        sq_flat: np.ndarray,
        sizes: np.ndarray,
        h_lo: int,
        h_hi: int,
        out_P: np.ndarray,
        out_Q: np.ndarray,
    ) -> None:  # pragma: no cover
        """The coefficient matrices ``C_P[h]``, ``C_{P-1}[h]`` of :func:`attnflow.kernels.fastsum.kernel_coefficients`
        for the heads ``h_lo <= h < h_hi``, the same recursion (powers ``B^n`` of ``x^T A_h y``, then Horner in
        ``Q = |x|^2 |y|^2`` for each parity) with every matrix of one head in the core's caches.
        ``sizes[n]`` ``= M_n`` (``n <= P``); ``up_flat`` the raise maps of degrees ``0 .. P - 1`` one after
        the other (``(d, M_n)`` each), ``sq_flat`` the square maps of degrees ``0 .. P - 2``."""
        P = sizes.shape[0] - 1
        d = A.shape[1]
        for h in range(h_lo, h_hi):
            powers = [np.ones((1, 1))]
            off = 0
            for n in range(P):
                M, M1 = sizes[n], sizes[n + 1]
                up = up_flat[off : off + d * M].reshape(d, M)
                off += d * M
                nxt = np.zeros((M1, M1))
                _times_B(powers[n], A[h], up, nxt)
                powers.append(nxt)
            sq_off = np.zeros(P + 1, dtype=np.int64)
            for n in range(P - 1):
                sq_off[n + 1] = sq_off[n] + d * sizes[n]
            for top in (P, P - 1):
                n = top % 2
                K = c[n] * powers[n]
                while n < top:
                    nxt = c[n + 2] * powers[n + 2]
                    _times_Q_plus(K, sq_flat[sq_off[n] : sq_off[n] + d * sizes[n]].reshape(d, sizes[n]), nxt)
                    K = nxt
                    n += 2
                if top == P:
                    out_P[h] = K
                else:
                    out_Q[h] = K
