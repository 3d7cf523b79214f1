"""Issue 44 item 1: fair baselines (speed- and entropy-matched random heads) and the batched flows."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from attnflow.dynamics.fields import velocity
from attnflow.hf import extract, load_model
from attnflow.hf.flow import flow_through, real_positions
from attnflow.hf.measures import random_heads
from attnflow.hf.sphere import on_sphere
from attnflow.hf.study import attention_entropy, batched_field, displacement, flow_batch, matched_random_heads
from attnflow.hf.tiny import save_tiny
from attnflow.weights.processes import Layers


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    out = {}
    for f in ("bert", "gpt2"):
        folder = save_tiny(f, root / f, tokenizer=True, layers=3)
        model = load_model(folder)
        layers = extract(model)
        X, r = real_positions(model, layers, torch.tensor([[3, 9, 4, 11, 7, 2, 5, 8]]))
        out[f] = (on_sphere(layers, radius=r), X)
    return out


@pytest.mark.parametrize("family", ["bert", "gpt2"])
def test_batched_flow_is_the_library_flow(tiny, family):
    flow, X = tiny[family]
    x = torch.from_numpy(X[1])
    for h in flow.layers:
        np.testing.assert_allclose(batched_field(x[None], h)[0], velocity(x, h, model="mha"), atol=1e-12)
    orders = [[0, 1, 2], [2, 0, 1], [1, 1, 1]]
    got = flow_batch(X[0], [[flow.layers[i] for i in o] for o in orders], 4)
    for o, g in zip(orders, got):
        want = flow_through(X[0], Layers([flow.layers[i] for i in o], t_end=3.0), 4)
        np.testing.assert_allclose(g, want, atol=1e-12)


@pytest.mark.parametrize("family", ["bert", "gpt2"])
def test_random_heads_matched_in_speed_and_entropy(tiny, family):
    flow, X = tiny[family]
    g = torch.Generator().manual_seed(0)
    plain_off = []
    for l, real in enumerate(flow.layers):
        h, got = matched_random_heads(real, X[l], g, 4)
        assert abs(got["displacement"] / got["displacement_real"] - 1) < 0.05, (l, got)
        assert abs(displacement(X[l], h, 4) / displacement(X[l], real, 4) - 1) < 0.05  # measured again
        assert abs(got["entropy"] - got["entropy_real"]) < 1e-6 * max(1.0, got["entropy_real"]), got
        x = torch.from_numpy(X[l])
        plain = random_heads(real, torch.Generator().manual_seed(0))
        plain_off.append(
            max(
                abs(displacement(X[l], plain, 4) / got["displacement_real"] - 1),
                abs(attention_entropy(x, plain) - got["entropy_real"]),
            )
        )
    # Negative control: heads matched in norm only miss the speed or the entropy by more than 5%.
    assert max(plain_off) > 0.05, plain_off


def test_hierarchical_ci_holds_the_draws_spread():
    from attnflow.hf.study import bootstrap_ci, hierarchical_ci

    rng = np.random.default_rng(0)
    P, K = 60, 20
    prompt = rng.normal(0.0, 0.05, size=(P, 1))
    flat = np.repeat(prompt, K, axis=1)  # the draws do not vary
    lo_p, hi_p = bootstrap_ci(prompt[:, 0], n_boot=2000, seed=4)
    lo_h, hi_h = hierarchical_ci(flat, n_boot=2000, seed=4)
    assert abs(lo_h - lo_p) < 1e-12 and abs(hi_h - hi_p) < 1e-12, (lo_h, lo_p, hi_h, hi_p)
    # Draws that vary (an effect per draw, shared by every prompt, as a layer order's): the interval widens
    # to about the draws' standard error, 1.96 * 0.2 / sqrt(20) = 0.088 half-width, beside the prompts' 0.013.
    varied = prompt + rng.normal(0.0, 0.2, size=(1, K))
    lo_v, hi_v = hierarchical_ci(varied, n_boot=2000, seed=4)
    lo_q, hi_q = bootstrap_ci(varied.mean(1), n_boot=2000, seed=4)
    assert (hi_v - lo_v) > 3 * (hi_q - lo_q), (hi_v - lo_v, hi_q - lo_q)
    draws_se = 1.96 * varied.mean(0).std() / np.sqrt(K)
    assert 0.7 < (hi_v - lo_v) / 2 / draws_se < 1.3, ((hi_v - lo_v) / 2, draws_se)


def _orders_values(P: int, K: int, rng: np.random.Generator, planted: dict[int, float] | None = None):
    """Synthetic per-prompt statistics of ``flow`` ``(P,)`` and ``K`` layer orders ``(P, K)``: a prompt effect
    (sd 0.05), an effect per order shared by every prompt (sd 0.05: the draws' spread, as in MiniLM's runs)
    and noise (sd 0.01); ``planted``: draw -> a shift added to that order."""
    prompt = rng.normal(0.0, 0.05, size=(P, 1))
    draw = rng.normal(0.0, 0.05, size=(1, K))
    for k, v in (planted or {}).items():
        draw[0, k] += v
    orders = 0.5 + prompt + draw + rng.normal(0.0, 0.01, size=(P, K))
    return 0.6 + prompt[:, 0] + rng.normal(0.0, 0.01, size=P), orders


def _orders_dataset(P: int, K: int, rng: np.random.Generator, planted: dict[int, float] | None = None):
    """A study dataset of ``flow`` and ``K`` layer orders (:func:`_orders_values`), every measure the same numbers."""
    import xarray as xr

    from attnflow.hf.study import MEASURES

    flow, orders = _orders_values(P, K, rng, planted)
    vals = np.concatenate([flow[:, None], orders, orders.mean(1, keepdims=True)], 1)  # (P, V)
    names = ["flow", *[f"shuffled_{k}" for k in range(K)], "shuffled"]
    cube = np.repeat(vals[:, :, None], 3, axis=2)  # depths 0..2, the same value at each
    return xr.Dataset(
        {**{m: (("prompt", "variant", "depth"), cube) for m in MEASURES}, "n_tokens": (("prompt",), np.full(P, 10))},
        coords={"prompt": np.arange(P), "variant": names, "depth": np.arange(3)},
    )


def test_split_half_control_contains_zero_only_when_the_ci_holds_the_draws():
    """The control that can fail (issue 44): two random halves of the layer orders against each other,
    expected 0. The hierarchical CI contains 0 at about its nominal rate; a prompt-only CI, which
    ignores the orders' spread, excludes it almost always; a planted difference between the halves
    makes the control fail."""
    from attnflow.hf.study import bootstrap_ci, comparisons, hierarchical_ci, split_halves

    P, K = 60, 100
    # Through comparisons(): the row is the hierarchical CI of the paired halves, with 50 pairs of orders.
    ds = _orders_dataset(P, K, np.random.default_rng(0))
    rows = {(r.a, r.b, r.measure): r for r in comparisons(ds, n_boot=2000, seed=0, bands=False)}
    ctrl = rows[("shuffled_half1", "shuffled_half2", "cos")]
    a, b = split_halves(K, seed=0)
    v = ds.cos.values[:, 1 : K + 1, 1:].mean(-1)  # (P, K): the orders' depth means
    assert ctrl.draws == K // 2 and ctrl.n == P and abs(ctrl.diff - (v[:, a] - v[:, b]).mean()) < 1e-15
    assert (ctrl.lo, ctrl.hi) == hierarchical_ci(v[:, a] - v[:, b], n_boot=2000, seed=0)
    # Over 200 synthetic studies with no difference between the halves, the hierarchical CI contains 0
    # at about its nominal rate, the prompt-only one rarely: the control fails a pipeline whose CI
    # ignores the orders' spread. With a planted difference of 3 CI half-widths (each study's own) it
    # fails the right pipeline too.
    held = prompt_only = planted_found = 0
    for rep in range(200):
        _, v = _orders_values(P, K, np.random.default_rng(rep + 1))
        a, b = split_halves(K, seed=rep)
        d = v[:, a] - v[:, b]
        lo, hi = hierarchical_ci(d, n_boot=400, seed=rep)
        lo_p, hi_p = bootstrap_ci(d.mean(1), n_boot=400, seed=rep)
        held += lo <= 0 <= hi
        prompt_only += lo_p <= 0 <= hi_p
        # A planted difference: the CI shifts with it (the bootstrap is translation-equivariant), so
        # the shifted interval is the planted one's.
        planted_found += lo + 3 * (hi - lo) / 2 > 0
    assert 0.88 <= held / 200 <= 0.99, held  # 95% nominal; binomial sd 1.5%
    assert prompt_only / 200 < 0.2, prompt_only
    assert planted_found / 200 >= 0.95, planted_found
    # The same planted difference through comparisons(), added to the orders of the first half.
    shift = 3 * (ctrl.hi - ctrl.lo) / 2
    first, _ = split_halves(K, seed=0)
    planted = _orders_dataset(P, K, np.random.default_rng(0), {int(k): shift for k in first})
    rows = {(r.a, r.b, r.measure): r for r in comparisons(planted, n_boot=2000, seed=0, bands=False)}
    got = rows[("shuffled_half1", "shuffled_half2", "cos")]
    assert abs(got.diff - ctrl.diff - shift) < 1e-12 and got.excludes_zero, (got, ctrl)
    # Too few orders for 10 pairs: no split-half row (the tiny studies run 2 orders).
    few = comparisons(_orders_dataset(P, 19, np.random.default_rng(0)), n_boot=200, bands=False)
    assert not [r for r in few if r.a == "shuffled_half1"]


def test_split_halves_are_disjoint_random_halves():
    from attnflow.hf.study import split_halves

    a, b = split_halves(101, seed=3)
    assert len(a) == len(b) == 50 and not set(a) & set(b)
    assert sorted(a) != list(range(50))  # at random, not the first half
    assert [x.tolist() for x in split_halves(101, seed=3)] == [a.tolist(), b.tolist()]


def test_low_rank_values_give_the_dense_field():
    from attnflow.core.heads import Heads
    from attnflow.hf.study import value_factors_of

    g = torch.Generator().manual_seed(5)
    H, k, d = 3, 4, 64
    Q, K = (
        torch.randn(H, k, d, generator=g, dtype=torch.float64),
        torch.randn(H, k, d, generator=g, dtype=torch.float64),
    )
    V = torch.randn(H, d, k, generator=g, dtype=torch.float64) @ torch.randn(H, k, d, generator=g, dtype=torch.float64)
    h = Heads(K=K, Q=Q, V=V, bias_v=torch.randn(H, d, generator=g, dtype=torch.float64))
    f = value_factors_of(h)
    assert f is not None and f[0].shape == (H, d, k + 8)
    x = torch.randn(2, 9, d, generator=g, dtype=torch.float64)
    x = x / x.norm(dim=-1, keepdim=True)
    np.testing.assert_allclose(batched_field(x, h, f), batched_field(x, h), atol=1e-12)
    np.testing.assert_allclose(batched_field(x[0:1], h)[0], velocity(x[0], h, model="mha"), atol=1e-12)
    # Negative control: a full-rank V is refused (the dense product is used instead).
    full = Heads(K=K, Q=Q, V=torch.randn(H, d, d, generator=g, dtype=torch.float64))
    assert value_factors_of(full) is None


@pytest.mark.parametrize("family", ["bert", "gpt2"])
def test_shared_prefixes_and_packed_features_change_no_number(tiny, family):
    """Budget work of issue 44: stacks sharing their first layers share states, every head's features come
    from one packed product. Each stack alone, through the head-by-head field, gives the same positions."""
    from attnflow.hf.study import pack, value_factors_of

    flow, X = tiny[family]
    orders = [[0, 1, 2], [0, 1, 1], [0, 2, 1], [2, 0, 1], [2, 0, 0], [1, 1, 1]]
    stacks = [[flow.layers[i] for i in o] for o in orders]
    got = flow_batch(X[0], stacks, 4)
    for s, g in zip(stacks, got):
        np.testing.assert_allclose(g, flow_batch(X[0], [s], 4)[0], atol=1e-13)
    x = torch.from_numpy(X[1])[None]
    for h in flow.layers:
        f = value_factors_of(h)
        assert pack(h, f) is not None
        np.testing.assert_allclose(batched_field(x, h, f, pack(h, f)), batched_field(x, h, f), atol=1e-13)
    # negative control: a stack that differs in its second layer does not share it
    other = flow_batch(X[0], [stacks[0], stacks[2]], 4)
    assert np.abs(other[0][2:] - other[1][2:]).max() > 1e-3


def test_matched_heads_for_all_layers_at_once_are_the_one_by_one_heads(tiny):
    """``matched_random_stack`` (all seeds and layers in one batched bisection and fixed point) draws and
    matches what layer-by-layer ``matched_random_heads`` calls with the same generator give."""
    from attnflow.hf.study import matched_random_stack

    flow, X = tiny["bert"]
    L = len(flow.layers)
    g = torch.Generator().manual_seed(7)
    one = [[matched_random_heads(h, X[l], g, 4) for l, h in enumerate(flow.layers)] for _ in range(2)]
    g = torch.Generator().manual_seed(7)
    many = matched_random_stack(list(flow.layers), list(X[:L]), g, 4, draws=2)
    for a_s, b_s in zip(one, many):
        for (ha, ra), (hb, rb, _) in zip(a_s, b_s):
            assert ra == pytest.approx(rb, rel=1e-9)
            for n in ("Q", "K", "V", "bias_q", "bias_v"):
                ta, tb = getattr(ha, n), getattr(hb, n)
                if ta is not None:
                    np.testing.assert_allclose(ta, tb, rtol=1e-8, atol=1e-12)
