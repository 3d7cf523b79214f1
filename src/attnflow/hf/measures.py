"""Threshold-free measures of a token cloud, random heads of the same shapes, and what each head does.

Clouds ``x`` ``(N, d)`` of unit vectors, Gram matrix ``G = x x^T``:

* :func:`mean_inner`: ``(sum_{i != j} G_ij) / (N (N - 1))`` (1 when all tokens coincide);
* :func:`effective_rank`: ``exp(-sum_k p_k log p_k)`` with ``p_k`` the eigenvalues of ``G / N``
  (trace 1): the spectral entropy's exponential, 1 for one cluster, ``N`` for an orthonormal cloud;
* :func:`nn_cosine`: ``mean_i max_{j != i} G_ij``, the nearest neighbour's cosine.

:func:`head_activity` reads, at a state, every head's attention map, its share of the motion, its
push toward collapse and its mobility; :func:`random_heads` draws the baseline heads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal, overload

import numpy as np
import torch

from attnflow.analysis import diagnostics
from attnflow.core.geometry import project_tangent
from attnflow.core.heads import Heads
from attnflow.kernels.dispatch import head_stats


def mean_inner(x: np.ndarray) -> float:
    """``(sum_{i != j} <x_i, x_j>) / (N (N - 1))`` (:func:`attnflow.analysis.diagnostics.mean_inner`)."""
    return diagnostics.mean_inner(torch.as_tensor(np.asarray(x)))


def effective_rank(x: np.ndarray) -> float:
    """``exp(H)``, ``H = -sum_k p_k log p_k`` over the eigenvalues ``p_k`` of ``x x^T / N`` (unit rows)."""
    s = np.linalg.svd(np.asarray(x, dtype=np.float64), compute_uv=False)
    p = s**2 / np.sum(s**2)
    p = p[p > 0]
    return float(np.exp(-np.sum(p * np.log(p))))


def nn_cosine(x: np.ndarray) -> float:
    """``mean_i max_{j != i} <x_i, x_j>``."""
    G = x @ x.T
    np.fill_diagonal(G, -np.inf)
    return float(G.max(axis=1).mean())


MEASURES = {"mean_inner": mean_inner, "effective_rank": effective_rank, "nn_cosine": nn_cosine}


def measure_path(X: np.ndarray) -> dict[str, np.ndarray]:
    """Every measure of :data:`MEASURES` at every depth of ``X`` ``(L+1, N, d)``."""
    return {name: np.array([f(x) for x in X]) for name, f in MEASURES.items()}


def mean_cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``mean_i <a_i, b_i>`` over the token axis of ``(..., N, d)`` unit vectors."""
    return np.einsum("...nd,...nd->...n", a, b).mean(-1)


@overload
def random_heads(heads: Heads, generator: torch.Generator) -> Heads: ...
@overload
def random_heads(
    heads: Heads, generator: torch.Generator, *, value_factors: Literal[True]
) -> tuple[Heads, tuple[torch.Tensor, torch.Tensor]]: ...
def random_heads(
    heads: Heads, generator: torch.Generator, *, value_factors: bool = False
) -> Heads | tuple[Heads, tuple[torch.Tensor, torch.Tensor]]:
    """Heads of the same shapes as ``heads`` (factors ``Q, K`` ``(H, k, d)``, values of rank ``k``,
    biases, mask and rotary embeddings as they are) with Gaussian entries rescaled to the same
    per-head Frobenius norms: the baseline a trained head is compared with. ``value_factors``: also
    return ``(L, R)`` ``(H, d, k)``, ``(H, k, d)`` with ``V = L R`` (to rounding; the same draws)."""
    h = heads.to(dtype=torch.float64)

    def like(t: torch.Tensor | None, dims: tuple[int, ...]) -> torch.Tensor | None:
        if t is None:
            return None
        r = torch.randn(t.shape, generator=generator, dtype=torch.float64)
        n = torch.linalg.vector_norm(t, dim=dims, keepdim=True)
        return r / torch.linalg.vector_norm(r, dim=dims, keepdim=True) * n

    Q = h.Q if h.Q is not None else torch.eye(h.d, dtype=torch.float64).expand(h.H, h.d, h.d)
    k = Q.shape[-2]
    V = h.values
    Lr = torch.randn(h.H, h.d, k, generator=generator, dtype=torch.float64)
    Rr = torch.randn(h.H, k, h.d, generator=generator, dtype=torch.float64)
    Vr = Lr @ Rr
    scale = torch.linalg.vector_norm(V, dim=(1, 2), keepdim=True) / torch.linalg.vector_norm(
        Vr, dim=(1, 2), keepdim=True
    )
    Vr = (
        Vr
        / torch.linalg.vector_norm(Vr, dim=(1, 2), keepdim=True)
        * torch.linalg.vector_norm(V, dim=(1, 2), keepdim=True)
    )
    out = replace(
        h,
        Q=like(Q, (1, 2)),
        K=h.K if (K := like(h.K, (1, 2))) is None else K,
        V=Vr,
        bias_q=like(h.bias_q, (1,)),
        bias_k=like(h.bias_k, (1,)),
        bias_v=like(h.bias_v, (1,)),
    )
    return (out, (Lr * scale, Rr)) if value_factors else out


@dataclass(frozen=True)
class HeadActivity:
    """At one state ``x`` ``(N, d)`` under one layer's ``H`` heads (model ``mha``, masses ``w_h = 1/H``):

    ``attention[h, i, j]`` the softmax weights ``p_hij``; ``speed[h] = mean_i |w_h P_x out_h(x_i)|``
    (head ``h``'s part of the motion; ``total_speed = mean_i |v(x_i)|``); ``collapse[h]`` its part of
    ``d/dt mean_{i != j} <x_i, x_j> = 2 / (N (N-1)) sum_i <v_i, sum_{j != i} x_j>`` (positive: it
    pulls the tokens together; the parts add up to the whole); ``log_mobility[h] = mean_i log m_h(x_i)``
    with ``m_h = 1 / Z_h``, ``Z_h(x_i) = sum_j a_j exp(logit_hij)`` (the per-head mobility of docs/model.md).
    """

    attention: np.ndarray
    speed: np.ndarray
    total_speed: float
    collapse: np.ndarray
    log_mobility: np.ndarray


def head_activity(x: np.ndarray | torch.Tensor, heads: Heads) -> HeadActivity:
    """What every head of a layer does at the state ``x`` (see :class:`HeadActivity`)."""
    xt = torch.as_tensor(np.asarray(x), dtype=torch.float64)
    h = heads.to(dtype=torch.float64)
    n, H = xt.shape[0], h.H
    a = torch.full((n,), 1.0 / n, dtype=torch.float64)
    out, logZ = head_stats(xt, h, a, backend="auto")
    q, k, c = h.logit_features(xt)
    logits = q @ k.transpose(-1, -2)
    if c is not None:
        logits = logits + c.unsqueeze(-2)
    if h.causal:
        logits = logits.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    attn = torch.softmax(logits, dim=-1)
    assert out is not None  # values were asked for
    v = project_tangent(xt.unsqueeze(0), out) / H  # (H, N, d): w_h P_x out_h
    others = xt.sum(0, keepdim=True) - xt  # sum_{j != i} x_j
    collapse = 2.0 * (v * others).sum((-1, -2)) / (n * (n - 1))
    return HeadActivity(
        attention=attn.numpy(),
        speed=torch.linalg.vector_norm(v, dim=-1).mean(-1).numpy(),
        total_speed=float(torch.linalg.vector_norm(v.sum(0), dim=-1).mean()),
        collapse=collapse.numpy(),
        log_mobility=(-logZ).mean(-1).numpy(),
    )


def relative_jumps(mats: list[torch.Tensor], w: np.ndarray | None = None) -> np.ndarray:
    """Scale-free jumps of piecewise-constant heads across depth: for ``l = 0..L-2``,
    ``|Theta_{l+1} - Theta_l| / ((|Theta_l| + |Theta_{l+1}|) / 2)`` with
    ``|Theta| = (sum_h w_h |M_h|_F^2)^{1/2}`` (heads kept by label). Their sum is the discrete
    ``int |Theta'| dt`` in this norm: 0 for constant heads, about ``sqrt(2)`` per jump between
    independent random heads of equal norms, at most 2."""
    H = mats[0].shape[0]
    ww = torch.as_tensor(np.full(H, 1.0 / H) if w is None else w, dtype=torch.float64)

    def norm(M: torch.Tensor) -> float:
        return math.sqrt(float((ww * (M * M).sum((-1, -2))).sum()))

    out = []
    for A, B in zip(mats[:-1], mats[1:]):
        scale = 0.5 * (norm(A) + norm(B))
        out.append(norm(B - A) / scale if scale > 0 else 0.0)
    return np.array(out)
