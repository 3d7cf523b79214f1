"""Every dense kernel backend against the plain numpy reference (float64: relative error < 1e-10)."""

import numpy as np
import pytest
import torch

from attnflow import tokens
from attnflow.core.heads import Heads, gaussian_heads
from attnflow.kernels.dense import attention_stats, attention_stats_reference, resolve_backend


def _case(N=40, d=3, H=3, beta=3.0, seed=0, uniform=False):
    rng = np.random.default_rng(seed)
    x = tokens.uniform(N, d, seed=seed)
    A = gaussian_heads(H, d, beta, seed=seed)
    V = rng.standard_normal((H, d, d))
    a = np.full(N, 1.0 / N) if uniform else rng.uniform(0.5, 2.0, N)
    return x, A, V, a / a.sum()


def _torch_stats(x, A, V, a, backend, dtype=torch.float64, **kw):
    heads = Heads.from_matrices(A, V).to(dtype=dtype)
    xt = torch.as_tensor(x, dtype=dtype)
    q, k = heads.factors(xt)
    v = heads.value_features(xt)
    return attention_stats(q, k, v, torch.log(torch.as_tensor(a, dtype=dtype)), backend=backend, **kw)


def _rel(a, b):
    return float(np.abs(np.asarray(a) - b).max() / np.abs(b).max())


@pytest.mark.parametrize("backend", ["flash", "stream", "auto"])
@pytest.mark.parametrize("uniform", [True, False])
def test_backend_matches_reference_float64(backend, uniform):
    x, A, V, a = _case(uniform=uniform)
    out_ref, lz_ref = attention_stats_reference(x, A, V, a)
    out, lz = _torch_stats(x, A, V, a, backend)
    assert _rel(out, out_ref) < 1e-10
    assert _rel(lz, lz_ref) < 1e-10


def test_stream_blocks_agree_with_one_block():
    x, A, V, a = _case(N=50)
    out1, lz1 = _torch_stats(x, A, V, a, "stream")
    out2, lz2 = _torch_stats(x, A, V, a, "stream", block_elements=7)  # one query row per block
    assert _rel(out2, out1.numpy()) < 1e-13 and _rel(lz2, lz1.numpy()) < 1e-13


def test_flash_float32_close_to_reference():
    x, A, V, a = _case(N=64, beta=4.0)
    out_ref, lz_ref = attention_stats_reference(x, A, V, a)
    out, lz = _torch_stats(x, A, V, a, "flash", dtype=torch.float32)
    assert out.dtype == torch.float32
    assert _rel(out, out_ref) < 1e-5 and _rel(lz, lz_ref) < 1e-5


def test_flash_logZ_only_and_batch_dims():
    # Leading batch dimension with one mass vector per member, and v=None.
    xs, As, Vs, as_ = zip(*[_case(N=30, seed=s) for s in range(3)])
    dt = torch.float64
    q = torch.stack([Heads.from_matrices(A).factors(torch.as_tensor(x))[0] for x, A in zip(xs, As)])
    k = torch.stack([Heads.from_matrices(A).factors(torch.as_tensor(x))[1] for x, A in zip(xs, As)])
    log_a = torch.log(torch.as_tensor(np.stack(as_), dtype=dt))
    out, lz = attention_stats(q, k, None, log_a, backend="flash")
    assert out is None and lz.shape == (3, 3, 30)
    for b in range(3):
        _, lz_ref = attention_stats_reference(xs[b], As[b], Vs[b], as_[b])
        assert _rel(lz[b], lz_ref) < 1e-10


def test_low_rank_factors():
    rng = np.random.default_rng(3)
    N, d, H, kdim = 25, 4, 2, 2
    x = tokens.uniform(N, d, seed=3)
    Q, K = rng.standard_normal((2, H, kdim, d))
    heads = Heads.from_factors(Q, K)
    xt = torch.as_tensor(x)
    q, k = heads.factors(xt)
    v = heads.value_features(xt)
    a = np.full(N, 1.0 / N)
    out_ref, lz_ref = attention_stats_reference(x, heads.A.numpy(), heads.values.numpy(), a)
    out, lz = attention_stats(q, k, v, torch.log(torch.as_tensor(a)), backend="flash")
    assert _rel(out, out_ref) < 1e-10 and _rel(lz, lz_ref) < 1e-10


def test_unknown_backend_is_a_clear_error():
    q = torch.zeros(1, 2, 3)
    with pytest.raises(ValueError, match="unknown kernel backend 'fastest'"):
        resolve_backend("fastest", q)
    with pytest.raises(ValueError, match="does not support"):
        resolve_backend("flash", q.to(torch.float16))
    assert resolve_backend("auto", q.to(torch.float16)) == "stream"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_flash_matches_reference():
    x, A, V, a = _case()
    out_ref, lz_ref = attention_stats_reference(x, A, V, a)
    heads = Heads.from_matrices(A, V).to(dtype=torch.float32, device="cuda")
    xt = torch.as_tensor(x, dtype=torch.float32, device="cuda")
    q, k = heads.factors(xt)
    out, lz = attention_stats(
        q, k, heads.value_features(xt), torch.log(torch.as_tensor(a, dtype=torch.float32, device="cuda"))
    )
    assert _rel(out.cpu(), out_ref) < 1e-4 and _rel(lz.cpu(), lz_ref) < 1e-4
