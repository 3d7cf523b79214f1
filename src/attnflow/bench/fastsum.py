"""Where a fast-summation evaluation spends its time, against this machine's measured limits.

:func:`machine_peaks` measures the float64 and float32 GEMM rates (square products, best of 3)
and the memory bandwidth (a large copy) in the running process. :func:`profile_fast` times one
``mha`` field evaluation by fast summation part by part (:func:`attnflow.kernels.fastsum.profile`)
and sets each part beside its floor: the time it would take at the GEMM peak (the products) or at
the memory bandwidth (the passes over ``(H, N, d)`` arrays). ``x floor`` is how far each part is
from the machine's limit; the total's floor is the sum of the parts' floors.
"""

from __future__ import annotations

import time
from functools import partial
from typing import Any

import numpy as np
import torch

from attnflow.bench.harness import _best
from attnflow.core.geometry import project_tangent
from attnflow.core.heads import Heads, goe_heads
from attnflow.core.tokens import uniform
from attnflow.dynamics.fields import mixed_field
from attnflow.kernels import fastsum
from attnflow.kernels.dispatch import KernelOptions, fast_plan_for

#: Columns of :func:`fast_profile_rows`.
FAST_PROFILE_HEADER = ("part", "seconds", "share", "work", "rate", "machine limit", "floor (s)", "x floor")


def machine_peaks(size: int = 2048, copy_mib: int = 512) -> dict[str, float]:
    """Measured ``gemm64``/``gemm32`` (GFLOP/s, torch's ``mm`` of two ``size x size`` matrices) and
    ``bandwidth`` (GB/s: bytes read plus written by a copy of ``copy_mib`` MiB), best of 3."""
    from scipy.linalg import blas

    out: dict[str, float] = {}
    for name, dtype, gemm in (("gemm64", torch.float64, blas.dgemm), ("gemm32", torch.float32, blas.sgemm)):
        a = torch.randn(size, size, dtype=dtype)
        b = torch.randn(size, size, dtype=dtype)
        c = torch.empty(size, size, dtype=dtype)
        torch.mm(a, b, out=c)
        # the faster of torch's BLAS and SciPy's (the one the compiled loops call through numba)
        af, bf = np.asfortranarray(a.numpy()), np.asfortranarray(b.numpy())
        gemm(1.0, af, bf)
        seconds = min(_best(partial(torch.mm, a, b, out=c), 3), _best(partial(gemm, 1.0, af, bf), 3))
        out[name] = 2.0 * size**3 / seconds / 1e9
    n = copy_mib * 2**20 // 8
    src = torch.ones(n, dtype=torch.float64)
    dst = torch.empty_like(src)
    dst.copy_(src)
    out["bandwidth"] = 2.0 * n * 8 / _best(lambda: dst.copy_(src), 3) / 1e9
    return out


def profile_fast(
    N: int = 1_000_000,
    d: int = 3,
    H: int = 8,
    beta: float = 4.0,
    tol: float = 1e-6,
    repeats: int = 3,
    peaks: dict[str, float] | None = None,
) -> dict[str, Any]:
    """One ``mha`` field evaluation by fast summation (``V = A``, the bench's problem), split by part.

    Returns ``{"N", "d", "H", "beta", "tol", "degree", "features", "peaks", "parts": [...]}`` where each
    part has ``seconds`` (of the fastest repeat), ``work`` and ``unit`` (GFLOP or GB), ``limit`` (the
    machine's rate for that kind of work) and ``floor`` (seconds at that rate).
    """
    peaks = peaks or machine_peaks()
    x = torch.as_tensor(uniform(N, d, seed=0))
    A0 = goe_heads(H, d, 1.0, seed=1)
    A = torch.as_tensor(A0 * beta / np.linalg.norm(A0, ord=2, axis=(1, 2)).max())
    a = torch.full((N,), 1.0 / N, dtype=torch.float64)
    w = torch.full((H,), 1.0 / H, dtype=torch.float64)
    heads, opts = Heads(K=A), KernelOptions("fast", tol)
    fp, _ = fast_plan_for(x, heads, a, options=opts)  # the plan each call below makes again
    assert fp is not None  # backend "fast" raises instead

    def field(y: torch.Tensor) -> dict[str, float]:
        # what a run's step calls (the plan made per call, the heads mixed in the loop)
        with fastsum.profile() as split:
            u = mixed_field(y, heads, a, w, "mha", options=opts)
        t = time.perf_counter()
        project_tangent(y, u)
        split["call"] = split["total"] + time.perf_counter() - t
        return split

    field(x)  # compiles the loops and builds the coefficients once
    best: dict[str, float] | None = None
    for _ in range(repeats):
        split = field(x.clone())  # a new cloud: the key moments are recomputed, as in a run
        if best is None or split["call"] < best["call"]:
            best = split
    assert best is not None
    M, rows = fp.features, H * (d + 1)
    K = len(fastsum.moment_exponents(fp.degree, d))
    g64, bw = peaks["gemm64"], peaks["bandwidth"]
    inside = sum(best.get(k, 0.0) for k in ("moments", "coefficients", "features", "evaluation", "division", "logZ"))
    table = [
        ("key moments", best.get("moments", 0.0), N * K * d / 1e9, "GFLOP", g64),
        ("coefficient products", best.get("coefficients", 0.0), 0.0, "GFLOP", g64),
        # The query loop builds, multiplies and divides each block while it is in the caches: the
        # features never reach memory, so their floor is their d - 1 products per entry.
        ("features (fused loop)", best.get("features", 0.0), N * M * (d - 1) / 1e9, "GFLOP", g64),
        ("products W phi (fused loop)", best.get("evaluation", 0.0), 2.0 * N * M * rows / 1e9, "GFLOP", g64),
        # the heads mixed in the loop: Z (H, N) and the mixed field (N, d) written
        ("division and head mix (fused loop)", best.get("division", 0.0), N * (H + d) * 8 / 1e9, "GB", bw),
        ("log Z", best.get("logZ", 0.0), N * H * 16 / 1e9, "GB", bw),
        ("Python overhead", max(0.0, best["total"] - inside), 0.0, "", 0.0),
        ("tangent projection", max(0.0, best["call"] - best["total"]), N * d * 8 * 3 / 1e9, "GB", bw),
    ]
    parts = [
        dict(part=name, seconds=s, work=w, unit=u, limit=lim, floor=(w / lim if lim > 0 else 0.0))
        for name, s, w, u, lim in table
    ]
    return dict(
        N=N,
        d=d,
        H=H,
        beta=beta,
        tol=tol,
        degree=fp.degree,
        features=M,
        peaks=peaks,
        seconds=best["call"],
        floor=sum(p["floor"] for p in parts),
        parts=parts,
    )


def fast_profile_title(prof: dict[str, Any]) -> str:
    pk = prof["peaks"]
    return (
        f"fast summation, one mha field evaluation: N = {prof['N']:,}, d = {prof['d']}, H = {prof['H']}, "
        f"beta = {prof['beta']:g}, tol = {prof['tol']:g} (degree {prof['degree']}, {prof['features']} features): "
        f"{prof['seconds']:.3g} s, floor {prof['floor']:.3g} s (the fused loop's parts split by rerunning it without "
        f"its later stages); machine: float64 GEMM {pk['gemm64']:.0f} GFLOP/s, "
        f"float32 GEMM {pk['gemm32']:.0f} GFLOP/s, memory {pk['bandwidth']:.1f} GB/s"
    )


def fast_profile_rows(prof: dict[str, Any]) -> list[tuple[str, ...]]:
    """Table cells per part (see :data:`FAST_PROFILE_HEADER`)."""
    rows: list[tuple[str, ...]] = []
    for p in prof["parts"]:
        s, w = p["seconds"], p["work"]
        rate = f"{w / s:.3g} {p['unit']}/s" if w > 0 and s > 0 else "-"
        limit = f"{p['limit']:.3g} {p['unit']}/s" if p["limit"] > 0 and w > 0 else "-"
        floor = f"{p['floor']:.3g}" if p["floor"] > 0 else "-"
        ratio = f"{s / p['floor']:.1f}" if p["floor"] > 0 else "-"
        work = f"{w:.3g} {p['unit']}" if w > 0 else "-"
        rows.append((p["part"], f"{s:.3f}", f"{s / prof['seconds']:.0%}", work, rate, limit, floor, ratio))
    return rows


def fast_profile_markdown(prof: dict[str, Any]) -> str:
    lines = [fast_profile_title(prof), "", "| " + " | ".join(FAST_PROFILE_HEADER) + " |"]
    lines.append("|" + "---|" * len(FAST_PROFILE_HEADER))
    lines += ["| " + " | ".join(r) + " |" for r in fast_profile_rows(prof)]
    return "\n".join(lines) + "\n"
