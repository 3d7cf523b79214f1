"""Small clouds at compiled speed: the field of a few hundred tokens, and a whole embedded
Runge-Kutta step, in one compiled call (numba).

At ``N = 32`` one field evaluation is about 10,000 multiply-adds: torch's dispatch of the dozens of
small operations a pass makes (kernel, head mix, projection, the stage sums of a 13-stage step)
costs 50-100 times the arithmetic. Here the kernel, the head mix of each model and the step run as
one loop nest, the exponentials through a vectorised compiled ``exp`` (:func:`_exp_row`, within
1 ulp of NumPy's), with no call back into Python, so the loops release the GIL.

The formulas are those of :mod:`attnflow.kernels.dense` (``out_h(x_i)``, ``log Z_h(x_i)``, row
maximum subtracted before ``exp`` unless every score is provably inside ``+-SHIFT_FREE_BOUND``) and
of :meth:`attnflow.dynamics.fields.FieldStats.head_mix` (``mha``: ``c_h = w_h``; ``gf``:
``c_h = softmax_h(log Z_h + log w_h)``; ``usa``: ``c_h = w_h Z_h``);
``tests/kernels/test_small_kernel.py`` checks the compiled field (both routes) against
:class:`~attnflow.dynamics.fields.FieldStats` to 1e-13 for every model, with masses and several
heads. Only plain heads are served (``A_h``, ``V_h``; no biases, causal mask or rotary positions):
:func:`supported` says when.

The step functions take the tableau as arrays (:class:`attnflow.schemes.integrators.EmbeddedPair`
keeps it): stage ``s`` at ``x + dt sum_r a_sr k_r``, the new point ``retract(x + dt sum_s b_s k_s)``
(FSAL: the last stage is the field there), and the error norm of
:meth:`attnflow.solve.controllers.PIState.norm`, ``sqrt(mean((e / (atol + rtol max(|x|, |y|)))^2))``,
with DOP853's combined estimate when ``e3`` is given. :meth:`SmallStep.dense` makes DOP853's dense
output of a step (:meth:`attnflow.schemes.integrators.DOP853Pair.dense_coefficients`, compiled).

The saved states of a small run are measured here too, in bulk (issue 43): :func:`bulk_stats` (the
``FieldStats`` diagnostics formulas, state by state), :func:`gram_batch` (the Gram minimum and the
cluster count by union-find), :func:`dense_point` (a retracted dense-output state) and
:func:`rows_within` (the quick sphere check); ``tests/analysis/test_bulk_diagnostics.py`` checks
them against the torch path.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from attnflow.core.errors import FloatRangeError

try:
    from numba import njit

    AVAILABLE = True
except ImportError:  # pragma: no cover - numba is a declared dependency
    AVAILABLE = False

__all__ = [
    "AVAILABLE",
    "MODEL_CODES",
    "supported",
    "field",
    "embedded_attempt",
    "batched_attempt",
    "BatchedStep",
    "SmallStep",
    "dense_value",
    "dense_point",
    "dense_points",
    "bulk_stats",
    "gram_batch",
    "component_counts",
    "rows_within",
    "RUN_KERNELS",
]

#: The models as the compiled code numbers them.
MODEL_CODES = {"mha": 0, "gf": 1, "usa": 2}


def supported(heads: object, device: str, dtype: object) -> bool:
    """Whether the compiled path serves ``heads`` (plain ``A``, ``V``; CPU; float32 or float64)."""
    if not AVAILABLE or device != "cpu":
        return False
    for name in ("bias_q", "bias_k", "bias_v", "rope"):
        if getattr(heads, name, None) is not None:
            return False
    if getattr(heads, "causal", False):
        return False
    return str(dtype) in ("torch.float64", "torch.float32", "float64", "float32")


#: ``exp(r)`` on ``|r| <= ln(2)/2``: the Taylor coefficients ``1/k!`` up to ``k = 12`` (truncation
#: ``0.347^13 / 13! = 1.7e-16``); with the reduction ``x = k ln 2 + r`` the compiled ``exp`` is within
#: 1.5 ulp of NumPy's (``tests/kernels/test_small_kernel.py``).
_LOG2E = 1.4426950408889634
_LN2_HI = 6.93147180369123816490e-01  # ln 2 split in two so that k * _LN2_HI is exact (Cody & Waite)
_LN2_LO = 1.90821492927058770002e-10
#: Below this argument the compiled ``exp`` returns ``exp(-708)`` (its 2^k must stay a normal number);
#: the kernel's arguments there are exponents 300 and more below the row's largest, far below rounding.
_EXP_FLOOR = -708.0
#: Scores are exponentiated without subtracting the row maximum when every ``|<x_i, A_h x_j>|`` is
#: provably below this (``|A_h|_F max_j |x_j|^2``): ``exp(+-300)`` and sums of them stay far inside
#: the float range, so the shift changes only the rounding.
SHIFT_FREE_BOUND = 300.0

if AVAILABLE:

    @njit(cache=True, nogil=True, fastmath={"contract"})
    def _exp_row(e: np.ndarray, shift: float, kk: np.ndarray, n: int) -> None:  # pragma: no cover - compiled
        """``e[:n] <- exp(e[:n] - shift)`` in two loops LLVM vectorises (SIMD; about 1.5 ns a value here
        against 4.5 ns for a loop of ``math.exp``): ``2^k p(r)`` with ``k`` added to the exponent bits.

        No reassociation here: it would fold the two-part ``k ln 2`` back into one rounded product.
        """
        bits = e.view(np.int64)
        for j in range(n):
            x = max(e[j] - shift, _EXP_FLOOR)
            k = math.floor(x * _LOG2E + 0.5)
            r = (x - k * _LN2_HI) - k * _LN2_LO
            p = 1.0 / 479001600.0
            p = p * r + 1.0 / 39916800.0
            p = p * r + 1.0 / 3628800.0
            p = p * r + 1.0 / 362880.0
            p = p * r + 1.0 / 40320.0
            p = p * r + 1.0 / 5040.0
            p = p * r + 1.0 / 720.0
            p = p * r + 1.0 / 120.0
            p = p * r + 1.0 / 24.0
            p = p * r + 1.0 / 6.0
            p = p * r + 0.5
            p = p * r + 1.0
            p = p * r + 1.0
            e[j] = p
            kk[j] = np.int64(k)
        for j in range(n):
            bits[j] += kk[j] << 52

    @njit(cache=True, nogil=True)
    def exp_array(x: np.ndarray) -> np.ndarray:  # pragma: no cover - compiled
        """The compiled ``exp`` of a 1-D array (a copy; what the tests compare with NumPy's)."""
        e = x.copy()
        _exp_row(e, 0.0, np.empty(e.shape[0], dtype=np.int64), e.shape[0])
        return e

    # Reassociation lets LLVM vectorise the token sums; no "nnan"/"ninf": the overflow checks must stay.
    @njit(cache=True, nogil=True, fastmath={"reassoc", "contract", "nsz"})
    def _head_rows(
        h: int,
        x: np.ndarray,
        xT: np.ndarray,
        AT: np.ndarray,
        V: np.ndarray,
        a: np.ndarray,
        E: np.ndarray,
        kk: np.ndarray,
        q: np.ndarray,
        num: np.ndarray,
        logZ: np.ndarray,
        OUT: np.ndarray,
        shift_free: bool,
    ) -> None:  # pragma: no cover - compiled
        """Head ``h``, every row: ``OUT[i] = V_h out_h(x_i)``, ``logZ[i] = log Z_h(x_i)`` (row maximum
        subtracted before ``exp`` unless ``shift_free``); ``E`` ``(N, N)``: scratch for the exponents."""
        N, d = x.shape
        for i in range(N):
            # q = A_h^T x_i, so s_j = x_i^T A_h x_j = q . x_j
            for c in range(d):
                acc = 0.0
                for r in range(d):
                    acc += AT[h, c, r] * x[i, r]
                q[c] = acc
            s = E[i]
            if d == 3:  # tokens on S^2: one fused loop (few long SIMD loops beat many short ones)
                q0, q1, q2 = q[0], q[1], q[2]
                x0, x1, x2 = xT[0], xT[1], xT[2]
                for j in range(N):
                    s[j] = q0 * x0[j] + q1 * x1[j] + q2 * x2[j]
            else:
                q0 = q[0]
                for j in range(N):
                    s[j] = q0 * xT[0, j]
                for c in range(1, d):
                    qc = q[c]
                    for j in range(N):
                        s[j] += qc * xT[c, j]
            mi = 0.0
            if not shift_free:
                mi = s[0]
                for j in range(1, N):
                    mi = max(mi, s[j])
                for j in range(N):
                    s[j] -= mi
            logZ[i] = mi
        # One exp loop over all N^2 exponents: long SIMD loops, no per-row start-up.
        _exp_row(E.reshape(N * N), 0.0, kk, N * N)
        for i in range(N):
            s = E[i]
            Z = 0.0
            if d == 3:
                x0, x1, x2 = xT[0], xT[1], xT[2]
                n0 = n1 = n2 = 0.0
                for j in range(N):
                    ej = a[j] * s[j]
                    Z += ej
                    n0 += ej * x0[j]
                    n1 += ej * x1[j]
                    n2 += ej * x2[j]
                num[0], num[1], num[2] = n0, n1, n2
            else:
                for j in range(N):
                    ej = a[j] * s[j]
                    s[j] = ej
                    Z += ej
                for c in range(d):
                    acc = 0.0
                    for j in range(N):
                        acc += s[j] * xT[c, j]
                    num[c] = acc
            logZ[i] += math.log(Z)
            for r in range(d):
                acc = 0.0
                for c in range(d):
                    acc += V[h, r, c] * num[c]
                OUT[i, r] = acc / Z

    @njit(cache=True, nogil=True, fastmath={"reassoc", "contract", "nsz"})
    def _field(
        x: np.ndarray,
        AT: np.ndarray,
        V: np.ndarray,
        log_w: np.ndarray,
        a: np.ndarray,
        model: int,
        u: np.ndarray,
        work: np.ndarray,
        kk: np.ndarray,
        shift_free: bool,
    ) -> bool:  # pragma: no cover - compiled
        """``u`` ``(N, d)`` <- the projected field ``P_x sum_h c_h out_h``; returns False on overflow (usa).

        ``work``: float scratch of at least :func:`work_size` values, ``kk``: int64 scratch of ``N^2``.
        ``shift_free``: the caller checked ``|A_h|_F max |x_j|^2 <= SHIFT_FREE_BOUND`` for this state
        (the row maximum need not be subtracted before ``exp``; see :func:`_shift_free`).
        """
        N, d = x.shape
        H = AT.shape[0]
        xT = work[: d * N].reshape((d, N))  # token-contiguous rows: the j loops below run over unit strides
        E = work[d * N : d * N + N * N].reshape((N, N))
        o = d * N + N * N
        q = work[o : o + d]
        num = work[o + d : o + 2 * d]
        o += 2 * d
        logZ = work[o : o + H * N].reshape((H, N))
        o += H * N
        OUT = work[o : o + H * N * d].reshape((H, N, d))
        for j in range(N):
            for c in range(d):
                xT[c, j] = x[j, c]
        for h in range(H):
            _head_rows(h, x, xT, AT, V, a, E, kk, q, num, logZ[h], OUT[h], shift_free)
        ok = True
        for i in range(N):
            for c in range(d):
                u[i, c] = 0.0
            if model == 0:  # mha: c_h = w_h
                for h in range(H):
                    wh = math.exp(log_w[h])
                    for c in range(d):
                        u[i, c] += wh * OUT[h, i, c]
            elif model == 1:  # gf: c_h = softmax_h(log Z_h + log w_h)
                mm = -np.inf
                for h in range(H):
                    if logZ[h, i] + log_w[h] > mm:
                        mm = logZ[h, i] + log_w[h]
                tot = 0.0
                for h in range(H):
                    ch = math.exp(logZ[h, i] + log_w[h] - mm)
                    tot += ch
                    for c in range(d):
                        u[i, c] += ch * OUT[h, i, c]
                for c in range(d):
                    u[i, c] /= tot
            else:  # usa: c_h = w_h Z_h
                for h in range(H):
                    ch = math.exp(logZ[h, i] + log_w[h])
                    if not math.isfinite(ch):
                        ok = False
                    for c in range(d):
                        u[i, c] += ch * OUT[h, i, c]
            dot = 0.0
            for c in range(d):
                dot += x[i, c] * u[i, c]
            for c in range(d):
                u[i, c] -= dot * x[i, c]
        return ok

    @njit(cache=True, nogil=True)
    def _shift_free(x: np.ndarray, a_norm: float) -> bool:  # pragma: no cover - compiled
        """Whether ``a_norm max_j |x_j|^2 <= SHIFT_FREE_BOUND`` (``a_norm``: the largest ``|A_h|_F``),
        which bounds every score ``|<x_i, A_h x_j>|`` of the state ``x`` (a stage point need not be unit)."""
        N, d = x.shape
        big = 0.0
        for j in range(N):
            s = 0.0
            for c in range(d):
                s += x[j, c] * x[j, c]
            big = max(big, s)
        return a_norm * big <= SHIFT_FREE_BOUND


def work_size(N: int, d: int, H: int) -> int:
    """Float scratch one compiled field evaluation needs (``xT``, the exponents, ``q``, sums, ``log Z``, outputs)."""
    return d * N + N * N + 2 * d + H * N + H * N * d


def a_norm(AT: np.ndarray) -> float:
    """The largest Frobenius norm of the heads' ``A_h`` (a bound of their spectral norms)."""
    return float(np.sqrt((AT.reshape(AT.shape[0], -1) ** 2).sum(axis=1)).max())


if AVAILABLE:

    @njit(cache=True, nogil=True)
    def _eval(
        x: np.ndarray,
        AT: np.ndarray,
        V: np.ndarray,
        log_w: np.ndarray,
        a: np.ndarray,
        model: int,
        u: np.ndarray,
        work: np.ndarray,
        kk: np.ndarray,
        a_nrm: float,
    ) -> bool:  # pragma: no cover - compiled
        """:func:`_field` with the shift-free test made for this state."""
        return _field(x, AT, V, log_w, a, model, u, work, kk, _shift_free(x, a_nrm))

    @njit(cache=True, nogil=True)
    def _attempt(
        x: np.ndarray,
        dt: float,
        AT: np.ndarray,
        V: np.ndarray,
        log_w: np.ndarray,
        a: np.ndarray,
        model: int,
        c_: np.ndarray,
        A_: np.ndarray,
        b_: np.ndarray,
        e5: np.ndarray,
        e3: np.ndarray,
        fsal: bool,
        rtol: float,
        atol: float,
        k1: np.ndarray,
        have_k1: bool,
        y: np.ndarray,
        ks: np.ndarray,
        a_nrm: float,
    ) -> tuple[float, bool]:  # pragma: no cover
        """One trial step from ``x``: ``y`` <- the new point (retracted), ``ks[s]`` <- the stages.

        Returns ``(err, ok)``: the controller's error norm of the embedded estimate, and False if the
        field overflowed or a state is not finite.
        """
        N, d = x.shape
        S = c_.shape[0]
        H = AT.shape[0]
        work = np.empty(d * N + N * N + 2 * d + H * N + H * N * d)  # work_size(N, d, H)
        kk = np.empty(N * N, dtype=np.int64)
        z = np.empty((N, d))
        ok = True
        if have_k1:
            ks[0, :, :] = k1
        else:
            ok = _eval(x, AT, V, log_w, a, model, ks[0], work, kk, a_nrm) and ok
        last = S - 1 if fsal else S
        for s in range(1, last):
            for i in range(N):
                for c in range(d):
                    acc = 0.0
                    for r in range(s):
                        acc += A_[s, r] * ks[r, i, c]
                    z[i, c] = x[i, c] + dt * acc
            ok = _eval(z, AT, V, log_w, a, model, ks[s], work, kk, a_nrm) and ok
        for i in range(N):
            nrm = 0.0
            for c in range(d):
                acc = 0.0
                for r in range(last):
                    acc += b_[r] * ks[r, i, c]
                y[i, c] = x[i, c] + dt * acc
                nrm += y[i, c] * y[i, c]
            nrm = math.sqrt(nrm)
            if not (nrm > 0 and math.isfinite(nrm)):
                ok = False
                nrm = 1.0
            for c in range(d):
                y[i, c] /= nrm
        if fsal:
            ok = _eval(y, AT, V, log_w, a, model, ks[S - 1], work, kk, a_nrm) and ok
        # Error estimate: e5 = dt sum_s e5_s k_s (and e3 likewise), scaled by atol + rtol max(|x|, |y|).
        n5 = 0.0
        n3 = 0.0
        s5 = 0.0
        s3 = 0.0
        use3 = e3.shape[0] > 0
        for i in range(N):
            for c in range(d):
                acc5 = 0.0
                acc3 = 0.0
                for r in range(S):
                    acc5 += e5[r] * ks[r, i, c]
                    if use3:
                        acc3 += e3[r] * ks[r, i, c]
                acc5 *= dt
                acc3 *= dt
                sc = atol + rtol * max(abs(x[i, c]), abs(y[i, c]))
                s5 += (acc5 / sc) ** 2
                n5 += acc5 * acc5
                if use3:
                    s3 += (acc3 / sc) ** 2
                    n3 += acc3 * acc3
        if use3:
            # e = e5 |e5| / sqrt(|e5|^2 + 0.01 |e3|^2) (DOP853), the factor from the unscaled norms.
            den = math.sqrt(n5 + 0.01 * n3)
            fac = math.sqrt(n5) / den if den > 0 else 0.0
            s5 *= fac * fac
        err = math.sqrt(s5 / (N * d))
        if not math.isfinite(err):
            ok = False
        return err, ok


def _heads_arrays(A: np.ndarray, V: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    AT = np.ascontiguousarray(np.swapaxes(A, 1, 2), dtype=np.float64)
    return AT, np.ascontiguousarray(V, dtype=np.float64), np.log(np.asarray(w, dtype=np.float64))


if AVAILABLE:

    @njit(cache=True, nogil=True)
    def _field_loop(
        n: int,
        x: np.ndarray,
        AT: np.ndarray,
        V: np.ndarray,
        log_w: np.ndarray,
        a: np.ndarray,
        model: int,
        u: np.ndarray,
        work: np.ndarray,
        kk: np.ndarray,
        a_nrm: float,
    ) -> None:  # pragma: no cover - compiled
        for _ in range(n):
            _eval(x, AT, V, log_w, a, model, u, work, kk, a_nrm)


def field_seconds(
    x: np.ndarray, A: np.ndarray, V: np.ndarray, w: np.ndarray, a: np.ndarray, model: str, n: int = 2000
) -> float:
    """Seconds per compiled field evaluation in a tight compiled loop (no step, no Python between
    evaluations): the arithmetic floor of a run's evaluations at this size."""
    import time

    x = np.ascontiguousarray(x, dtype=np.float64)
    AT, Vc, log_w = _heads_arrays(A, V, w)
    N, d = x.shape
    H = AT.shape[0]
    args = (x, AT, Vc, log_w, np.asarray(a, dtype=np.float64), MODEL_CODES[model], np.empty_like(x),
            np.empty(work_size(N, d, H)), np.empty(N * N, dtype=np.int64), a_norm(AT))  # fmt: skip
    _field_loop(1, *args)
    best = math.inf
    for _ in range(5):  # the best of five: the floor, not the machine's load
        t = time.perf_counter()
        _field_loop(n, *args)
        best = min(best, (time.perf_counter() - t) / n)
    return best


def field(x: np.ndarray, A: np.ndarray, V: np.ndarray, w: np.ndarray, a: np.ndarray, model: str) -> np.ndarray:
    """The projected field ``v(x_i)`` of ``model`` ``(N, d)`` for heads ``A`` ``(H, d, d)``, values
    ``V`` ``(H, d, d)``, head masses ``w`` ``(H,)`` and token masses ``a`` ``(N,)``, in float64.

    Raises :class:`~attnflow.core.errors.FloatRangeError` (an ``OverflowError``) where the unnormalised
    ``usa`` field leaves the float range.
    """
    x = np.ascontiguousarray(x, dtype=np.float64)
    AT, Vc, log_w = _heads_arrays(A, V, w)
    u = np.empty_like(x)
    H, d = AT.shape[0], x.shape[1]
    N = x.shape[0]
    ok = _eval(
        x, AT, Vc, log_w, np.asarray(a, dtype=np.float64), MODEL_CODES[model], u, np.empty(work_size(N, d, H)),
        np.empty(N * N, dtype=np.int64), a_norm(AT),
    )  # fmt: skip
    if not ok:
        raise FloatRangeError("the unnormalised ('usa') field overflows: lower beta or use model 'gf' or 'mha'.")
    return u


def embedded_attempt(
    x: np.ndarray, dt: float, A: np.ndarray, V: np.ndarray, w: np.ndarray, a: np.ndarray, model: str,
    tableau: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, bool],
    rtol: float, atol: float, k1: np.ndarray | None = None,
) -> tuple[np.ndarray, float, np.ndarray, np.ndarray, bool]:  # fmt: skip
    """One trial step of an embedded pair (``tableau = (c, A, b, e5, e3, fsal)``, see the module
    docstring): ``(y, err, k_first, k_last, ok)``. ``k1``: the field at ``x`` if already known (FSAL)."""
    y, err, ks, ok = SmallStep(A, V, w, a, model, tableau, rtol, atol).attempt(x, dt, k1)
    return y, err, ks[0].copy(), ks[-1].copy(), ok


class SmallStep:
    """One cloud's compiled trial steps with the heads' arrays converted once: :meth:`attempt`, and the
    dense output of an accepted step (:meth:`dense`, pairs with one: ``dense = (c_extra, A_extra, D)``)."""

    def __init__(
        self, A: np.ndarray, V: np.ndarray, w: np.ndarray, a: np.ndarray, model: str,
        tableau: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, bool], rtol: float, atol: float,
        dense: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
    ) -> None:  # fmt: skip
        self.AT, self.V, self.log_w = _heads_arrays(A, V, w)
        self.a = np.ascontiguousarray(a, dtype=np.float64)
        self.model = MODEL_CODES[model]
        self.tableau, self.dense_tab = tableau, dense
        self.rtol, self.atol = float(rtol), float(atol)
        self.a_nrm = a_norm(self.AT)

    def attempt(
        self, x: np.ndarray, dt: float, k1: np.ndarray | None = None
    ) -> tuple[np.ndarray, float, np.ndarray, bool]:
        """``(y, err, ks, ok)``: the new point, the error norm, every stage ``(S, N, d)``, and False if
        the field overflowed or a state is not finite."""
        c_, A_, b_, e5, e3, fsal = self.tableau
        N, d = x.shape
        ks = np.empty((c_.shape[0], N, d))
        y = np.empty((N, d))
        first = ks[0] if k1 is None else np.ascontiguousarray(k1, dtype=np.float64)
        err, ok = _attempt(
            np.ascontiguousarray(x, dtype=np.float64), float(dt), self.AT, self.V, self.log_w, self.a, self.model,
            c_, A_, b_, e5, e3, fsal, self.rtol, self.atol, first, k1 is not None, y, ks, self.a_nrm,
        )  # fmt: skip
        return y, float(err), ks, bool(ok)

    def dense(self, x: np.ndarray, y: np.ndarray, ks: np.ndarray, dt: float) -> tuple[np.ndarray, bool]:
        """The interpolant's coefficients ``F`` ``(7, N, d)`` of the step ``x -> y`` (``ks``: its 13
        stages), as :meth:`attnflow.schemes.integrators.DOP853Pair.dense_coefficients`; three more
        evaluations. Evaluate with :func:`dense_value`."""
        assert self.dense_tab is not None
        cx, Ax, D = self.dense_tab
        F = np.empty((7, *x.shape))
        ok = _dense(
            np.ascontiguousarray(x, dtype=np.float64), y, ks, float(dt), self.AT, self.V, self.log_w, self.a,
            self.model, cx, Ax, D, F, self.a_nrm,
        )  # fmt: skip
        return F, bool(ok)

    def dense_points(
        self, x: np.ndarray, y: np.ndarray, ks: np.ndarray, dt: float, thetas: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, bool]:
        """:meth:`dense` and :func:`dense_points` in one compiled call: ``(F, X, ok)``, ``X`` ``(M, N, d)``
        the retracted interpolant at each ``thetas[m]`` (the same bits as the two calls)."""
        assert self.dense_tab is not None
        cx, Ax, D = self.dense_tab
        F = np.empty((7, *x.shape))
        out = np.empty((thetas.shape[0], *x.shape))
        ok = _dense_and_points(
            np.ascontiguousarray(x, dtype=np.float64), y, ks, float(dt), self.AT, self.V, self.log_w, self.a,
            self.model, cx, Ax, D, F, self.a_nrm, np.ascontiguousarray(thetas, dtype=np.float64), out,
        )  # fmt: skip
        return F, out, bool(ok)


def dense_value(x: np.ndarray, F: np.ndarray, theta: float) -> np.ndarray:
    """The interpolant at ``t + theta dt`` in ``R^d`` (SciPy's nesting; not retracted)."""
    out = np.zeros_like(x)
    for i in range(F.shape[0] - 1, -1, -1):
        out = (out + F[i]) * (theta if (F.shape[0] - 1 - i) % 2 == 0 else 1.0 - theta)
    return x + out


if AVAILABLE:

    @njit(cache=True, nogil=True)
    def _dense(
        x: np.ndarray,
        y: np.ndarray,
        ks: np.ndarray,
        dt: float,
        AT: np.ndarray,
        V: np.ndarray,
        log_w: np.ndarray,
        a: np.ndarray,
        model: int,
        cx: np.ndarray,
        Ax: np.ndarray,
        D: np.ndarray,
        F: np.ndarray,
        a_nrm: float,
    ) -> bool:  # pragma: no cover - compiled
        """``F`` <- the dense output's coefficients (see :meth:`SmallStep.dense`); False on overflow."""
        S, N, d = ks.shape
        E = Ax.shape[0]
        K = np.empty((S + E, N, d))
        K[:S] = ks
        z = np.empty((N, d))
        H = AT.shape[0]
        work = np.empty(d * N + N * N + 2 * d + H * N + H * N * d)  # work_size(N, d, H)
        kk = np.empty(N * N, dtype=np.int64)
        ok = True
        for e in range(E):
            s = S + e
            for i in range(N):
                for c in range(d):
                    acc = 0.0
                    for r in range(s):
                        acc += Ax[e, r] * K[r, i, c]
                    z[i, c] = x[i, c] + dt * acc
            ok = _eval(z, AT, V, log_w, a, model, K[s], work, kk, a_nrm) and ok
        for i in range(N):
            for c in range(d):
                dy = y[i, c] - x[i, c]
                F[0, i, c] = dy
                F[1, i, c] = dt * K[0, i, c] - dy
                F[2, i, c] = 2.0 * dy - dt * (K[S - 1, i, c] + K[0, i, c])
                for m in range(D.shape[0]):
                    acc = 0.0
                    for r in range(S + E):
                        acc += D[m, r] * K[r, i, c]
                    F[3 + m, i, c] = dt * acc
        return ok


if AVAILABLE:

    @njit(cache=True, nogil=True)
    def _batched_attempt(
        members: np.ndarray,
        X: np.ndarray,
        dts: np.ndarray,
        AT: np.ndarray,
        V: np.ndarray,
        log_w: np.ndarray,
        a: np.ndarray,
        model: int,
        c_: np.ndarray,
        A_: np.ndarray,
        b_: np.ndarray,
        e5: np.ndarray,
        e3: np.ndarray,
        fsal: bool,
        rtol: float,
        atol: float,
        K1: np.ndarray,
        have_k1: np.ndarray,
        Y: np.ndarray,
        KS: np.ndarray,
        errs: np.ndarray,
        oks: np.ndarray,
        a_nrm: np.ndarray,
    ) -> None:  # pragma: no cover - compiled
        """:func:`_attempt` for each member ``b`` in ``members`` of ``X`` ``(B, N, d)`` with its own step
        ``dts[b]`` and heads ``AT[b]``, ``V[b]``: ``Y[b]``, ``KS[b]`` (its stages), ``errs[b]``, ``oks[b]``.
        Releases the GIL, so threads can run disjoint ``members`` at once."""
        for b in members:
            err, ok = _attempt(
                X[b], dts[b], AT[b], V[b], log_w, a, model, c_, A_, b_, e5, e3, fsal, rtol, atol, K1[b],
                have_k1[b], Y[b], KS[b], a_nrm[b],
            )  # fmt: skip
            errs[b] = err
            oks[b] = ok


def batched_attempt(
    X: np.ndarray, dts: np.ndarray, active: np.ndarray, A: np.ndarray, V: np.ndarray, w: np.ndarray,
    a: np.ndarray, model: str, tableau: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, bool],
    rtol: float, atol: float, K1: np.ndarray, have_k1: np.ndarray, *, threads: int = 1,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
    """One trial step of every active member of an ensemble ``X`` ``(B, N, d)``, each with its own step
    ``dts`` ``(B,)`` and heads ``A``, ``V`` ``(B, H, d, d)``: ``(Y, errs, K_last, oks)`` (inactive
    members' rows are left unset). ``K1`` ``(B, N, d)``: the first stage where ``have_k1``.
    ``threads``: the members are shared out to this many threads (the compiled loop releases the GIL)."""
    return BatchedStep(A, V, w, a, model, tableau, rtol, atol, threads)(X, dts, active, K1, have_k1)


class BatchedStep:
    """:func:`batched_attempt` with the heads' arrays converted once (an ensemble calls it every round)."""

    def __init__(
        self, A: np.ndarray, V: np.ndarray, w: np.ndarray, a: np.ndarray, model: str,
        tableau: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, bool], rtol: float, atol: float,
        threads: int = 1, dense: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
    ) -> None:  # fmt: skip
        self.AT = np.ascontiguousarray(np.swapaxes(A, 2, 3), dtype=np.float64)
        self.dense_tab = dense
        self.KS = np.empty(0)
        self.V = np.ascontiguousarray(V, dtype=np.float64)
        self.log_w = np.log(np.asarray(w, dtype=np.float64))
        self.a = np.asarray(a, dtype=np.float64)
        self.model = MODEL_CODES[model]
        self.tableau = tableau
        self.rtol, self.atol = float(rtol), float(atol)
        self.a_nrm = np.array([a_norm(at) for at in self.AT])
        self.threads = max(1, int(threads))
        self._pool: Any = None

    def __call__(
        self, X: np.ndarray, dts: np.ndarray, active: np.ndarray, K1: np.ndarray, have_k1: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        B = X.shape[0]
        c_, A_, b_, e5, e3, fsal = self.tableau
        Y = np.empty_like(X)
        KS = self.KS = np.empty((B, c_.shape[0], *X.shape[1:]))
        errs, oks = np.full(B, np.inf), np.zeros(B, dtype=np.bool_)
        idx = np.flatnonzero(active).astype(np.int64)

        def run(members: np.ndarray) -> None:
            _batched_attempt(
                members, X, dts, self.AT, self.V, self.log_w, self.a, self.model, c_, A_, b_, e5, e3, fsal,
                self.rtol, self.atol, K1, have_k1, Y, KS, errs, oks, self.a_nrm,
            )  # fmt: skip

        n = min(self.threads, len(idx))
        if n <= 1:
            run(idx)
        else:
            if self._pool is None:
                from concurrent.futures import ThreadPoolExecutor

                self._pool = ThreadPoolExecutor(self.threads)
            # Interleaved shares: members of similar step counts spread over the threads alike.
            list(self._pool.map(run, [idx[k::n] for k in range(n)]))
        return Y, errs, KS[:, -1], oks

    def dense(self, b: int, x: np.ndarray, y: np.ndarray, dt: float) -> tuple[np.ndarray, bool]:
        """Member ``b``'s dense output of its last trial step ``x -> y`` (``dense``: the pair's
        ``(c_extra, A_extra, D)``), as :meth:`SmallStep.dense`."""
        assert self.dense_tab is not None
        cx, Ax, D = self.dense_tab
        F = np.empty((7, *x.shape))
        ok = _dense(
            x, y, self.KS[b], float(dt), self.AT[b], self.V[b], self.log_w, self.a, self.model, cx, Ax, D, F,
            float(self.a_nrm[b]),
        )  # fmt: skip
        return F, bool(ok)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None


if AVAILABLE:

    @njit(cache=True, nogil=True)
    def _dense_point(x: np.ndarray, F: np.ndarray, theta: float, out: np.ndarray) -> None:  # pragma: no cover
        """``out`` <- :func:`dense_value` at ``theta``, each row divided by its norm (the retraction)."""
        N, d = x.shape
        M = F.shape[0]
        for i in range(N):
            for c in range(d):
                out[i, c] = 0.0
        # Coefficient by coefficient over the contiguous (N, d) block: independent SIMD lanes, each
        # entry's operations in the order of dense_value (so the same bits).
        for m in range(M - 1, -1, -1):
            fac = theta if (M - 1 - m) % 2 == 0 else 1.0 - theta
            for i in range(N):
                for c in range(d):
                    out[i, c] = (out[i, c] + F[m, i, c]) * fac
        for i in range(N):
            nrm = 0.0
            for c in range(d):
                v = x[i, c] + out[i, c]
                out[i, c] = v
                nrm += v * v
            nrm = math.sqrt(nrm)
            for c in range(d):
                out[i, c] /= nrm

    @njit(cache=True, nogil=True)
    def _means_batch(
        X: np.ndarray, AT: np.ndarray, a: np.ndarray, M: np.ndarray, logZ: np.ndarray
    ) -> None:  # pragma: no cover - compiled
        """For every state ``s`` and head ``h``: ``M[s, h, i] = sum_j p_hij x_j`` and ``logZ[s, h, i]``
        (:func:`_head_rows` with identity values)."""
        S, N, d = X.shape
        H = AT.shape[1]
        E, kk, xT, q, num, eye = _means_scratch(N, d, H)
        for s in range(S):
            _means_into(X[s], AT[s], a, eye, E, kk, xT, q, num, logZ[s], M[s])

    @njit(cache=True, nogil=True)
    def _means_scratch(
        N: int, d: int, H: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:  # pragma: no cover
        """The scratch of :func:`_means_into` (made once for many states) and the identity values."""
        eye = np.zeros((H, d, d))
        for h in range(H):
            for c in range(d):
                eye[h, c, c] = 1.0
        return np.empty((N, N)), np.empty(N * N, dtype=np.int64), np.empty((d, N)), np.empty(d), np.empty(d), eye

    @njit(cache=True, nogil=True)
    def _means_into(
        x: np.ndarray,
        AT: np.ndarray,
        a: np.ndarray,
        eye: np.ndarray,
        E: np.ndarray,
        kk: np.ndarray,
        xT: np.ndarray,
        q: np.ndarray,
        num: np.ndarray,
        logZ: np.ndarray,
        M: np.ndarray,
    ) -> None:  # pragma: no cover - compiled
        """One state ``x`` of :func:`_means_batch`: ``M[h, i]``, ``logZ[h, i]`` for its heads ``AT``."""
        N, d = x.shape
        for j in range(N):
            for c in range(d):
                xT[c, j] = x[j, c]
        free = _shift_free(x, a_norm_compiled(AT))
        for h in range(AT.shape[0]):
            _head_rows(h, x, xT, AT, eye, a, E, kk, q, num, logZ[h], M[h], free)

    @njit(cache=True, nogil=True)
    def a_norm_compiled(AT: np.ndarray) -> float:  # pragma: no cover - compiled
        """:func:`a_norm` inside compiled code."""
        best = 0.0
        for h in range(AT.shape[0]):
            acc = 0.0
            for r in range(AT.shape[1]):
                for c in range(AT.shape[2]):
                    acc += AT[h, r, c] * AT[h, r, c]
            best = max(best, math.sqrt(acc))
        return best


if AVAILABLE:

    @njit(cache=True, nogil=True)
    def _dense_points(x: np.ndarray, F: np.ndarray, thetas: np.ndarray, out: np.ndarray) -> None:  # pragma: no cover
        """``out[m]`` <- :func:`_dense_point` at ``thetas[m]`` (the same operations, so the same bits)."""
        for m in range(thetas.shape[0]):
            _dense_point(x, F, thetas[m], out[m])


def dense_point(x: np.ndarray, F: np.ndarray, theta: float) -> np.ndarray:
    """:func:`dense_value` retracted onto the sphere, compiled (a saved state of a dense-output run)."""
    out = np.empty_like(x)
    _dense_point(x, F, float(theta), out)
    return out


if AVAILABLE:

    @njit(cache=True, nogil=True)
    def _dense_and_points(
        x: np.ndarray,
        y: np.ndarray,
        ks: np.ndarray,
        dt: float,
        AT: np.ndarray,
        V: np.ndarray,
        log_w: np.ndarray,
        a: np.ndarray,
        model: int,
        cx: np.ndarray,
        Ax: np.ndarray,
        D: np.ndarray,
        F: np.ndarray,
        a_nrm: float,
        thetas: np.ndarray,
        out: np.ndarray,
    ) -> bool:  # pragma: no cover - compiled
        """:func:`_dense` then :func:`_dense_points` (one call: a step's dense saves); False on overflow
        (``out`` is then not written)."""
        ok = _dense(x, y, ks, dt, AT, V, log_w, a, model, cx, Ax, D, F, a_nrm)
        if ok:
            _dense_points(x, F, thetas, out)
        return ok


def dense_points(x: np.ndarray, F: np.ndarray, thetas: np.ndarray) -> np.ndarray:
    """:func:`dense_point` at every ``thetas[m]`` in one compiled call: ``(M, N, d)`` (every save time
    inside one accepted step at once; bit-identical to ``M`` calls of :func:`dense_point`)."""
    thetas = np.ascontiguousarray(thetas, dtype=np.float64)
    out = np.empty((thetas.shape[0], *x.shape))
    _dense_points(x, F, thetas, out)
    return out


if AVAILABLE:

    @njit(cache=True, nogil=True)
    def rows_within(x: np.ndarray, lo2: float, hi2: float) -> bool:  # pragma: no cover - compiled
        """Whether every row's squared norm lies in ``[lo2, hi2]`` (NaN fails): a saved state's quick
        sphere check, one pass, no temporaries."""
        N, d = x.shape
        for i in range(N):
            s = 0.0
            for c in range(d):
                s += x[i, c] * x[i, c]
            if not (s >= lo2 and s <= hi2):
                return False
        return True


if AVAILABLE:

    @njit(cache=True, nogil=True)
    def _lse(v: np.ndarray) -> float:  # pragma: no cover - compiled
        """``log sum exp(v)`` (``-inf`` when every entry is ``-inf``)."""
        m = -np.inf
        for k in range(v.shape[0]):
            m = max(m, v[k])
        if m == -np.inf:
            return -np.inf
        acc = 0.0
        for k in range(v.shape[0]):
            acc += math.exp(v[k] - m)
        return m + math.log(acc)

    @njit(cache=True, nogil=True)
    def _bulk_stats(
        X: np.ndarray, AT: np.ndarray, VT: np.ndarray, log_w: np.ndarray, a: np.ndarray, model: int, res: np.ndarray
    ) -> None:  # pragma: no cover - compiled
        """``res[s]`` <- ``(log|F|, min log b, max log b, ||v||^2_mu, log|dF|)`` of state ``X[s]`` (see
        :func:`bulk_stats`)."""
        S, N, d = X.shape
        H = AT.shape[1]
        M = np.empty((1, H, N, d))
        logZ = np.empty((1, H, N))
        E, kk, xT, q, num, eye = _means_scratch(N, d, H)  # once for every state
        log_a = np.log(a)
        tmp_h = np.empty(H)
        log_S = np.empty(N)
        row = np.empty(N)
        u = np.empty(d)
        g = np.empty(d)
        for s in range(S):
            _means_into(X[s], AT[s], a, eye, E, kk, xT, q, num, logZ[0], M[0])
            for i in range(N):
                for h in range(H):
                    tmp_h[h] = logZ[0, h, i] + log_w[h]
                log_S[i] = _lse(tmp_h)
            for i in range(N):
                row[i] = log_S[i] + log_a[i]
            log_F = _lse(row) - math.log(2.0)
            bmin, bmax = np.inf, -np.inf
            speed2 = 0.0
            for i in range(N):
                bmin = min(bmin, -log_S[i])
                bmax = max(bmax, -log_S[i])
                # the field of the model (values V) and the gf field of A alone, then P_x
                for c in range(d):
                    u[c] = 0.0
                    g[c] = 0.0
                for h in range(H):
                    soft = math.exp(logZ[0, h, i] + log_w[h] - log_S[i])  # gf: softmax_h(log Z_h + log w_h)
                    ch = math.exp(log_w[h]) if model == 0 else soft
                    for r in range(d):
                        vm = 0.0
                        am = 0.0
                        for c in range(d):
                            vm += VT[s, h, c, r] * M[0, h, i, c]
                            am += AT[s, h, c, r] * M[0, h, i, c]
                        u[r] += ch * vm
                        g[r] += soft * am
                xu = 0.0
                xg = 0.0
                for c in range(d):
                    xu += X[s, i, c] * u[c]
                    xg += X[s, i, c] * g[c]
                vv = 0.0
                gg = 0.0
                for c in range(d):
                    vc = u[c] - X[s, i, c] * xu
                    gc = g[c] - X[s, i, c] * xg
                    vv += vc * vc
                    gg += gc * gc
                speed2 += a[i] * math.exp(log_S[i]) * vv
                row[i] = log_a[i] + log_S[i] + (math.log(gg) if gg > 0 else -np.inf)
            res[s, 0] = log_F
            res[s, 1] = bmin
            res[s, 2] = bmax
            res[s, 3] = speed2
            res[s, 4] = 0.5 * _lse(row)


def bulk_stats(X: np.ndarray, A: np.ndarray, V: np.ndarray, w: np.ndarray, a: np.ndarray, model: str) -> np.ndarray:
    """``(S, 5)``: for each state ``X[s]`` ``(N, d)`` with plain heads ``A[s]``, values ``V[s]`` ``(H, d, d)``,
    head masses ``w`` and token masses ``a``: ``log|F|``, ``min_i log b``, ``max_i log b``, the squared
    metric speed of the field of ``model`` (``mha`` or ``gf``) and ``log|dF|``, the formulas of
    :class:`~attnflow.dynamics.fields.FieldStats` (``log_abs_energy``, ``log_mobility``, ``speed_sq``,
    ``log_slope``) compiled state by state (``tests/analysis/test_bulk_diagnostics.py`` checks them
    against it)."""
    if model not in ("mha", "gf"):
        raise ValueError(f"bulk_stats serves the models 'mha' and 'gf'; got {model!r}")
    X = np.ascontiguousarray(X, dtype=np.float64)
    AT = np.ascontiguousarray(np.swapaxes(A, -1, -2), dtype=np.float64)
    VT = np.ascontiguousarray(np.swapaxes(V, -1, -2), dtype=np.float64)
    res = np.empty((X.shape[0], 5))
    _bulk_stats(X, AT, VT, np.log(np.asarray(w, dtype=np.float64)), np.ascontiguousarray(a, dtype=np.float64),
                MODEL_CODES[model], res)  # fmt: skip
    return res


if AVAILABLE:

    @njit(cache=True, nogil=True)
    def _union(parent: np.ndarray, i: int, j: int) -> int:  # pragma: no cover - compiled
        """Union-find: join the sets of ``i`` and ``j`` (the smaller root becomes the root, both paths
        compressed onto it); 1 when they were apart (one component fewer), else 0."""
        ri = i
        while parent[ri] != ri:
            ri = parent[ri]
        rj = j
        while parent[rj] != rj:
            rj = parent[rj]
        root = min(ri, rj)
        merged = 0
        if ri != rj:
            parent[max(ri, rj)] = root
            merged = 1
        for k0 in (i, j):
            k = k0
            while parent[k] != k:
                nxt = parent[k]
                parent[k] = root
                k = nxt
        return merged

    @njit(cache=True, nogil=True)
    def component_counts(adj: np.ndarray) -> np.ndarray:  # pragma: no cover - compiled
        """Connected components of each symmetric graph ``adj[s]`` ``(N, N)``: union-find over the upper triangles, ``O(S N^2)``, compiled
        (a clustered cloud's cliques would give scipy ``N^2`` edges to sort)."""
        S, N, _ = adj.shape
        out = np.empty(S, dtype=np.int64)
        parent = np.empty(N, dtype=np.int64)
        for s in range(S):
            for i in range(N):
                parent[i] = i
            count = N
            for i in range(N):
                for j in range(i + 1, N):
                    if adj[s, i, j]:
                        count -= _union(parent, i, j)
            out[s] = count
        return out

    @njit(cache=True, nogil=True)
    def gram_batch(X: np.ndarray, thr: float) -> tuple[np.ndarray, np.ndarray]:  # pragma: no cover - compiled
        """``(min_{i != j} <x_i, x_j>, components of <x_i, x_j> > thr)`` of each state ``X[s]``, the
        Gram entries made on the fly (no ``(S, N, N)`` array), union-find as :func:`component_counts`
        (:func:`attnflow.analysis.diagnostics.bulk_state_diagnostics`)."""
        S, N, d = X.shape
        mn = np.empty(S)
        out = np.empty(S, dtype=np.int64)
        parent = np.empty(N, dtype=np.int64)
        for s in range(S):
            x = X[s]
            for i in range(N):
                parent[i] = i
            count = N
            best = np.inf
            for i in range(N):
                for j in range(i + 1, N):
                    g = 0.0
                    for c in range(d):
                        g += x[i, c] * x[j, c]
                    best = min(best, g)
                    if g > thr:
                        count -= _union(parent, i, j)
            mn[s] = best
            out[s] = count
        return mn, out


#: The compiled functions a run through this path calls (the step, the batched step, dense output and
#: the deferred diagnostics pass): :func:`attnflow.kernels.announce.prepare` compiles them in a child
#: process when numba's cache lacks them, so that a run's bits do not depend on whether it compiled.
RUN_KERNELS: tuple[object, ...] = (
    (_attempt, _batched_attempt, _dense, _dense_and_points, _bulk_stats, gram_batch) if AVAILABLE else ()
)
