"""The circle's fast summation (Fourier series of exp(rho cos u)) against the direct O(N^2) sums."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnflow.core.heads import Heads
from attnflow.kernels.dense import reference_stats
from attnflow.kernels.dispatch import head_stats
from attnflow.kernels.fastsum import circle

TOL = 1e-12


def _cloud(n: int, seed: int, spread: float = np.pi) -> tuple[torch.Tensor, torch.Tensor]:
    rng = np.random.default_rng(seed)
    th = rng.uniform(-spread, spread, n)
    x = torch.tensor(np.c_[np.cos(th), np.sin(th)])
    a = torch.tensor(rng.uniform(0.5, 1.5, n))
    return x, a / a.sum()


def _direct(x: torch.Tensor, heads: Heads, a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    out, logZ = reference_stats(x.numpy(), heads.A.numpy(), heads.values.numpy(), a.numpy())
    return torch.as_tensor(out), torch.as_tensor(logZ)


def _rel(u: torch.Tensor, v: torch.Tensor) -> float:
    return float((u - v).abs().max() / v.abs().max())


@pytest.mark.parametrize("beta", [0.3, 2.0, 4.5, 9.0, 16.0])
def test_circle_stats_match_the_direct_sums_to_rounding(beta):
    """Two heads (beta I and a rotation-scaled 2 R(1.1)), random values and masses, a clustered cloud."""
    x, a = _cloud(600, int(10 * beta), spread=2.0)
    rng = np.random.default_rng(1)
    A = torch.tensor(
        np.stack([beta * np.eye(2), 2.0 * np.array([[np.cos(1.1), -np.sin(1.1)], [np.sin(1.1), np.cos(1.1)]])])
    )
    heads = Heads.from_matrices(A, torch.tensor(rng.standard_normal((2, 2, 2))))
    out, logZ = circle.circle_stats(x, heads, a)
    ref_out, ref_logZ = _direct(x, heads, a)
    e_out, e_z = _rel(out, ref_out), _rel(torch.exp(logZ - ref_logZ), torch.ones_like(ref_logZ))
    print(f"beta {beta}: K = {circle.circle_modes(beta)}, out {e_out:.1e}, Z {e_z:.1e}")
    assert e_out < TOL and e_z < TOL


def test_too_few_modes_fail_the_same_tolerance():
    """Negative control: the series cut at half the modes circle_modes asks for misses 1e-12 by far."""
    beta = 4.5
    x, a = _cloud(400, 3)
    K = circle.circle_modes(beta)
    ref = torch.exp(beta * (x @ x.T)) @ a
    full, _ = circle.circle_sums(x, x, a, beta)
    short, _ = circle.circle_sums(x, x, a, beta, modes=K // 2)
    e_full = _rel(full * np.exp(beta), ref)
    e_short = _rel(short * np.exp(beta), ref)
    print(f"K = {K}: {e_full:.1e}; K = {K // 2}: {e_short:.1e}")
    assert e_full < TOL
    assert e_short > 1e3 * TOL


def test_circle_sums_keys_differ_from_queries():
    """Queries and keys apart (the MMD's cross term), a rotated head: num against the direct sum."""
    xq, _ = _cloud(300, 5)
    y, b = _cloud(500, 6)
    rho, psi = 3.0, -0.7
    K = torch.exp(rho * torch.cos(torch.atan2(xq[:, 1], xq[:, 0])[:, None] - torch.atan2(y[:, 1], y[:, 0])[None] - psi))
    Z, num = circle.circle_sums(xq, y, b, rho, psi)
    assert _rel(Z * np.exp(rho), K @ b) < TOL
    assert _rel(num * np.exp(rho), K @ (b[:, None] * y)) < TOL


def test_only_conformal_heads_on_the_circle_take_the_path():
    x, a = _cloud(50, 0)
    assert circle.applies(x, Heads.from_matrices(torch.tensor(4.0 * np.eye(2))[None]))
    assert not circle.applies(x, Heads.from_matrices(torch.tensor([[[4.0, 0.0], [0.0, 3.0]]])))  # anisotropic
    x3 = torch.nn.functional.normalize(torch.randn(50, 3, dtype=torch.float64), dim=-1)
    assert not circle.applies(x3, Heads.from_matrices(torch.tensor(4.0 * np.eye(3))[None]))
    # the dispatcher's "fast" backend on the circle is this path (and exact to rounding)
    heads = Heads.from_matrices(torch.tensor(4.5 * np.eye(2))[None])
    out, logZ = head_stats(x, heads, a, backend="fast")
    ref_out, ref_logZ = _direct(x, heads, a)
    assert _rel(out, ref_out) < TOL and _rel(logZ, ref_logZ) < TOL
