"""The attention kernel: the one place where ``exp(x_i^T A_h x_j)`` is summed over tokens.

For every head ``h`` and query token ``i`` it returns

* the log-partition ``log Z_h(x_i) = log sum_j a_j exp(q_i . k_j)`` and
* the normalised output ``out_h(x_i) = sum_j a_j exp(q_i . k_j) v_j / Z_h(x_i)``,

from features ``q, k`` (``q_i . k_j = x_i^T A_h x_j``) and values ``v_j = V_h x_j``. Everything
else in attnflow (the three fields, energy, mobility, slope) is a cheap function of these two.
Token masses enter as the log-bias ``log a_j``, and every exponential is shifted by its row
maximum (log-sum-exp), so nothing overflows at large ``beta``.

:func:`dense_stats` is the fast path. Two interchangeable dense backends compute it:

* ``"flash"``: PyTorch's fused attention kernel, which streams over key blocks and returns the
  log-sum-exp beside the output (on CPU ``aten::_scaled_dot_product_flash_attention_for_cpu``, on
  CUDA ``aten::_scaled_dot_product_efficient_attention``). Non-uniform masses ride along as one
  extra feature (``[q_i, 1] . [k_j, log a_j] = q_i . k_j + log a_j``), so no ``N x N`` bias exists.
* ``"stream"``: plain torch, streamed over blocks of query rows with log-sum-exp, so that at most
  ``block_elements`` logits are held at once. Works for every dtype and device.

``"auto"`` picks ``"flash"`` where the fused kernel supports the dtype and device, else
``"stream"``. :func:`reference_stats` is the plain numpy transcription of the formulas,
kept for tests. The O(N) fast summation for ``d <= 4`` lives in :mod:`attnflow.kernels.fastsum`.
"""

from __future__ import annotations

import numpy as np
import torch

from attnflow.core.errors import InputError

#: Upper bound on the number of logits held in memory at once by the streamed kernel.
DEFAULT_BLOCK_ELEMENTS = 1 << 22

#: Dense backends of :func:`dense_stats`.
KERNEL_BACKENDS: tuple[str, ...] = ("auto", "flash", "stream")


def dense_stats(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor | None,
    log_a: torch.Tensor,
    *,
    block_elements: int = DEFAULT_BLOCK_ELEMENTS,
    key_bias: torch.Tensor | None = None,
    causal: bool = False,
    backend: str = "auto",
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """Per-head normalised attention outputs and log-partitions.

    Shapes: ``q, k`` ``(..., H, N, r)``, ``v`` ``(..., H, N, p)`` or ``None``, ``log_a`` ``(..., N)``.
    Returns ``(out, logZ)`` with ``out`` ``(..., H, N, p)`` (``None`` when ``v`` is ``None``) and
    ``logZ`` ``(..., H, N)``. ``backend``: one of :data:`KERNEL_BACKENDS`.

    Options real transformers need: ``key_bias`` ``(..., H, N)`` adds ``c_h(x_j)`` to every logit
    ``q_i . k_j`` (the key term ``b_Q . k_j`` of a query bias); ``causal=True`` restricts the sums to
    ``j <= i`` (token ``i`` attends to itself and earlier tokens). Both go through the ``stream``
    backend, which every dtype and device supports, as does every call that autograd differentiates.
    """
    backend = resolve_backend(backend, q)
    # The fused kernel's log-sum-exp output carries no gradient, so anything differentiated
    # (JKO's objective, autograd checks) goes through the streamed kernel.
    needs_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k, v, log_a, key_bias))
    if backend == "flash" and key_bias is None and not causal and not needs_grad:
        return _flash(q, k, v, log_a)
    return _stream(q, k, v, log_a, block_elements, key_bias=key_bias, causal=causal)


def resolve_backend(backend: str, q: torch.Tensor) -> str:
    """The concrete dense backend ``"flash"`` or ``"stream"`` that ``backend`` means for ``q``."""
    if backend not in KERNEL_BACKENDS:
        raise InputError(f"unknown kernel backend {backend!r}; choose one of {KERNEL_BACKENDS}")
    flash_ok = _flash_supported(q)
    if backend == "flash" and not flash_ok:
        raise InputError(
            f"the fused 'flash' kernel does not support {q.dtype} on {q.device.type}; use backend 'stream' or 'auto'"
        )
    if backend == "auto":
        return "flash" if flash_ok else "stream"
    return backend


def _flash_supported(q: torch.Tensor) -> bool:
    if q.device.type == "cpu":
        return q.dtype in (torch.float32, torch.float64) and hasattr(
            torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu"
        )
    # Untested here (no GPU in CI): the memory-efficient CUDA kernel has no float64.
    return q.device.type == "cuda" and q.dtype in (torch.float32, torch.float16, torch.bfloat16)


def _stream(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor | None,
    log_a: torch.Tensor,
    block_elements: int,
    *,
    key_bias: torch.Tensor | None = None,
    causal: bool = False,
) -> tuple[torch.Tensor | None, torch.Tensor]:
    N = q.shape[-2]
    batch = int(np.prod(q.shape[:-2]))  # every leading dim, heads included
    rows = max(1, block_elements // max(1, batch * k.shape[-2]))
    bias = log_a.unsqueeze(-2).unsqueeze(-2)  # (..., 1, 1, N)
    if key_bias is not None:
        bias = bias + key_bias.unsqueeze(-2)  # (..., H, 1, N)
    kt = k.transpose(-1, -2)
    if rows >= N:
        return _block(q, kt, v, bias, 0 if causal else None)
    outs: list[torch.Tensor | None] = []
    lzs: list[torch.Tensor] = []
    for s in range(0, N, rows):
        o, lz = _block(q[..., s : s + rows, :], kt, v, bias, s if causal else None)
        outs.append(o)
        lzs.append(lz)
    out = None if v is None else torch.cat([o for o in outs if o is not None], dim=-2)
    return out, torch.cat(lzs, dim=-1)


def _block(
    q: torch.Tensor, kt: torch.Tensor, v: torch.Tensor | None, bias: torch.Tensor, row0: int | None = None
) -> tuple[torch.Tensor | None, torch.Tensor]:
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


def _flash(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor | None, log_a: torch.Tensor
) -> tuple[torch.Tensor | None, torch.Tensor]:
    lead, (H, N, r) = q.shape[:-3], q.shape[-3:]
    M = k.shape[-2]
    q = q.reshape(-1, H, N, r)
    k = k.reshape(-1, H, M, r)
    B = q.shape[0]
    la = log_a.reshape(-1, M)
    if la.shape[0] != B:  # one mass vector shared by every batch member
        la = la.expand(B, M)
    # Uniform masses only shift log Z; anything else enters as the extra feature log a_j.
    uniform = bool((la == la[:, :1]).all())
    if not uniform:
        q = torch.cat([q, q.new_ones(B, H, N, 1)], dim=-1)
        k = torch.cat([k, la[:, None, :, None].expand(B, H, M, 1).to(k.dtype)], dim=-1)
    p = 1 if v is None else v.shape[-1]
    vv = q.new_zeros(B, H, M, 1) if v is None else v.reshape(-1, H, M, p)
    if vv.shape[0] != B:
        vv = vv.expand(B, H, M, p)
    # The fused kernels want one head size for q, k and v: zero columns change no dot product.
    width = max(q.shape[-1], vv.shape[-1])
    q, k, vv = (_pad(t, width) for t in (q, k, vv))
    out, lse = _fused(q, k, vv)
    logZ = lse[..., :N].to(q.dtype)
    if uniform:
        logZ = logZ + la[:, :1, None]
    logZ = logZ.reshape(*lead, H, N)
    if v is None:
        return None, logZ
    return out[..., :p].reshape(*lead, H, N, p), logZ


def _pad(t: torch.Tensor, width: int) -> torch.Tensor:
    if t.shape[-1] == width:
        return t.contiguous()
    return torch.nn.functional.pad(t, (0, width - t.shape[-1]))


def _fused(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if q.device.type == "cpu":
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, False, scale=1.0)
        return out, lse
    # CUDA (untested in this project's CI): returns (out, logsumexp, seed, offset).
    res = torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.0, False, scale=1.0)
    return res[0], res[1]


def reference_stats(
    x: np.ndarray,
    A: np.ndarray,
    V: np.ndarray,
    a: np.ndarray,
    *,
    key_bias: np.ndarray | None = None,
    causal: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Plain numpy transcription of docs/model.md: ``Z_h(x_i) = sum_j a_j exp(x_i^T A_h x_j)`` and
    ``out_h(x_i) = sum_j a_j exp(x_i^T A_h x_j) V_h x_j / Z_h(x_i)``, one head and token at a time.

    Returns ``(out, logZ)`` shaped like :func:`dense_stats`. Shifts by the row maximum only to
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


#: Former names (kept: they are public), see the naming scheme in :mod:`attnflow.kernels`.
attention_stats = dense_stats
attention_stats_reference = reference_stats
