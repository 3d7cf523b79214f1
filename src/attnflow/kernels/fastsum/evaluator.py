"""The evaluator of a run: fast summation's caches and thread policy in one object a caller passes.

A :class:`FastSumEvaluator` owns what one run reuses between its calls: the coefficient matrices of
the last few weight matrices (a Runge-Kutta step visits each stage time, and the energy checks
revisit them), the key moments of the last token cloud (a recorder evaluates the same tokens with
several weight matrices), the feature buffers, and the monomial tables of each ``(P, d)``. The
buffers are written in place, so each thread using the evaluator gets its own set (two threads never
share a buffer); two evaluators share nothing. Its :class:`~attnflow.core.threads.ThreadPolicy`
decides how many cores a call uses, from the call's size.

The module functions :func:`fast_stats`, :func:`fast_gf_field` and :func:`fast_head_means` take an
``evaluator`` (a run passes its own, through its :class:`~attnflow.kernels.dispatch.KernelOptions`);
without one, a call makes a fresh evaluator and keeps nothing.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from attnflow.core.errors import Hint, InputError, NumericalError
from attnflow.core.threads import ThreadPolicy
from attnflow.kernels.fastsum.bounds import (
    MAX_DEGREE,
    MAX_DIM,
    MAX_FEATURES,
    FastSumPlan,
    float32_rounding_bound,
    mean_norm_unit,
    plan,
)
from attnflow.kernels.fastsum.coefficients import kernel_coefficients
from attnflow.kernels.fastsum.features import BLOCK_TOKENS, FeatureBuilder, MonomialTables, moments_to_keys, n_monomials
from attnflow.kernels.fastsum.parallel import loops, on_cores
from attnflow.kernels.fastsum.profiling import open_split, timed

#: Tokens per block of the compiled CPU path: its feature block (``M x 128`` float64, 230 KiB at
#: ``P = 14``) stays in the core's L2 cache between being built, multiplied and divided. With the
#: whole loop compiled (no Python between blocks), 128 measured fastest (0.21 s at N = 1e6 against
#: 0.24 s for 256 to 2048).
CPU_BLOCK_TOKENS = 128
#: Coefficient matrices kept per evaluator: a Runge-Kutta step visits each stage time (and the energy
#: checks revisit them), so a handful of entries saves nearly every rebuild.
COEFFICIENT_CACHE_ENTRIES = 8
#: Models whose head mix the compiled loop can apply (``fast_stats(mix=...)``): ``mha`` (constant
#: weights) and ``gf`` (softmax weights, ``sum_h w_h V_h num_h / sum_h w_h Z_h``).
MIX_MODELS = {"mha": 1, "gf": 2}


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
    #: (:func:`~attnflow.kernels.fastsum.bounds.float32_rounding_bound`); ``None`` when not computed
    #: (CUDA, no numba, d = 1).
    float32_bound: float | None = None
    #: The heads mixed as they were made, ``(N, d)`` (``fast_stats(mix=...)``), else ``None``.
    mixed: torch.Tensor | None = None


@dataclass(frozen=True)
class _QueryRows:
    """What the query side needs: the unit tokens, the plan, the rows ``Wt`` ``(H (1 + dv), M)`` (per
    head ``[Z_h, V_h num_h]``), their precision and float32 bound, and the worker threads to use."""

    x64: torch.Tensor
    a64: torch.Tensor
    A64: torch.Tensor
    fp: FastSumPlan
    Wt: torch.Tensor
    dv: int
    precision: str
    bound32: float | None
    workers: int


def compiled(x64: torch.Tensor) -> bool:
    """Whether the compiled CPU loops serve ``x64`` (numba present, CPU tensor, ``2 <= d <= 4``)."""
    return x64.device.type == "cpu" and 2 <= x64.shape[-1] <= MAX_DIM and bool(loops().AVAILABLE)


def unit_cloud_and_plan(
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
    m_norm = mean_norm_unit(x64, a64) if fast_plan is None or jensen else math.nan
    fp = fast_plan or plan(A, tol, m_norm)
    if fp is None:
        raise InputError(
            f"fast summation would need more than degree {MAX_DEGREE} or {MAX_FEATURES} features for tol={tol} at beta="
            f"{float(torch.linalg.matrix_norm(A.double(), ord=2).max()):.3g}; use the dense kernel (kernel.backend) "
            "or a larger tolerance (kernel.tolerance)",
            hint=Hint("kernel.backend", "auto"),
        )
    return x64, a64, fp, m_norm


class FastSumEvaluator:
    """Fast summation for one run: its caches and its thread policy (see the module docstring).

    ``threads``: the :class:`~attnflow.core.threads.ThreadPolicy` deciding the cores of each call
    (default: chosen from the call's size). Safe to use from several threads at once (each has its
    own buffers and caches); picklable (the caches are not carried).
    """

    def __init__(self, threads: ThreadPolicy | None = None) -> None:
        self.threads = ThreadPolicy() if threads is None else threads
        self._local = threading.local()

    def __getstate__(self) -> dict[str, Any]:
        return {"threads": self.threads}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["threads"])  # type: ignore[misc]

    def __repr__(self) -> str:
        return f"FastSumEvaluator(threads={self.threads!r})"

    # --- what the evaluator keeps -----------------------------------------------------------------

    def _kept(self, name: str, factory: Any) -> Any:
        value = getattr(self._local, name, None)
        if value is None:
            value = factory()
            setattr(self._local, name, value)
        return value

    def tables(self, P: int, d: int) -> MonomialTables:
        """The :class:`MonomialTables` of ``(P, d)``, built once per evaluator (and thread)."""
        kept: dict[tuple[int, int], MonomialTables] = self._kept("tables", dict)
        if (P, d) not in kept:
            kept[(P, d)] = MonomialTables(P, d)
        return kept[(P, d)]

    def workers(self, N: int, fp: FastSumPlan, H: int) -> int:
        """Threads for a call over ``N`` tokens, ``fp.features`` features and ``H`` heads (the policy's
        choice for ``N M H`` multiply-adds per pass, the analogue of the dense kernel's pairs)."""
        return self.threads.for_work(float(N) * fp.features * max(1, H))

    def coefficients(self, A64: torch.Tensor, fp: FastSumPlan, workers: int) -> tuple[torch.Tensor, torch.Tensor]:
        """:func:`~attnflow.kernels.fastsum.coefficients.kernel_coefficients`, kept for the last
        :data:`COEFFICIENT_CACHE_ENTRIES` weight matrices."""
        cache: OrderedDict[tuple, tuple[torch.Tensor, torch.Tensor]] = self._kept("coefficients", OrderedDict)
        key = (A64.cpu().numpy().tobytes(), tuple(A64.shape), str(A64.device), fp.degree, fp.beta)
        if key in cache:
            cache.move_to_end(key)
        else:
            tables = self.tables(fp.degree, int(A64.shape[-1]))
            cache[key] = kernel_coefficients(A64, fp, tables=tables, workers=workers)
            while len(cache) > COEFFICIENT_CACHE_ENTRIES:
                cache.popitem(last=False)
        return cache[key]

    def moments(
        self, x: torch.Tensor, a: torch.Tensor, x64: torch.Tensor, a64: torch.Tensor, P: int, workers: int
    ) -> torch.Tensor:
        """``G = sum_j a_j [phi_P; phi_{P-1}](x_j) [1, x_j^T]`` ``(M, d + 1)``, shared by every head.

        Kept for the last token cloud (the same tensors, unmodified since): the moments do not depend
        on the weights.
        """
        kept: dict[str, object] = self._kept("moments", dict)
        key = (P, x.device, x._version, a._version)
        if kept.get("x") is x and kept.get("a") is a and kept.get("key") == key:
            return kept["G"]  # type: ignore[return-value]
        d = x64.shape[-1]
        N = x64.shape[0]
        tables = self.tables(P, d)
        if compiled(x64):
            cpu = loops()
            exps, xn, wn = tables.moment_exponents, x64.numpy(), a64.contiguous().numpy()
            acc = np.zeros((cpu.GROUPS, exps.shape[0]))
            if d == 3:
                k_hi, k_lo = tables.moment_pairs
                on_cores(
                    lambda k, lo, hi: cpu.weighted_moments3(xn, wn, P + 1, k_hi, k_lo, lo, hi, acc), cpu.GROUPS, workers
                )
            else:
                on_cores(lambda k, lo, hi: cpu.weighted_moments(xn, wn, exps, P + 1, lo, hi, acc), cpu.GROUPS, workers)
            # the groups in a fixed order, whatever the threads
            G = torch.from_numpy(moments_to_keys(acc.sum(0), P, d, tables))
        else:
            G = x64.new_zeros(n_monomials(P, d) + n_monomials(P - 1, d), d + 1)
            build = self.builder(P, d, min(N, BLOCK_TOKENS), x64.device)
            for s in range(0, N, BLOCK_TOKENS):
                xs = x64[s : s + BLOCK_TOKENS]
                rhs = a64[s : s + BLOCK_TOKENS, None] * torch.cat([xs.new_ones(len(xs), 1), xs], dim=1)
                G.addmm_(build(xs), rhs)
        kept.clear()
        kept.update(x=x, a=a, key=key, G=G)
        return G

    def builder(self, P: int, d: int, n: int, device: torch.device) -> FeatureBuilder:
        """The float64 feature workspace for ``(P, d)``, kept between calls (the buffers are reused)."""
        kept: dict[str, object] = self._kept("builder", dict)
        key = (P, d, n, str(device))
        if kept.get("key") != key:
            kept.clear()
            kept.update(key=key, value=FeatureBuilder(P, d, n, torch.float64, device))
        return kept["value"]  # type: ignore[return-value]

    # --- the evaluations --------------------------------------------------------------------------

    def query_rows(
        self,
        x: torch.Tensor,
        A: torch.Tensor,
        V: torch.Tensor | None,
        a: torch.Tensor,
        tol: float,
        fast_plan: FastSumPlan | None,
    ) -> _QueryRows:
        d = x.shape[-1]
        # The Jensen factor |m| also gives the float32 bound (the compiled path's precision).
        x64, a64, fp, m_norm = unit_cloud_and_plan(x, A, a, tol, fast_plan, jensen=compiled(x))
        A64 = A.detach().to(torch.float64)
        T = self.workers(x64.shape[0], fp, A.shape[0])
        with timed("moments"):
            G = self.moments(x, a, x64, a64, fp.degree, T)
        with timed("coefficients"):
            C_P, C_Q = self.coefficients(A64, fp, T)
            MP = C_P.shape[-1]
            W = torch.cat([C_P @ G[:MP], C_Q @ G[MP:]], dim=1)  # (H, M, d + 1)
            if V is None:
                Wt = W[:, :, 0]  # only Z is needed: (H, M)
            else:
                # V_h folded into the coefficients: the rows give Z_h and V_h num_h, no (H, N, d) product left.
                V64 = V.detach().to(torch.float64)
                Wt = torch.cat([W[:, None, :, 0], V64 @ W[:, :, 1:].transpose(1, 2)], dim=1).reshape(-1, fp.features)
        dv = 0 if V is None else int(V.shape[-2])  # value rows per head (V may stack extra values)
        bound32: float | None = None
        precision = "float64"
        if compiled(x64):
            with timed("coefficients"):
                normV = None if V is None else torch.linalg.matrix_norm(V.detach().to(torch.float64), ord=2)
                floor = math.exp(-fp.beta * m_norm) - fp.kernel_error
                bound32 = float32_rounding_bound(Wt, (C_P, C_Q), G, normV, floor, fp.degree, d)
            if fp.relative_bound + bound32 <= fp.tol:
                precision = "float32"
        return _QueryRows(x64, a64, A64, fp, Wt, dv, precision, bound32, T)

    def stats(
        self,
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
        """:func:`fast_stats` with this evaluator's caches and threads."""
        q = self.query_rows(x, A, V, a, tol, fast_plan)
        H = A.shape[0]
        if compiled(q.x64):
            mixing = mix if mix is not None and q.dv and mix[0] in MIX_MODELS else None
            dtype32 = torch.float32 if q.precision == "float32" else torch.float64
            logZ, out = self.evaluate_cpu(q.x64, q.Wt, q.fp.degree, H, q.dv, q.workers, dtype32, mixing)
            mixed, out = (out, None) if mixing is not None else (None, out)
        else:
            logZ, out = self.evaluate_torch(q.x64, q.Wt, q.fp.degree, H, q.dv)
            mixed = None
        V64 = None if V is None else V.detach().to(torch.float64)
        achieved = check_errors(q.x64, q.A64, V64, q.a64, out, logZ, check, seed)
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

    def gf_field(
        self,
        x: torch.Tensor,
        A: torch.Tensor,
        V: torch.Tensor | None,
        a: torch.Tensor,
        w: torch.Tensor,
        *,
        tol: float = 1e-10,
        fast_plan: FastSumPlan | None = None,
    ) -> FastSumResult:
        """:func:`fast_gf_field` with this evaluator's caches and threads."""
        V = A if V is None else V
        q = self.query_rows(x, A, V, a, tol, fast_plan)
        H, d = A.shape[0], x.shape[-1]
        w64 = w.detach().to(torch.float64).to(q.Wt.device)
        Wt = (w64 @ q.Wt.reshape(H, -1)).reshape(1 + d, -1)
        if compiled(q.x64):
            dtype32 = torch.float32 if q.precision == "float32" else torch.float64
            logS, u = self.evaluate_cpu(q.x64, Wt, q.fp.degree, 1, d, q.workers, dtype32)
        else:
            logS, u = self.evaluate_torch(q.x64, Wt, q.fp.degree, 1, d)
        assert u is not None
        return FastSumResult(
            mixed=u[0].to(x.dtype),
            out=None,
            logZ=logS.to(x.dtype),
            plan=q.fp,
            precision=q.precision,
            float32_bound=q.bound32,
        )

    def head_means(
        self,
        x: torch.Tensor,
        A: torch.Tensor,
        a: torch.Tensor,
        *,
        tol: float = 1e-10,
        fast_plan: FastSumPlan | None = None,
    ) -> torch.Tensor:
        """:func:`fast_head_means` with this evaluator's caches and threads."""
        x64, a64, fp, _ = unit_cloud_and_plan(x, A, a, tol, fast_plan, jensen=False)
        T = self.workers(x64.shape[0], fp, A.shape[0])
        with timed("moments"):
            G = self.moments(x, a, x64, a64, fp.degree, T)
        with timed("coefficients"):
            C_P, C_Q = self.coefficients(A.detach().to(torch.float64), fp, T)
            MP = C_P.shape[-1]
            g_P, g_Q = G[:MP, 0].to(C_P.device), G[MP:, 0].to(C_P.device)
            means = (C_P @ g_P) @ g_P + (C_Q @ g_Q) @ g_Q
        if not bool((means > 0).all()):
            raise NumericalError(
                "fast summation produced a non-positive partition function; use the dense kernel (kernel.backend)",
                hint=Hint("kernel.backend", "flash"),
            )
        return means.to(x.dtype)

    def evaluate_torch(
        self, x64: torch.Tensor, Wt: torch.Tensor, P: int, H: int, dv: int
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Query side with the torch feature builder (any device): ``R = Wt phi(x_i)`` in small blocks
        (rebuilding the features is cheaper than storing them), then ``log Z`` and ``out = V num / Z``."""
        N = x64.shape[0]
        R = x64.new_empty(Wt.shape[0], N)
        build = self.builder(P, x64.shape[-1], min(N, BLOCK_TOKENS), x64.device)
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
            raise NumericalError(
                "fast summation produced a non-positive partition function; use the dense kernel (kernel.backend)",
                hint=Hint("kernel.backend", "flash"),
            )
        return torch.log(Z), None if num is None else num / Z.unsqueeze(-1)

    def evaluate_cpu(
        self,
        x64: torch.Tensor,
        Wt: torch.Tensor,
        P: int,
        H: int,
        dv: int,
        workers: int,
        dtype: torch.dtype = torch.float64,
        mix: tuple[str, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Query side on the CPU: one compiled loop per worker over blocks of :data:`CPU_BLOCK_TOKENS`
        tokens, each block's features, product ``R = Wt F`` (BLAS; that orientation runs near the GEMM
        peak, ``F^T Wt^T`` measured 3x slower) and division made while the block is in the cache
        (:func:`attnflow.kernels.fastsum.cpu.evaluate_blocks`); then ``log Z`` in one vectorised pass.

        Nothing returns to Python between blocks: per-block calls from Python (a numba dispatch and a
        torch product each) cost ~20 us, which at small blocks outweighed what the caches gave. BLAS
        and torch run on one thread meanwhile (:func:`~attnflow.kernels.fastsum.parallel.on_cores`).
        No ``(rows, N)`` array of products is made (its fresh pages alone, 256 MB at N = 1e6, cost
        ~20 ms to fault in).
        """
        N = x64.shape[0]
        xn = x64.numpy()
        exps = self.tables(P, x64.shape[-1]).exponents
        nb = min(N, CPU_BLOCK_TOKENS)
        blocks = -(-N // nb)
        Wn = Wt.to(dtype).contiguous().numpy()
        np_dtype = Wn.dtype
        cpu = loops()
        mode = 0 if mix is None else MIX_MODELS[mix[0]]
        out = np.empty((H, N, dv) if mode == 0 else (0, 0, 0))
        u = np.empty((N, dv) if mode else (0, 0))
        c = np.zeros(H) if mix is None else mix[1].detach().to(torch.float64).cpu().numpy()
        Z = np.empty((H, N))  # Z, then log Z in place

        T = max(1, min(workers, blocks))  # the shares on_cores makes: one feature and product buffer each
        kept = self._kept("cpu_features", dict)
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
            on_cores(
                lambda k, lo, hi: ok.append(
                    cpu.evaluate_blocks(xn, exps, P, Wn, lo, hi, H, dv, out, Z, bufs[k], prods[k], stages, c, mode, u)
                ),
                blocks,
                T,
            )
            return time.perf_counter() - start

        whole = run(3)
        split = open_split()
        if split is not None:
            # A profile splits the loop's time by rerunning it: features only, features and products,
            # division only (into scratch arrays). The three are scaled to the fused loop's own time;
            # the reruns are left out of the profile's total.
            # Each rerun is the fastest of three: a difference of two single timings is noise (even
            # negative) when other work shares the cores, the minimum is what the stage costs.
            good = all(ok)
            rerun_start = time.perf_counter()
            built, both = min(run(1) for _ in range(3)), min(run(2) for _ in range(3))
            divided = min(run(4, np.empty_like(out), np.empty_like(u), np.empty_like(Z)) for _ in range(3))
            ok[:] = [good]
            rerun_time = time.perf_counter() - rerun_start
            parts = {"features": built, "evaluation": max(0.0, both - built), "division": divided}
            scale = whole / sum(parts.values())
            for name, t in parts.items():
                split[name] = split.get(name, 0.0) + t * scale
            split["rerun"] = split.get("rerun", 0.0) + rerun_time
        if not all(ok):
            raise NumericalError(
                "fast summation produced a non-positive partition function; use the dense kernel (kernel.backend)",
                hint=Hint("kernel.backend", "flash"),
            )
        with timed("logZ"):
            logZ = torch.from_numpy(Z)
            torch.log(logZ, out=logZ)  # vectorised, on every thread
        if mode:
            return logZ, torch.from_numpy(u)
        return logZ, torch.from_numpy(out) if dv else None


def check_errors(
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


def _evaluator(evaluator: FastSumEvaluator | None, threads: ThreadPolicy | None) -> FastSumEvaluator:
    if evaluator is not None:
        if threads is not None and threads != evaluator.threads:
            raise InputError("give the thread policy to the evaluator (FastSumEvaluator(threads=...)), not both")
        return evaluator
    return FastSumEvaluator(threads)


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
    evaluator: FastSumEvaluator | None = None,
    threads: ThreadPolicy | None = None,
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

    ``evaluator``: the run's :class:`FastSumEvaluator` (its caches and thread policy); ``threads``: a
    :class:`~attnflow.core.threads.ThreadPolicy` for a one-off call (default: from the call's size).
    """
    ev = _evaluator(evaluator, threads)
    return ev.stats(x, A, V, a, tol=tol, fast_plan=fast_plan, check=check, seed=seed, mix=mix)


def fast_gf_field(
    x: torch.Tensor,
    A: torch.Tensor,
    V: torch.Tensor | None,
    a: torch.Tensor,
    w: torch.Tensor,
    *,
    tol: float = 1e-10,
    fast_plan: FastSumPlan | None = None,
    evaluator: FastSumEvaluator | None = None,
    threads: ThreadPolicy | None = None,
) -> FastSumResult:
    """The ``gf`` field before ``P_x``, ``u = sum_h w_h V_h num_h / S`` with ``S = sum_h w_h Z_h``, and ``log S``.

    Both sums are linear in the heads' rows ``[Z_h, V_h num_h]``, so the rows are summed with the
    weights ``w`` before the products: ``1 + d`` rows instead of ``H (1 + d)`` (8x fewer products at
    ``H = 8``). The result reads as one head with weight 1: ``mixed`` is ``u``, ``logZ`` ``(1, N)`` is
    ``log S``, which is all the energy, mobility, metric speed and slope need
    (:class:`attnflow.dynamics.fields.FieldStats` with ``log_w = 0``). Error: ``|S~ - S| <= eps_P`` and
    ``S >= min_h exp(-beta_h |m|)``, so ``S`` and ``u`` (relative to ``max_h ||V_h||``) keep the bound of
    :func:`fast_stats`; the float32 bound of the per-head rows bounds their weighted sums too. ``V``
    ``None`` means ``V = A``. ``evaluator``, ``threads``: as in :func:`fast_stats`.
    """
    return _evaluator(evaluator, threads).gf_field(x, A, V, a, w, tol=tol, fast_plan=fast_plan)


def fast_head_means(
    x: torch.Tensor,
    A: torch.Tensor,
    a: torch.Tensor,
    *,
    tol: float = 1e-10,
    fast_plan: FastSumPlan | None = None,
    evaluator: FastSumEvaluator | None = None,
    threads: ThreadPolicy | None = None,
) -> torch.Tensor:
    """``T_h = sum_i a_i Z_h(x_i) = sum_ij a_i a_j exp(x_i^T A_h x_j)`` ``(H,)``, the mean partition function
    (``F = -1/2 sum_h w_h T_h``), from the key moments alone: ``T_h ~ g^T C^h g`` with ``g = sum_j a_j phi(x_j)``
    (``G[:, 0]`` of :func:`fast_stats`), no pass over the query tokens.

    Each pair's kernel is off by at most ``eps_P`` and ``sum_ij a_i a_j = 1``, so ``|T~ - T| <= eps_P``; by
    Jensen ``T_h >= exp(-beta |m|)``, so the relative error has the bound of ``Z`` in :func:`fast_stats`
    (``plan.relative_bound``, within ``tol``). Tokens off the sphere are taken at their directions.
    ``evaluator``, ``threads``: as in :func:`fast_stats`.
    """
    return _evaluator(evaluator, threads).head_means(x, A, a, tol=tol, fast_plan=fast_plan)
