"""Large-N diagnostics (grid cluster count, KD-tree minimum, blocked Gram fallbacks) agree with the
one-matrix definitions: brute-force Gram matrix + scipy connected components."""

import math

import numpy as np
import pytest
import torch
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components

import attnflow.analysis.diagnostics as diag
import attnflow.analysis.grid as grid
from attnflow import tokens
from attnflow.analysis.diagnostics import count_clusters, pairwise_inner
from attnflow.core.heads import Heads, identity_heads

SMALL = 64  # block= below N sends every call through the large-N paths


def _unit(y):
    return y / np.linalg.norm(y, axis=1, keepdims=True)


def _dense_count(x, eps):
    G = (x @ x.T > 1.0 - eps).numpy()
    return int(connected_components(csr_matrix(G), directed=False)[0])


def _dense_min(x):
    G = x @ x.T
    G.fill_diagonal_(math.inf)
    return float(G.min())


def _clusters(rng, n, d, k, spread):
    """``k`` vMF-like clusters: random centres plus Gaussian noise of size ``spread``, normalised."""
    c = _unit(rng.standard_normal((k, d)))
    return torch.as_tensor(_unit(c[rng.integers(0, k, n)] + spread * rng.standard_normal((n, d))))


def _circle_chain(n, d, step, seed=0):
    """``n`` points ``step`` radians apart on a great circle, turned by a random rotation."""
    t = step * np.arange(n)
    y = np.zeros((n, d))
    y[:, 0], y[:, 1] = np.cos(t), np.sin(t)
    q, _ = np.linalg.qr(np.random.default_rng(seed).standard_normal((d, d)))
    return torch.as_tensor(y @ q.T)


def test_blocked_pairwise_inner_matches_full():
    x = torch.as_tensor(tokens.uniform(300, 3, seed=0))
    mn, mean = pairwise_inner(x)
    mn_b, mean_b = pairwise_inner(x, block=37)
    assert abs(mn - mn_b) < 1e-14 and abs(mean - mean_b) < 1e-14


def test_blocked_cluster_count_matches_full(monkeypatch):
    rng = np.random.default_rng(1)
    centres = tokens.uniform(7, 3, seed=2)
    # A chain inside one cluster (neighbours link, ends do not) tests propagation across sweeps.
    pts = [c + 0.01 * rng.standard_normal((40, 3)) for c in centres]
    chain = np.array([[np.cos(t), np.sin(t), 0.0] for t in np.arange(0, 0.5, 0.03)])
    x = np.concatenate(pts + [chain])
    x = torch.as_tensor(x / np.linalg.norm(x, axis=1, keepdims=True))

    for eps in (1e-3, 1e-2):
        full = count_clusters(x, eps)
        assert count_clusters(x, eps, block=23) == full  # grid
        monkeypatch.setattr(diag, "CLUSTER_GRID_MAX_DIM", 0)  # blocked Gram fallback
        assert count_clusters(x, eps, block=23) == full  # sparse edge lists
        monkeypatch.setattr(diag, "GRAM_EDGE_BUDGET", 10)  # force label propagation
        assert count_clusters(x, eps, block=23) == full
        monkeypatch.undo()


@pytest.mark.parametrize("d", [2, 3, 4])
def test_grid_cluster_count_matches_dense(d):
    rng = np.random.default_rng(d)
    n = 3000
    eps = {2: 2e-6, 3: 1e-3, 4: 1e-2}[d]  # uniform clouds near percolation: many components
    r = math.sqrt(2 * eps)
    clouds = [torch.as_tensor(_unit(rng.standard_normal((n, d))))]
    # Tight clusters, and clusters whose spread is near r (cell boundaries and cross-cell pairs matter).
    clouds += [_clusters(rng, n, d, k, f * r) for k, f in ((6, 0.05), (4, 0.5), (8, 1.0), (3, 2.0))]
    counts = []
    for x in clouds:
        want = _dense_count(x, eps)
        counts.append(want)
        assert count_clusters(x, eps, block=SMALL) == want
    assert counts[0] > 10 and len(set(counts)) > 2  # the clouds are not all one component


@pytest.mark.parametrize("small_work", [0, 10**9])
def test_grid_cluster_count_both_pair_checks(monkeypatch, small_work):
    """Every candidate cell pair decided one by one (KD-tree / block) or all at once (vectorised)."""
    monkeypatch.setattr(grid, "_SMALL_PAIR_WORK", small_work)  # the grid method lives in analysis.grid
    rng = np.random.default_rng(7)
    eps = 1e-3
    r = math.sqrt(2 * eps)
    for x in (torch.as_tensor(_unit(rng.standard_normal((3000, 3)))), _clusters(rng, 3000, 3, 5, 0.7 * r)):
        assert count_clusters(x, eps, block=SMALL) == _dense_count(x, eps)


@pytest.mark.parametrize(("gap", "joined"), [(0.97, True), (1.03, True), (1.08, True), (1.2, False)])
def test_two_dense_blobs_at_distance_near_r(gap, joined):
    """Two blobs of 1500 points with centres ``gap * r`` apart: beyond r they join only through their
    extreme points, which the KD-tree check of large cells must find (the representatives do not link)."""
    rng = np.random.default_rng(3)
    eps = 1e-3
    r = math.sqrt(2 * eps)
    phi = 2 * math.asin(gap * r / 2)  # chord gap * r
    p, w = np.array([1.0, 0.0, 0.0]), _unit(np.array([[0.0, 1.0, 0.3]]))[0]
    q = math.cos(phi) * p + math.sin(phi) * w
    blobs = [c + 0.02 * r * rng.standard_normal((1500, 3)) for c in (p, q)]
    x = torch.as_tensor(_unit(np.concatenate(blobs)))
    want = _dense_count(x, eps)
    assert want == (1 if joined else 2)
    assert count_clusters(x, eps, block=SMALL) == want


@pytest.mark.parametrize("d", [2, 3, 4])
def test_chains_just_below_and_above_r(d):
    eps = 1e-5
    theta = math.acos(1 - eps)  # neighbours at angle theta are exactly at the threshold
    n = 1300  # 1300 * theta < 2 pi: the chain does not close
    assert count_clusters(_circle_chain(n, d, 0.999 * theta, seed=d), eps, block=SMALL) == 1
    assert count_clusters(_circle_chain(n, d, 1.001 * theta, seed=d), eps, block=SMALL) == n
    x = _circle_chain(n, d, 0.7 * theta, seed=d)  # neighbours and next neighbours? 1.4 theta: no
    assert count_clusters(x, eps, block=SMALL) == _dense_count(x, eps) == 1


def test_duplicates_identical_and_antipodal_points():
    rng = np.random.default_rng(4)
    u = _unit(rng.standard_normal((1000, 3)))
    p = u[:1]
    cases = {
        "duplicated": np.concatenate([u, u, u[:500]]),
        "identical": np.repeat(p, 800, axis=0),
        "two antipodal points": np.concatenate([np.repeat(p, 600, axis=0), np.repeat(-p, 600, axis=0)]),
        "antipodal pair in a cloud": np.concatenate([u, -u[:1]]),
    }
    for name, y in cases.items():
        x = torch.as_tensor(y)
        for eps in (1e-3, 0.5):
            assert count_clusters(x, eps, block=SMALL) == _dense_count(x, eps), name
        mn, mean = pairwise_inner(x, block=SMALL)
        assert abs(mn - _dense_min(x)) <= 4e-16, name
        _, mean_dense = pairwise_inner(x)
        assert abs(mean - mean_dense) < 1e-12, name
    assert count_clusters(torch.as_tensor(cases["identical"]), 1e-3, block=SMALL) == 1
    assert pairwise_inner(torch.as_tensor(cases["two antipodal points"]), block=SMALL)[0] <= -1 + 1e-15


@pytest.mark.parametrize("d", [2, 3, 4, 8])
def test_kdtree_min_inner_matches_dense(d):
    rng = np.random.default_rng(10 + d)
    r = math.sqrt(2e-3)
    for x in (
        torch.as_tensor(_unit(rng.standard_normal((4000, d)))),
        _clusters(rng, 4000, d, 5, 0.3 * r),
        _clusters(rng, 4000, d, 2, 0.0),
    ):
        assert abs(pairwise_inner(x, block=SMALL)[0] - _dense_min(x)) <= 4e-16


def test_off_sphere_points_and_float32_and_large_d():
    rng = np.random.default_rng(5)
    # Norms in [0.5, 1.5]: the point nearest -x_i is not the smallest inner product, and cells are
    # not cliques; the fast paths must notice and still give the dense answer.
    y = _unit(rng.standard_normal((2000, 3))) * rng.uniform(0.5, 1.5, (2000, 1))
    x = torch.as_tensor(y)
    assert count_clusters(x, 0.05, block=SMALL) == _dense_count(x, 0.05)
    assert abs(pairwise_inner(x, block=SMALL)[0] - _dense_min(x)) <= 1e-15
    x32 = _clusters(rng, 3000, 3, 6, 0.02).float()
    for eps in (1e-3, 1e-2):
        assert count_clusters(x32, eps, block=SMALL) == _dense_count(x32, eps)
    assert abs(pairwise_inner(x32, block=SMALL)[0] - _dense_min(x32)) <= 4e-7
    x10 = _clusters(rng, 1500, 10, 4, 0.05)  # d above the grid / KD-tree limits: blocked Gram
    assert count_clusters(x10, 0.01, block=SMALL) == _dense_count(x10, 0.01)
    assert abs(pairwise_inner(x10, block=SMALL)[0] - _dense_min(x10)) <= 4e-16


def test_blocks_are_memory_bounded():
    assert diag._rows_per_block(100_000, diag.GRAM_BLOCK_TOKENS) * 100_000 <= diag.GRAM_BLOCK_ENTRIES
    assert diag._rows_per_block(10**9, 4096) == 1 and diag._rows_per_block(100, 23) == 23


def test_gram_diagnostics_equal_scipy_components_and_pairwise_inner():
    """One Gram matrix gives the cluster count of scipy's connected components (sparse and BFS paths
    alike) and exactly the min/mean of pairwise_inner; a wrong threshold changes the count."""
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import connected_components

    from attnflow.analysis.diagnostics import gram_diagnostics, pairwise_inner

    rng = np.random.default_rng(0)
    paths = set()
    for _ in range(40):
        N, d, k = int(rng.integers(2, 300)), int(rng.integers(2, 6)), int(rng.integers(1, 8))
        c = rng.standard_normal((k, d))
        c /= np.linalg.norm(c, axis=1, keepdims=True)
        x = c[rng.integers(0, k, N)] + rng.choice([1e-5, 1e-2, 0.3]) * rng.standard_normal((N, d))
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        eps = float(rng.choice([1e-3, 1e-2, 0.2]))
        ref = connected_components(csr_matrix(x @ x.T > 1 - eps), directed=False)[0]
        clusters, mn, mean = gram_diagnostics(torch.as_tensor(x), eps)
        assert clusters == ref
        assert (mn, mean) == pairwise_inner(torch.as_tensor(x))
        paths.add(int((x @ x.T > 1 - eps).sum()) > 9 * N)
    assert paths == {True, False}  # both the sparse and the breadth-first path were exercised
    x = np.repeat(np.eye(3), 4, axis=0)  # three exact clusters of four tokens
    assert gram_diagnostics(torch.as_tensor(x), 1e-3)[0] == 3
    assert gram_diagnostics(torch.as_tensor(x), 1.5)[0] == 1  # control: a threshold below 0 joins them


def test_gram_diagnostics_of_a_spread_cloud_take_the_no_edge_path():
    """A spread-out cloud (no pair above 1 - eps): every token is its own component, and min/mean are
    those of pairwise_inner bit for bit, in float64 and float32; control: a loose eps joins tokens."""
    from attnflow.analysis.diagnostics import gram_diagnostics

    for dtype in (torch.float64, torch.float32):
        x = torch.as_tensor(tokens.uniform(500, 16, 3), dtype=dtype)
        G = (x @ x.T).numpy()
        assert connected_components(csr_matrix(G > 1 - 1e-3), directed=False)[0] == 500
        clusters, mn, mean = gram_diagnostics(x, 1e-3)
        assert clusters == 500 and (mn, mean) == pairwise_inner(x)
        loose = connected_components(csr_matrix(G > 1 - 1.2), directed=False)[0]
        assert gram_diagnostics(x, 1.2)[0] == loose < 500


def test_gram_buffer_and_closed_form_mean():
    """A Gram buffer (filled with NaN beforehand) gives the same numbers as a fresh matrix, and the
    closed-form mean equals the average over the pairs i < j; controls: a buffer is really written
    into, and the closed form without the diagonal term is off."""
    from attnflow.analysis.diagnostics import gram_buffer, gram_diagnostics, mean_inner, state_diagnostics

    for dtype in (torch.float64, torch.float32):
        x = torch.as_tensor(tokens.uniform(300, 16, 5), dtype=dtype)
        buf = torch.full((300, 300), math.nan, dtype=dtype)
        assert gram_diagnostics(x, 1e-3, out=buf) == gram_diagnostics(x, 1e-3)
        assert torch.equal(buf[0, 1:], (x @ x.T)[0, 1:])  # control: the product went into the buffer
        x64 = x.double().numpy()
        G = x64 @ x64.T
        pairs = G[np.triu_indices(300, 1)].mean()
        assert mean_inner(x) == pytest.approx(pairs, rel=1e-12, abs=1e-14)
        tot = x64.sum(0)
        assert abs(float(tot @ tot) / (300 * 299) - pairs) > 1e-3  # control: the diagonal must go
    heads = Heads.from_matrices(identity_heads(2, 16, 1.0))
    a, w = torch.full((300,), 1 / 300, dtype=torch.float64), torch.full((2,), 0.5, dtype=torch.float64)
    x = torch.as_tensor(tokens.uniform(300, 16, 5))
    v = torch.zeros_like(x)
    plain = state_diagnostics(x, heads, a, w, v)
    wrong = torch.full((299, 299), math.nan, dtype=torch.float64)  # a buffer that does not fit is not used
    assert state_diagnostics(x, heads, a, w, v, gram_out=wrong) == plain
    assert state_diagnostics(x, heads, a, w, v, gram_out=torch.empty(300, 300, dtype=torch.float64)) == plain
    kept = gram_buffer(x, None)  # what a run keeps from save to save
    assert kept.shape == (300, 300) and gram_buffer(x, kept) is kept
    assert gram_buffer(x, wrong) is not wrong and gram_buffer(x, kept.float()).dtype == torch.float64
    assert gram_buffer(torch.zeros(diag.GRAM_BLOCK_TOKENS + 1, 3), None) is None  # beyond: no one matrix
