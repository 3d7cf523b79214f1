"""Kernel extensions for real transformers (causal mask, key bias, value bias, rotary embeddings),
checked against PyTorch's own ``scaled_dot_product_attention`` and transformers' rotary code."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from attnflow import Heads, velocity
from attnflow.core.heads import rotary
from attnflow.dynamics.fields import field_stats
from attnflow.kernels.dense import attention_stats


def _random_heads(H=3, r=4, d=6, seed=0, **extra):
    g = torch.Generator().manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)
    return Heads(
        K=rnd(H, r, d),
        Q=rnd(H, r, d),
        V=rnd(H, d, d),
        **{k: rnd(*v) if isinstance(v, tuple) else v for k, v in extra.items()},
    )


@pytest.mark.parametrize("causal", [False, True])
def test_biases_and_causal_mask_match_sdpa(causal):
    H, r, d, N = 3, 4, 6, 9
    heads = _random_heads(H, r, d, bias_q=(H, r), bias_k=(H, r), bias_v=(H, d), causal=causal)
    x = torch.randn(N, d, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    a = torch.full((N,), 1.0 / N, dtype=torch.float64)
    st = field_stats(x, heads, a, torch.full((H,), 1.0 / H, dtype=torch.float64))
    q = x @ heads.Q.transpose(1, 2) + heads.bias_q[:, None]
    k = x @ heads.K.transpose(1, 2) + heads.bias_k[:, None]
    v = x @ heads.V.transpose(1, 2) + heads.bias_v[:, None]
    expect = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=1.0)
    assert torch.allclose(st.out, expect, atol=1e-12, rtol=0)
    # log Z_h(x_i) = log sum_{j (<= i)} a_j exp(q_i . k_j), full logits including every bias term.
    logits = q @ k.transpose(1, 2) + torch.log(a)
    if causal:
        logits = logits.masked_fill(torch.ones(N, N, dtype=torch.bool).triu(1), float("-inf"))
    assert torch.allclose(st.logZ, torch.logsumexp(logits, -1), atol=1e-12, rtol=0)


def test_causal_mask_is_the_same_when_streamed_in_blocks():
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 37, 5, generator=g, dtype=torch.float64) for _ in range(3))
    la = torch.full((37,), -np.log(37.0), dtype=torch.float64)
    kb = torch.randn(2, 37, generator=g, dtype=torch.float64)
    full = attention_stats(q, k, v, la, key_bias=kb, causal=True)
    streamed = attention_stats(q, k, v, la, key_bias=kb, causal=True, block_elements=2 * 37 * 4)
    for a_, b_ in zip(full, streamed):
        assert torch.allclose(a_, b_, atol=1e-13, rtol=0)
    # The first token sees only itself: out_h(x_0) = v_0.
    assert torch.allclose(full[0][:, 0], v[:, 0], atol=1e-13)


def test_rotary_matches_transformers_and_only_relative_positions_matter():
    pytest.importorskip("transformers", reason="the hf extra: pip install -e '.[hf]'")
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    r, N = 8, 7
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, r, 2, dtype=torch.float64) / r))
    g = torch.Generator().manual_seed(3)
    q, k = (
        torch.randn(1, 2, N, r, generator=g, dtype=torch.float64),
        torch.randn(1, 2, N, r, generator=g, dtype=torch.float64),
    )
    ang = torch.arange(N, dtype=torch.float64)[:, None] * inv_freq[None]
    emb = torch.cat((ang, ang), -1)[None]
    q_ref, k_ref = apply_rotary_pos_emb(q, k, emb.cos(), emb.sin())
    assert torch.allclose(rotary(q, inv_freq), q_ref, atol=1e-13)
    assert torch.allclose(rotary(k, inv_freq), k_ref, atol=1e-13)
    # Rotations are orthogonal: R_i q . R_j k depends on j - i only, so equal vectors at all positions
    # give a Toeplitz logit matrix.
    qq = rotary(q[0, 0, :1].expand(N, r), inv_freq)
    kk = rotary(k[0, 0, :1].expand(N, r), inv_freq)
    L = (qq @ kk.T).numpy()
    for s in range(-N + 1, N):
        diag = np.diagonal(L, offset=s)
        assert np.ptp(diag) < 1e-12


def test_plain_heads_keep_their_old_behaviour_and_gf_rejects_extras():
    x = np.random.default_rng(0).standard_normal((5, 3))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    A = np.random.default_rng(1).standard_normal((2, 3, 3))
    A = A + A.transpose(0, 2, 1)
    v0 = velocity(x, A, model="gf")
    v1 = velocity(x, Heads.from_matrices(A), model="gf")
    assert np.allclose(v0, v1, atol=1e-14)
    with pytest.raises(ValueError, match="plain heads"):
        velocity(x, Heads(K=torch.from_numpy(A), causal=True), model="gf")


def test_numpy_reference_has_the_same_causal_mask_and_key_bias():
    from attnflow.kernels.dense import attention_stats_reference

    rng = np.random.default_rng(5)
    H, N, d = 2, 6, 3
    x, A, V = rng.standard_normal((N, d)), rng.standard_normal((H, d, d)), rng.standard_normal((H, d, d))
    a, c = rng.dirichlet(np.ones(N)), rng.standard_normal((H, N))
    out_r, lz_r = attention_stats_reference(x, A, V, a, key_bias=c, causal=True)
    xt = torch.from_numpy(x)
    q = xt.expand(H, N, d)
    k = xt @ torch.from_numpy(A).transpose(1, 2)
    v = xt @ torch.from_numpy(V).transpose(1, 2)
    out, lz = attention_stats(q, k, v, torch.log(torch.from_numpy(a)), key_bias=torch.from_numpy(c), causal=True)
    np.testing.assert_allclose(out.numpy(), out_r, atol=1e-12)
    np.testing.assert_allclose(lz.numpy(), lz_r, atol=1e-12)
