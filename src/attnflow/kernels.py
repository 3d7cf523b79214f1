"""The attention kernel: the one place where ``exp(x_i^T A_h x_j)`` is summed over tokens.

For every head ``h`` and query token ``i`` it returns

* the log-partition ``log Z_h(x_i) = log sum_j a_j exp(q_i . k_j)`` and
* the normalised output ``out_h(x_i) = sum_j a_j exp(q_i . k_j) v_j / Z_h(x_i)``,

from features ``q, k`` (``q_i . k_j = x_i^T A_h x_j``) and values ``v_j = V_h x_j``. Everything
else in attnflow (the three fields, energy, mobility, slope) is a cheap function of these two.
Token masses enter as the log-bias ``log a_j``, and every exponential is shifted by its row
maximum (log-sum-exp), so nothing overflows at large ``beta``.

:func:`attention_stats` is the fast path (torch, streamed over blocks of query rows so that the
``N x N`` logits are never held at once). :func:`attention_stats_reference` is the plain numpy
transcription of the formulas, kept for tests.
"""

from __future__ import annotations

import numpy as np
import torch

#: Upper bound on the number of logits held in memory at once by the streamed kernel.
DEFAULT_BLOCK_ELEMENTS = 1 << 22


def attention_stats(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor | None,
    log_a: torch.Tensor,
    *,
    block_elements: int = DEFAULT_BLOCK_ELEMENTS,
    key_bias: torch.Tensor | None = None,
    causal: bool = False,
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """Per-head normalised attention outputs and log-partitions.

    Shapes: ``q, k`` ``(..., H, N, r)``, ``v`` ``(..., H, N, p)`` or ``None``, ``log_a`` ``(..., N)``.
    Returns ``(out, logZ)`` with ``out`` ``(..., H, N, p)`` (``None`` when ``v`` is ``None``) and
    ``logZ`` ``(..., H, N)``.

    Options real transformers need: ``key_bias`` ``(..., H, N)`` adds ``c_h(x_j)`` to every logit
    ``q_i . k_j`` (the key term ``b_Q . k_j`` of a query bias); ``causal=True`` restricts the sums to
    ``j <= i`` (token ``i`` attends to itself and earlier tokens).
    """
    H, N = q.shape[-3], q.shape[-2]
    batch = int(np.prod(q.shape[:-3])) if q.ndim > 3 else 1
    rows = max(1, block_elements // max(1, batch * H * k.shape[-2]))
    bias = log_a.unsqueeze(-2).unsqueeze(-2)  # (..., 1, 1, N)
    if key_bias is not None:
        bias = bias + key_bias.unsqueeze(-2)  # (..., H, 1, N)
    kt = k.transpose(-1, -2)
    if rows >= N:
        return _block(q, kt, v, bias, 0 if causal else None)
    outs, lzs = [], []
    for s in range(0, N, rows):
        o, lz = _block(q[..., s : s + rows, :], kt, v, bias, s if causal else None)
        outs.append(o)
        lzs.append(lz)
    out = None if v is None else torch.cat(outs, dim=-2)
    return out, torch.cat(lzs, dim=-1)


def _block(q, kt, v, bias, row0: int | None = None):
    logits = q @ kt + bias
    if row0 is not None:
        # Causal mask for query rows row0.. : key j is visible to query i iff j <= i.
        i = torch.arange(row0, row0 + q.shape[-2], device=q.device)[:, None]
        j = torch.arange(kt.shape[-1], device=q.device)[None, :]
        logits = logits.masked_fill(j > i, float("-inf"))
    logZ = torch.logsumexp(logits, dim=-1)
    if v is None:
        return None, logZ
    p = torch.exp(logits - logZ.unsqueeze(-1))
    return p @ v, logZ


def attention_stats_reference(
    x: np.ndarray,
    A: np.ndarray,
    V: np.ndarray,
    a: np.ndarray,
    *,
    key_bias: np.ndarray | None = None,
    causal: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Plain numpy transcription of MODEL.md: ``Z_h(x_i) = sum_j a_j exp(x_i^T A_h x_j)`` and
    ``out_h(x_i) = sum_j a_j exp(x_i^T A_h x_j) V_h x_j / Z_h(x_i)``, one head and token at a time.

    Returns ``(out, logZ)`` shaped like :func:`attention_stats`. Shifts by the row maximum only to
    stay finite; meant for small ``N`` in tests. ``key_bias`` ``(H, N)`` adds ``c_h(x_j)`` to the
    exponents; ``causal=True`` sums over ``j <= i`` only.
    """
    x, A, V, a = (np.asarray(t, dtype=np.float64) for t in (x, A, V, a))
    H, N = A.shape[0], x.shape[0]
    c = np.zeros((H, N)) if key_bias is None else np.asarray(key_bias, dtype=np.float64)
    out = np.zeros((H, N, V.shape[1]))
    logZ = np.zeros((H, N))
    for h in range(H):
        for i in range(N):
            js = range(i + 1 if causal else N)
            s = np.array([x[i] @ A[h] @ x[j] + c[h, j] for j in js])
            m = s.max()
            w = a[: len(s)] * np.exp(s - m)
            Z = w.sum()
            logZ[h, i] = m + np.log(Z)
            out[h, i] = sum(w[j] * (V[h] @ x[j]) for j in js) / Z
    return out, logZ
