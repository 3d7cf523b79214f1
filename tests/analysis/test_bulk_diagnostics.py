"""Saved states' diagnostics in bulk equal the per-state ones (issue 43: cheap saves)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from attnflow.analysis.diagnostics import DIAGNOSTICS, bulk_state_diagnostics, state_diagnostics
from attnflow.core.geometry import project_tangent
from attnflow.core.heads import Heads
from attnflow.dynamics.fields import field_stats, mixed_field


def _states(S: int, N: int, d: int, rng: np.random.Generator) -> torch.Tensor:
    X = rng.standard_normal((S, N, d))
    X[1, : N // 2] = X[1, 0]  # a collapsed cluster: counted through the graph
    X[2] = X[2, 0] + 1e-3 * X[2]  # one tight cloud: one cluster
    X /= np.linalg.norm(X, axis=-1, keepdims=True)
    return torch.from_numpy(X)


def _reference(X, A, V, a, w, model, eps):
    rows = []
    for s in range(X.shape[0]):
        heads = Heads(K=A[s], V=None if V is None else V[s])
        v = project_tangent(X[s], mixed_field(X[s], heads, a, w, model))
        st = field_stats(X[s], heads.without_values(), a, w)
        rows.append(state_diagnostics(X[s], heads, a, w, v, cluster_eps=eps, stats=st))
    return rows


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "torch"])
@pytest.mark.parametrize("model,H,values", [("mha", 1, False), ("gf", 2, True), ("gf", 3, False), ("mha", 2, True)])
def test_bulk_equals_per_state(model: str, H: int, values: bool, compiled: bool, monkeypatch) -> None:
    if not compiled:  # the batched FieldStats fallback (no numba)
        from attnflow.kernels import small

        monkeypatch.setattr(small, "AVAILABLE", False)
    rng = np.random.default_rng(H)
    S, N, d = 7, 24, 4
    X = _states(S, N, d, rng)
    A = torch.from_numpy(3.0 * rng.standard_normal((S, H, d, d)) / d)
    V = torch.from_numpy(rng.standard_normal((S, H, d, d))) if values else None
    a = torch.from_numpy(rng.uniform(0.5, 1.5, N))
    a = a / a.sum()
    w = torch.from_numpy(rng.uniform(0.5, 1.5, H))
    eps = 1e-2
    ref = _reference(X, A, V, a, w, model, eps)
    got = bulk_state_diagnostics(X, A, V, a, w, model, cluster_eps=eps)
    worst = 0.0
    for r, g in zip(ref, got):
        assert set(g) == set(DIAGNOSTICS)
        assert g["clusters"] == r["clusters"]  # exactly
        for k in DIAGNOSTICS:
            scale = max(1.0, abs(r[k]))
            worst = max(worst, abs(g[k] - r[k]) / scale)
    print(f"largest relative difference bulk vs per state: {worst:.2e} (bound 1e-12)")
    assert worst < 1e-12
    assert [r["clusters"] for r in ref][1:3] != [float(N)] * 2  # the clustered states are there
    # negative control: another cluster threshold changes the counts, so the comparison can fail
    other = bulk_state_diagnostics(X, A, V, a, w, model, cluster_eps=1.5)
    assert [g["clusters"] for g in other] != [r["clusters"] for r in ref]


def test_chunks_give_the_same_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    from attnflow.analysis import diagnostics as dg

    rng = np.random.default_rng(5)
    X = _states(6, 16, 3, rng)
    A = torch.from_numpy(np.tile(2.0 * np.eye(3), (6, 1, 1, 1)))
    a, w = torch.full((16,), 1 / 16, dtype=torch.float64), torch.ones(1, dtype=torch.float64)
    whole = bulk_state_diagnostics(X, A, None, a, w, "gf")
    monkeypatch.setattr(dg, "BULK_CHUNK_VALUES", 16 * 16 * 2)  # two states a chunk
    assert bulk_state_diagnostics(X, A, None, a, w, "gf") == whole
    with pytest.raises(ValueError):
        bulk_state_diagnostics(X[:, :1], A, None, a[:1], w, "gf")
    assert all(math.isfinite(r["log_abs_energy"]) for r in whole)


def test_compiled_gram_and_union_find_match_the_torch_and_scipy_paths() -> None:
    from attnflow.analysis import diagnostics as dg
    from attnflow.kernels import small

    rng = np.random.default_rng(11)
    X = _states(9, 40, 3, rng)
    X[4] = torch.from_numpy(np.repeat(np.eye(3), [14, 13, 13], axis=0))  # three exact clusters
    for eps in (1e-3, 0.05, 0.6):
        mn, counts = small.gram_batch(X.numpy(), 1.0 - eps)
        mn_t, counts_t = dg._gram_torch(X, eps)
        assert counts.tolist() == counts_t
        assert np.abs(mn - np.array(mn_t)).max() < 1e-15
        adj = (X @ X.transpose(-1, -2) > 1.0 - eps).numpy()
        assert small.component_counts(adj).tolist() == dg._component_counts_py(adj).tolist()
    assert small.gram_batch(X.numpy(), 1.0 - 1e-3)[1][4] == 3
