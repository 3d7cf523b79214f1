"""Issue 44 item 3: heads matched between layers before any path length or weight-model fit."""

import numpy as np
import pytest
import torch

from attnflow.core.heads import Heads
from attnflow.hf.paths import fit_gram, fit_weight_models, gram, head_distance, match_heads, path_length, permute_heads


def smooth_stack(L=6, H=8, d=10, k=4, eps=0.15, seed=0):
    """Heads drifting slowly across depth: head h of layer l + 1 is head h of layer l plus a small step."""
    g = torch.Generator().manual_seed(seed)
    Q, K, V = (torch.randn(H, *s, generator=g, dtype=torch.float64) for s in ((k, d), (k, d), (d, d)))
    bq = torch.randn(H, k, generator=g, dtype=torch.float64)
    out = []
    for _ in range(L):
        out.append(Heads(K=K.clone(), Q=Q.clone(), V=V.clone(), bias_q=bq.clone()))
        Q, K, V = (M + eps * torch.randn(M.shape, generator=g, dtype=torch.float64) for M in (Q, K, V))
    return out


def test_a_planted_permutation_is_recovered_exactly():
    stack = smooth_stack()
    rng = np.random.default_rng(3)
    planted = [np.arange(8)] + [rng.permutation(8) for _ in stack[1:]]
    shuffled = [permute_heads(h, p) for h, p in zip(stack, planted)]
    matched, orders = match_heads(shuffled)
    for l, (p, o) in enumerate(zip(planted, orders)):
        np.testing.assert_array_equal(o, np.argsort(p), err_msg=f"layer {l}")
    for a, b in zip(matched, stack):
        assert torch.equal(a.A, b.A) and torch.equal(a.values, b.values) and torch.equal(a.bias_q, b.bias_q)
    true_len = path_length(stack)
    assert path_length(matched) == pytest.approx(true_len, rel=1e-12)
    # Negative control: by label, the planted permutation lengthens the path and roughens it.
    assert path_length(shuffled) > 3 * true_len, (path_length(shuffled), true_len)
    rough = fit_gram(gram(shuffled).sum(0))["path"]
    assert rough > 3 * fit_gram(gram(stack).sum(0))["path"]


def test_head_distance_is_zero_on_itself_and_scale_free():
    stack = smooth_stack(L=1)
    h = stack[0]
    D = head_distance(h, h)
    assert np.allclose(np.diag(D), 0.0, atol=1e-7) and (D[~np.eye(8, dtype=bool)] > 0.1).all()
    scaled = Heads(K=3.0 * h.K, Q=h.Q, V=0.5 * h.V)
    assert np.allclose(head_distance(h, scaled), D, atol=1e-7)
    assert D.max() <= np.sqrt(8.0) + 1e-12


def _path_heads(theta: np.ndarray) -> list[Heads]:
    """A stack of dense heads whose A and V entries follow ``theta`` ``(L, H, d, d)``."""
    return [Heads.from_matrices(torch.from_numpy(t), torch.from_numpy(t)) for t in theta]


def test_ou_fit_recovers_rho_on_a_long_ar1_path():
    rng = np.random.default_rng(0)
    L, H, d, rho = 400, 4, 6, 0.8
    z = np.empty((L, H, d, d))
    z[0] = rng.normal(size=(H, d, d))
    for l in range(1, L):
        z[l] = rho * z[l - 1] + np.sqrt(1 - rho**2) * rng.normal(size=(H, d, d))
    fit = fit_gram(gram(_path_heads(3.0 + z)).sum(0))  # entries N(3, 1): the mean is removed by the fit
    assert abs(fit["rho"] - rho) < 0.03, fit
    assert fit["rate"] == pytest.approx(-np.log(fit["rho"]))
    # Negative control: independent layers give rho near 0.
    white = fit_gram(gram(_path_heads(3.0 + rng.normal(size=(L, H, d, d)))).sum(0))
    assert abs(white["rho"]) < 0.05, white


def test_oscillating_fit_recovers_the_frequency():
    rng = np.random.default_rng(1)
    L, H, d, w = 24, 3, 5, 0.7
    t = np.arange(L)[:, None, None, None]
    C, phi = rng.normal(size=(1, H, d, d)), rng.uniform(0, 2 * np.pi, size=(1, H, d, d))
    fit = fit_gram(gram(_path_heads(2.0 + C * np.sin(w * t + phi))).sum(0))
    assert abs(fit["omega"] - w) < np.pi / 64 and fit["r2_osc"] > 0.99, fit
    # ...and its oscillation keeps jumping (slope of log jumps near 0) while a settling path's jumps shrink.
    assert abs(fit["jump_slope"]) < 0.1
    settle = 2.0 + np.exp(-0.5 * t) * C
    assert fit_gram(gram(_path_heads(settle)).sum(0))["jump_slope"] == pytest.approx(-0.5, abs=1e-6)


def test_weight_fit_has_cis_and_a_shuffled_control():
    stack = smooth_stack(L=6, H=8, eps=0.05)
    fit = fit_weight_models(stack, n_boot=200, n_orders=30, seed=0)
    for k in ("rho", "path"):
        assert fit.lo[k] <= fit.value[k] <= fit.hi[k]
    # A random walk in depth: neighbouring layers are the closest, shuffling lengthens the matched path.
    lo, hi = fit.control_band("path")
    assert fit.value["path"] < lo, (fit.value["path"], lo, hi)
    assert len(fit.control["path"]) == 30 and "regime" in fit.as_dict()


def test_dense_form_and_the_interpolating_smooth_path_give_the_same_field():
    from attnflow.dynamics.fields import velocity
    from attnflow.hf.paths import dense, smooth_path

    stack = smooth_stack(L=4, H=3, eps=0.5)
    x = torch.randn(7, 10, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    x = x / x.norm(dim=1, keepdim=True)
    for h in stack:
        np.testing.assert_allclose(velocity(x, dense(h), model="mha"), velocity(x, h, model="mha"), atol=1e-10)
    interp = smooth_path(stack, degree=3)  # degree L - 1: the real heads (matched) back
    for a, b in zip(interp, match_heads(stack)[0]):
        np.testing.assert_allclose(velocity(x, a, model="mha"), velocity(x, b, model="mha"), atol=1e-9)
    # Negative control: degree 0 (one mean head per label) is a different field; degree 1 is smoother.
    flat = smooth_path(stack, degree=0)
    assert not np.allclose(velocity(x, flat[0], model="mha"), velocity(x, stack[0], model="mha"), atol=1e-3)
    assert path_length(smooth_path(stack, degree=1)) < path_length(match_heads(stack)[0])


def test_cross_gram_lookups_are_the_direct_computation():
    from attnflow.hf.measures import relative_jumps
    from attnflow.hf.paths import CrossGram

    stack = smooth_stack(L=5, H=6, eps=0.3)
    rng = np.random.default_rng(0)
    planted = [permute_heads(h, rng.permutation(6)) for h in stack]
    cg = CrossGram(planted)
    for order in ([0, 1, 2, 3, 4], [3, 0, 4, 1, 2]):
        m, _ = match_heads([planted[i] for i in order])
        idx = cg.match(order)
        np.testing.assert_allclose(cg.gram(idx), gram(m), rtol=1e-10)
        np.testing.assert_allclose(cg.jumps(idx, "A"), relative_jumps([h.A for h in m]), rtol=1e-10)
        np.testing.assert_allclose(cg.jumps(idx, "V"), relative_jumps([h.values for h in m]), rtol=1e-10)
    fit = fit_weight_models(planted, n_boot=10, n_orders=2)
    direct = fit_gram(gram(match_heads(planted)[0]).sum(0))
    assert fit.value == pytest.approx(direct, rel=1e-10)


def test_the_regime_needs_the_slope_beyond_the_shuffled_control():
    """MiniLM's case (2026-12-03): slope CI [+0.037, +0.074] over heads, shuffled band reaching +0.057:
    the CI excludes 0 but not the control, so the regime is undecided; the same CI above the band is
    non-integrable-like; a CI below 0 and below the band is integrable-like, one inside it undecided."""
    from attnflow.hf.paths import WeightFit

    rng = np.random.default_rng(0)

    def fit(lo: float, hi: float, control: np.ndarray) -> WeightFit:
        return WeightFit({"jump_slope": 0.5 * (lo + hi)}, {"jump_slope": lo}, {"jump_slope": hi},
                         {"jump_slope": control.tolist()}, 100, len(control))  # fmt: skip

    wide = rng.normal(0.0, 0.029, 100)  # 97.5% quantile about +0.057
    narrow = rng.normal(0.0, 0.005, 100)
    assert fit(0.037, 0.074, wide).regime.startswith("undecided: the matched jumps grow")
    assert fit(0.037, 0.074, narrow).regime.startswith("non-integrable-like")
    assert fit(-0.074, -0.037, narrow).regime.startswith("integrable-like")
    assert fit(-0.074, -0.037, wide).regime.startswith("undecided: the matched jumps shrink")
    assert fit(-0.01, 0.02, narrow).regime.startswith("undecided: the matched jumps neither")
