"""The attention kernel against the numpy reference and PyTorch's own fused attention."""

import numpy as np
import torch
import torch.nn.functional as F

from attnflow.core.heads import Heads
from attnflow.kernels.dense import attention_stats, attention_stats_reference
from helpers import random_masses, random_tokens


def _features(x, A, V):
    h = Heads.from_matrices(torch.from_numpy(A), torch.from_numpy(V))
    xt = torch.from_numpy(x)
    q, k = h.factors(xt)
    return q, k, h.value_features(xt)


def test_matches_reference(rng):
    H, N, d = 3, 17, 4
    x, A, V = random_tokens(rng, N, d), rng.standard_normal((H, d, d)), rng.standard_normal((H, d, d))
    a = random_masses(rng, N)
    q, k, v = _features(x, A, V)
    out, logZ = attention_stats(q, k, v, torch.log(torch.from_numpy(a)))
    out_ref, logZ_ref = attention_stats_reference(x, A, V, a)
    np.testing.assert_allclose(out.numpy(), out_ref, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(logZ.numpy(), logZ_ref, rtol=1e-12, atol=1e-12)


def test_streamed_blocks_equal_one_block(rng):
    H, N, d = 2, 101, 3
    x, A = random_tokens(rng, N, d), rng.standard_normal((H, d, d))
    q, k, v = _features(x, A, A)
    log_a = torch.full((N,), -np.log(N), dtype=torch.float64)
    out1, lz1 = attention_stats(q, k, v, log_a)
    out2, lz2 = attention_stats(q, k, v, log_a, block_elements=H * N * 7)  # 7 query rows per block
    torch.testing.assert_close(out1, out2, rtol=0, atol=1e-14)
    torch.testing.assert_close(lz1, lz2, rtol=0, atol=1e-14)


def test_matches_torch_sdpa(rng):
    H, N, d = 4, 33, 5
    x, A, V = random_tokens(rng, N, d), rng.standard_normal((H, d, d)), rng.standard_normal((H, d, d))
    a = torch.from_numpy(random_masses(rng, N))
    q, k, v = _features(x, A, V)
    out, logZ = attention_stats(q, k, v, torch.log(a))
    # Token masses are an additive log-bias on the logits; scale=1 because beta is folded into A.
    ref = F.scaled_dot_product_attention(q.contiguous(), k, v, attn_mask=torch.log(a).expand(H, N, N), scale=1.0)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    logits = q @ k.transpose(-1, -2) + torch.log(a)
    torch.testing.assert_close(logZ, torch.logsumexp(logits, -1), rtol=1e-12, atol=1e-12)


def test_large_beta_finite_and_exact(rng):
    H, N, d = 2, 40, 3
    x = random_tokens(rng, N, d)
    A = 1000.0 * np.stack([np.eye(d)] * H)
    q, k, v = _features(x, A, A)
    out, logZ = attention_stats(q, k, v, torch.full((N,), -np.log(N), dtype=torch.float64))
    assert torch.isfinite(out).all() and torch.isfinite(logZ).all()
    out_ref, logZ_ref = attention_stats_reference(x, A, A, np.full(N, 1.0 / N))
    np.testing.assert_allclose(logZ.numpy(), logZ_ref, rtol=1e-13)
    np.testing.assert_allclose(out.numpy(), out_ref, rtol=1e-10, atol=1e-9)
    # logZ >= beta - log N (the self term) and stays within a few log-units of it.
    assert np.all(logZ.numpy() >= 1000.0 - np.log(N) - 1e-9)
    assert np.all(logZ.numpy() <= 1000.0 - np.log(N) + np.log(N))


def test_gradients_flow_through_the_kernel(rng):
    """Autograd through attention_stats (any backend) equals autograd of the plain log-sum-exp formula."""
    H, N, d = 2, 9, 3
    x = torch.tensor(random_tokens(rng, N, d), requires_grad=True)
    A = torch.from_numpy(rng.standard_normal((H, d, d)))
    log_a = torch.log(torch.from_numpy(random_masses(rng, N)))
    h = Heads.from_matrices(A)
    for backend in ("auto", "stream"):
        q, k = h.factors(x)
        _, logZ = attention_stats(q, k, None, log_a, backend=backend)
        (g,) = torch.autograd.grad(logZ.sum(), x)
        ref = torch.logsumexp(torch.einsum("id,hde,je->hij", x, A, x) + log_a, -1).sum()
        (g_ref,) = torch.autograd.grad(ref, x)
        torch.testing.assert_close(g, g_ref, rtol=1e-12, atol=1e-12)
