"""Fast summation's evaluator: a caller passes the thread policy, no call leaves a thread setting
changed, and two evaluators (two runs) share no cache."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from threadpoolctl import threadpool_info

from attnflow import tokens
from attnflow.core.heads import Heads, goe_heads
from attnflow.core.threads import ThreadPolicy
from attnflow.kernels import fastsum as fs
from attnflow.kernels.dispatch import KernelOptions, resolve_options


def _problem(N=9000, H=3, seed=1):
    x = torch.as_tensor(tokens.uniform(N, 3, seed=seed))
    A = torch.as_tensor(goe_heads(H, 3, 2.0, seed=seed))
    a = torch.full((N,), 1.0 / N, dtype=torch.float64)
    return x, A, a


def _blas_threads():
    return {i["filepath"]: i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"}


@pytest.mark.parametrize("policy", [ThreadPolicy(), ThreadPolicy(1), ThreadPolicy(2)])
def test_a_call_leaves_torchs_thread_count_as_it_was(policy):
    x, A, a = _problem()
    outer = torch.get_num_threads()
    try:
        for start in (1, 3):
            torch.set_num_threads(start)
            blas = _blas_threads()
            fs.fast_stats(x.clone(), A, A, a, tol=1e-8, threads=policy)
            fs.fast_head_means(x.clone(), A, a, tol=1e-8, threads=policy)
            assert torch.get_num_threads() == start
            assert _blas_threads() == blas
    finally:
        torch.set_num_threads(outer)


def test_the_policy_decides_the_workers_not_torchs_setting(monkeypatch):
    # The compiled loop runs on the policy's workers, whatever torch's own count is.
    from attnflow.kernels.fastsum import parallel

    seen = []
    real = parallel.on_cores

    def spy(job, tasks, workers):
        seen.append(min(workers, tasks))
        return real(job, tasks, workers)

    monkeypatch.setattr("attnflow.kernels.fastsum.evaluator.on_cores", spy)
    x, A, a = _problem(N=20_000)
    outer = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        fs.fast_stats(x, A, A, a, tol=1e-8, threads=ThreadPolicy(2))
        two = list(seen)
        seen.clear()
        torch.set_num_threads(2)
        fs.fast_stats(x.clone(), A, A, a, tol=1e-8, threads=ThreadPolicy(1))
        one = list(seen)
    finally:
        torch.set_num_threads(outer)
    assert two and set(two) == {2}
    assert one and set(one) == {1}  # control: another policy, another count


def test_one_thread_or_two_give_the_same_bits():
    x, A, a = _problem(N=40_000)
    r1 = fs.fast_stats(x.clone(), A, A, a, tol=1e-8, threads=ThreadPolicy(1))
    r2 = fs.fast_stats(x.clone(), A, A, a, tol=1e-8, threads=ThreadPolicy(2))
    assert torch.equal(r1.logZ, r2.logZ) and torch.equal(r1.out, r2.out)


def test_two_evaluators_do_not_share_caches():
    x, A, a = _problem()
    one, two = fs.FastSumEvaluator(), fs.FastSumEvaluator()
    r = one.stats(x, A, A, a, tol=1e-8)
    d = r.plan.degree
    assert one.tables(d, 3) is one.tables(d, 3)  # kept within an evaluator ...
    assert two.tables(d, 3) is not one.tables(d, 3)  # ... and not across
    assert getattr(two._local, "coefficients", None) is None and getattr(two._local, "moments", None) is None
    # what one evaluator keeps is its own: the same call through the other builds its own copies
    two.stats(x, A, A, a, tol=1e-8)
    c1, c2 = one._local.coefficients, two._local.coefficients
    assert len(c1) == len(c2) == 1
    (k1, v1), (k2, v2) = next(iter(c1.items())), next(iter(c2.items()))
    assert k1 == k2 and v1[0] is not v2[0] and torch.equal(v1[0], v2[0])
    assert one._local.moments["G"] is not two._local.moments["G"]
    # control: within one evaluator the second call reuses the coefficient matrices
    again = one.coefficients(A.to(torch.float64), r.plan, 1)
    assert again[0] is v1[0]


def test_each_run_options_own_an_evaluator_and_calls_outside_a_run_keep_nothing():
    o1, o2 = KernelOptions("fast", 1e-8), KernelOptions("fast", 1e-8)
    assert o1 == o2 and o1.evaluator is not o2.evaluator  # equal settings, separate caches
    assert resolve_options(None).evaluator is not resolve_options(None).evaluator
    assert resolve_options(o1).evaluator is o1.evaluator
    with pytest.raises(ValueError, match="ThreadPolicy"):
        KernelOptions(threads=2)  # type: ignore[arg-type]


def test_the_evaluator_pickles_without_its_caches():
    x, A, a = _problem(N=5000)
    ev = fs.FastSumEvaluator(ThreadPolicy(1))
    ev.stats(x, A, A, a, tol=1e-8)
    back = pickle.loads(pickle.dumps(KernelOptions("fast", 1e-8, ThreadPolicy(1), ev)))
    assert back.evaluator.threads == ThreadPolicy(1) and getattr(back.evaluator._local, "coefficients", None) is None
    r = back.evaluator.stats(x, A, A, a, tol=1e-8)
    ref = fs.fast_stats(x, A, A, a, tol=1e-8)
    assert torch.equal(r.logZ, ref.logZ)


def test_an_evaluator_is_safe_from_several_threads():
    from concurrent.futures import ThreadPoolExecutor

    x, A, a = _problem(N=20_000)
    ev = fs.FastSumEvaluator(ThreadPolicy(2))
    ref = [fs.fast_stats(x, A * (1 + 0.1 * k), A, a, tol=1e-8).logZ for k in range(4)]
    before = torch.get_num_threads()
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda k: ev.stats(x, A * (1 + 0.1 * k), A, a, tol=1e-8).logZ, range(4)))
    assert torch.get_num_threads() == before
    for g, r in zip(got, ref, strict=True):
        assert torch.equal(g, r)


def test_a_field_evaluation_through_the_options_matches_a_one_off_call():
    from attnflow.dynamics.fields import mixed_field

    x, A, a = _problem(N=6000, H=2)
    w = torch.tensor([0.3, 0.7], dtype=torch.float64)
    heads = Heads(K=A)
    opts = KernelOptions("fast", 1e-9, ThreadPolicy(1))
    u1 = mixed_field(x, heads, a, w, "gf", options=opts)
    u2 = mixed_field(x, heads, a, w, "gf", options=KernelOptions("fast", 1e-9, ThreadPolicy(2)))
    assert float((u1 - u2).abs().max()) == 0.0
    assert np.isfinite(u1.numpy()).all()
