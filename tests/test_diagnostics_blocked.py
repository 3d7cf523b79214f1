"""Blocked Gram diagnostics (used for large N) agree with the one-matrix versions."""

import numpy as np
import torch

from attnflow import tokens
from attnflow.diagnostics import count_clusters, pairwise_inner


def test_blocked_pairwise_inner_matches_full():
    x = torch.as_tensor(tokens.uniform(300, 3, seed=0))
    mn, mean = pairwise_inner(x)
    mn_b, mean_b = pairwise_inner(x, block=37)
    assert abs(mn - mn_b) < 1e-14 and abs(mean - mean_b) < 1e-14


def test_blocked_cluster_count_matches_full():
    rng = np.random.default_rng(1)
    centres = tokens.uniform(7, 3, seed=2)
    # A chain inside one cluster (neighbours link, ends do not) tests propagation across sweeps.
    pts = [c + 0.01 * rng.standard_normal((40, 3)) for c in centres]
    chain = np.array([[np.cos(t), np.sin(t), 0.0] for t in np.arange(0, 0.5, 0.03)])
    x = np.concatenate(pts + [chain])
    x = torch.as_tensor(x / np.linalg.norm(x, axis=1, keepdims=True))
    import attnflow.diagnostics as diag

    for eps in (1e-3, 1e-2):
        full = count_clusters(x, eps)
        assert count_clusters(x, eps, block=23) == full  # sparse edge lists
        budget = diag.GRAM_EDGE_BUDGET
        try:
            diag.GRAM_EDGE_BUDGET = 10  # force label propagation
            assert count_clusters(x, eps, block=23) == full
        finally:
            diag.GRAM_EDGE_BUDGET = budget
