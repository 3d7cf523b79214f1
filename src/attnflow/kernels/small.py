"""Small clouds at compiled speed: the field of a few hundred tokens, and a whole embedded
Runge-Kutta step, in one compiled call (numba).

At ``N = 32`` one field evaluation is about 10,000 multiply-adds: torch's dispatch of the dozens of
small operations a pass makes (kernel, head mix, projection, the stage sums of a 13-stage step)
costs 50-100 times the arithmetic. Here the kernel, the head mix of each model and the step run as
one loop nest.

The formulas are those of :mod:`attnflow.kernels.dense` (``out_h(x_i)``, ``log Z_h(x_i)``, row
maximum subtracted before ``exp``) and of :meth:`attnflow.dynamics.fields.FieldStats.head_mix`
(``mha``: ``c_h = w_h``; ``gf``: ``c_h = softmax_h(log Z_h + log w_h)``; ``usa``:
``c_h = w_h Z_h``); ``tests/kernels/test_small_kernel.py`` checks the compiled field against
:class:`~attnflow.dynamics.fields.FieldStats` to 1e-13 for every model, with masses and several
heads. Only plain heads are served (``A_h``, ``V_h``; no biases, causal mask or rotary
positions): :func:`supported` says when.

The step functions take the tableau as arrays (:class:`attnflow.schemes.integrators.EmbeddedPair`
keeps it): stage ``s`` at ``x + dt sum_r a_sr k_r``, the new point ``retract(x + dt sum_s b_s k_s)``
(FSAL: the last stage is the field there), and the error norm of
:meth:`attnflow.solve.loop.Controller.norm`, ``sqrt(mean((e / (atol + rtol max(|x|, |y|)))^2))``,
with DOP853's combined estimate when ``e3`` is given.
"""

from __future__ import annotations

import math

import numpy as np

from attnflow.core.errors import FloatRangeError

try:
    from numba import njit, objmode

    AVAILABLE = True
except ImportError:  # pragma: no cover - numba is a declared dependency
    AVAILABLE = False

__all__ = ["AVAILABLE", "MODEL_CODES", "supported", "field", "embedded_attempt"]

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


if AVAILABLE:
    # Reassociation lets LLVM vectorise the token sums; no "nnan"/"ninf": the overflow checks must stay.
    @njit(cache=True, fastmath={"reassoc", "contract", "nsz"})
    def _field(
        x: np.ndarray,
        AT: np.ndarray,
        V: np.ndarray,
        log_w: np.ndarray,
        a: np.ndarray,
        model: int,
        u: np.ndarray,
        logZ: np.ndarray,
        outs: np.ndarray,
        E: np.ndarray,
        vector_exp: bool,
    ) -> bool:  # pragma: no cover - compiled
        """``u`` ``(N, d)`` <- the projected field ``P_x sum_h c_h out_h``; returns False on overflow (usa).

        ``E`` ``(H, N, N)`` is scratch for the exponents. ``vector_exp``: exponentiate them in one
        call to NumPy's vectorised ``exp`` (SIMD, 3 ns a value here against 24 ns for the compiled
        scalar ``exp``; the call costs about 10 us, so it pays from a few hundred values up).
        """
        N, d = x.shape
        H = AT.shape[0]
        xT = np.empty((d, N))  # token-contiguous rows: the j loops below run over unit strides
        for j in range(N):
            for c in range(d):
                xT[c, j] = x[j, c]
        q = np.empty(d)
        num = np.empty(d)
        m = np.empty((H, N))
        for h in range(H):
            for i in range(N):
                # q = A_h^T x_i, so s_j = x_i^T A_h x_j = q . x_j
                for c in range(d):
                    acc = 0.0
                    for r in range(d):
                        acc += AT[h, c, r] * x[i, r]
                    q[c] = acc
                s = E[h, i]
                for j in range(N):
                    s[j] = q[0] * xT[0, j]
                for c in range(1, d):
                    qc = q[c]
                    for j in range(N):
                        s[j] += qc * xT[c, j]
                mi = s.max()
                m[h, i] = mi
                for j in range(N):
                    s[j] -= mi
        if vector_exp:
            with objmode():
                np.exp(E, out=E)
        else:
            for h in range(H):
                for i in range(N):
                    for j in range(N):
                        E[h, i, j] = math.exp(E[h, i, j])
        ok = True
        for i in range(N):
            for h in range(H):
                s = E[h, i]
                Z = 0.0
                for j in range(N):
                    e = a[j] * s[j]
                    s[j] = e
                    Z += e
                for c in range(d):
                    acc = 0.0
                    for j in range(N):
                        acc += s[j] * xT[c, j]
                    num[c] = acc
                logZ[h] = m[h, i] + math.log(Z)
                for r in range(d):
                    acc = 0.0
                    for c in range(d):
                        acc += V[h, r, c] * num[c]
                    outs[h, r] = acc / Z
            for c in range(d):
                u[i, c] = 0.0
            if model == 0:  # mha: c_h = w_h
                for h in range(H):
                    wh = math.exp(log_w[h])
                    for c in range(d):
                        u[i, c] += wh * outs[h, c]
            elif model == 1:  # gf: c_h = softmax_h(log Z_h + log w_h)
                mm = -np.inf
                for h in range(H):
                    if logZ[h] + log_w[h] > mm:
                        mm = logZ[h] + log_w[h]
                tot = 0.0
                for h in range(H):
                    ch = math.exp(logZ[h] + log_w[h] - mm)
                    tot += ch
                    for c in range(d):
                        u[i, c] += ch * outs[h, c]
                for c in range(d):
                    u[i, c] /= tot
            else:  # usa: c_h = w_h Z_h
                for h in range(H):
                    ch = math.exp(logZ[h] + log_w[h])
                    if not math.isfinite(ch):
                        ok = False
                    for c in range(d):
                        u[i, c] += ch * outs[h, c]
            dot = 0.0
            for c in range(d):
                dot += x[i, c] * u[i, c]
            for c in range(d):
                u[i, c] -= dot * x[i, c]
        return ok

    @njit(cache=True)
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
        vector_exp: bool,
    ) -> tuple[float, bool]:  # pragma: no cover
        """One trial step from ``x``: ``y`` <- the new point (retracted), ``ks[s]`` <- the stages.

        Returns ``(err, ok)``: the controller's error norm of the embedded estimate, and False if the
        field overflowed or a state is not finite.
        """
        N, d = x.shape
        S = c_.shape[0]
        H = AT.shape[0]
        logZ = np.empty(H)
        outs = np.empty((H, d))
        z = np.empty((N, d))
        E = np.empty((H, N, N))
        ok = True
        if have_k1:
            ks[0, :, :] = k1
        else:
            ok = _field(x, AT, V, log_w, a, model, ks[0], logZ, outs, E, vector_exp) and ok
        last = S - 1 if fsal else S
        for s in range(1, last):
            for i in range(N):
                for c in range(d):
                    acc = 0.0
                    for r in range(s):
                        acc += A_[s, r] * ks[r, i, c]
                    z[i, c] = x[i, c] + dt * acc
            ok = _field(z, AT, V, log_w, a, model, ks[s], logZ, outs, E, vector_exp) and ok
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
            ok = _field(y, AT, V, log_w, a, model, ks[S - 1], logZ, outs, E, vector_exp) and ok
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


#: From this many exponentials per evaluation (``H N^2``) up, NumPy's vectorised ``exp`` is called
#: (measured per evaluation of a dop853 step, one head: equal at N = 32, 1.7x faster at 64, 2x at 128).
VECTOR_EXP_FROM = 2048


def vector_exp(N: int, H: int) -> bool:
    """Whether an evaluation of ``N`` tokens and ``H`` heads exponentiates through NumPy."""
    return H * N * N >= VECTOR_EXP_FROM


def _heads_arrays(A: np.ndarray, V: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    AT = np.ascontiguousarray(np.swapaxes(A, 1, 2), dtype=np.float64)
    return AT, np.ascontiguousarray(V, dtype=np.float64), np.log(np.asarray(w, dtype=np.float64))


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
    E = np.empty((H, N, N))
    if not _field(
        x,
        AT,
        Vc,
        log_w,
        np.asarray(a, dtype=np.float64),
        MODEL_CODES[model],
        u,
        np.empty(H),
        np.empty((H, d)),
        E,
        vector_exp(N, H),
    ):
        raise FloatRangeError("the unnormalised ('usa') field overflows: lower beta or use model 'gf' or 'mha'.")
    return u


def embedded_attempt(
    x: np.ndarray, dt: float, A: np.ndarray, V: np.ndarray, w: np.ndarray, a: np.ndarray, model: str,
    tableau: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, bool],
    rtol: float, atol: float, k1: np.ndarray | None = None,
) -> tuple[np.ndarray, float, np.ndarray, np.ndarray, bool]:  # fmt: skip
    """One trial step of an embedded pair (``tableau = (c, A, b, e5, e3, fsal)``, see the module
    docstring): ``(y, err, k_first, k_last, ok)``. ``k1``: the field at ``x`` if already known (FSAL)."""
    AT, Vc, log_w = _heads_arrays(A, V, w)
    c_, A_, b_, e5, e3, fsal = tableau
    N, d = x.shape
    ks = np.empty((c_.shape[0], N, d))
    y = np.empty((N, d))
    first = ks[0] if k1 is None else np.ascontiguousarray(k1, dtype=np.float64)
    err, ok = _attempt(
        np.ascontiguousarray(x, dtype=np.float64), float(dt), AT, Vc, log_w, np.asarray(a, dtype=np.float64),
        MODEL_CODES[model], c_, A_, b_, e5, e3, fsal, float(rtol), float(atol),
        first, k1 is not None, y, ks, vector_exp(N, AT.shape[0]),
    )  # fmt: skip
    return y, float(err), ks[0].copy(), ks[-1].copy(), bool(ok)


if AVAILABLE:

    @njit(cache=True)
    def _batched_attempt(
        X: np.ndarray,
        dts: np.ndarray,
        active: np.ndarray,
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
        KL: np.ndarray,
        errs: np.ndarray,
        oks: np.ndarray,
        vector_exp: bool,
    ) -> None:  # pragma: no cover - compiled
        """:func:`_attempt` for every active member ``b`` of ``X`` ``(B, N, d)`` with its own step
        ``dts[b]`` and heads ``AT[b]``, ``V[b]``: ``Y[b]``, ``KL[b]`` (last stage), ``errs[b]``, ``oks[b]``."""
        B, N, d = X.shape
        S = c_.shape[0]
        ks = np.empty((S, N, d))
        for b in range(B):
            if not active[b]:
                continue
            err, ok = _attempt(
                X[b], dts[b], AT[b], V[b], log_w, a, model, c_, A_, b_, e5, e3, fsal, rtol, atol, K1[b],
                have_k1[b], Y[b], ks, vector_exp,
            )  # fmt: skip
            KL[b] = ks[S - 1]
            errs[b] = err
            oks[b] = ok


def batched_attempt(
    X: np.ndarray, dts: np.ndarray, active: np.ndarray, A: np.ndarray, V: np.ndarray, w: np.ndarray,
    a: np.ndarray, model: str, tableau: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, bool],
    rtol: float, atol: float, K1: np.ndarray, have_k1: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
    """One trial step of every active member of an ensemble ``X`` ``(B, N, d)``, each with its own step
    ``dts`` ``(B,)`` and heads ``A``, ``V`` ``(B, H, d, d)``: ``(Y, errs, K_last, oks)`` (inactive
    members' rows are left unset). ``K1`` ``(B, N, d)``: the first stage where ``have_k1``."""
    B, N, d = X.shape
    AT = np.ascontiguousarray(np.swapaxes(A, 2, 3), dtype=np.float64)
    c_, A_, b_, e5, e3, fsal = tableau
    Y, KL = np.empty_like(X), np.empty_like(X)
    errs, oks = np.full(B, np.inf), np.zeros(B, dtype=np.bool_)
    _batched_attempt(
        X, dts, active, AT, np.ascontiguousarray(V, dtype=np.float64), np.log(np.asarray(w, dtype=np.float64)),
        np.asarray(a, dtype=np.float64), MODEL_CODES[model], c_, A_, b_, e5, e3, fsal, float(rtol), float(atol),
        K1, have_k1, Y, KL, errs, oks, vector_exp(N, A.shape[1]),
    )  # fmt: skip
    return Y, errs, KL, oks
