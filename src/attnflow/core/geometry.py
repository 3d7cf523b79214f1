"""Geometry of the unit sphere S^{d-1}: retraction, tangent projection P_x, geodesic distance, geodesics."""

from __future__ import annotations

from typing import overload

import numpy as np
import torch


def retract(x: torch.Tensor) -> torch.Tensor:
    """Metric projection back onto the sphere, ``x / |x|`` row-wise (the integrators' retraction)."""
    return x / torch.linalg.vector_norm(x, dim=-1, keepdim=True)


def project_tangent(x: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """``P_x u = u - x (x . u)`` row-wise: what layer normalisation becomes on the sphere."""
    return u - x * (x * u).sum(-1, keepdim=True)


def geodesic_distance(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Great-circle distance ``d(x, y) = arccos <x, y>`` row-wise, stable near 0 and pi.

    ``atan2(|x - y| |x + y|, ...)`` form avoids the arccos derivative blow-up at 1.
    """
    diff = torch.linalg.vector_norm(x - y, dim=-1)
    summ = torch.linalg.vector_norm(x + y, dim=-1)
    return 2.0 * torch.atan2(diff, summ)


def geodesic_distance_sq(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``d(x, y)^2 = (2 asin(|x - y| / 2))^2`` row-wise, smooth at ``y = x`` (unlike ``arccos``)."""
    u = ((x - y) ** 2).sum(-1)
    s = torch.sqrt(torch.clamp(u, min=1e-30)) / 2.0
    small = s < 1e-4
    s_safe = torch.where(small, torch.ones_like(s), torch.clamp(s, max=1.0))
    ratio = torch.where(small, 1.0 + u / 24.0, torch.asin(s_safe) / s_safe)  # asin(s)/s, s^2 = u/4
    return u * ratio * ratio


@overload
def pairwise_geodesic_distance_sq(x: np.ndarray, y: np.ndarray) -> np.ndarray: ...
@overload
def pairwise_geodesic_distance_sq(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor: ...
def pairwise_geodesic_distance_sq(
    x: np.ndarray | torch.Tensor, y: np.ndarray | torch.Tensor
) -> np.ndarray | torch.Tensor:
    """``M_ij = d(x_i, y_j)^2 = arccos(<x_i, y_j>)^2`` for unit rows ``x`` ``(N, d)``, ``y`` ``(M, d)``.

    The Gram-matrix form (``O(N M)`` memory, the ground cost of ``W_2``); near ``d = 0`` it has the
    ``arccos`` rounding of about ``1e-8``, so use :func:`geodesic_distance_sq` for matched rows.
    NumPy arrays (what the optimal-transport solver takes) are computed in NumPy, tensors in torch.
    """
    if isinstance(x, np.ndarray) and isinstance(y, np.ndarray):
        return np.arccos(np.clip(x @ y.T, -1.0, 1.0)) ** 2
    xt, yt = torch.as_tensor(x), torch.as_tensor(y)
    return torch.arccos(torch.clamp(xt @ yt.transpose(-1, -2), -1.0, 1.0)) ** 2


def slerp(p: torch.Tensor, q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """Points a fraction ``s`` ``(K,)`` of the way along the great circles from ``p_i`` to ``q_i``: ``(K, n, d)``."""
    cos = (p * q).sum(-1).clamp(-1.0, 1.0)
    theta = torch.arccos(cos)
    u = q - cos[:, None] * p
    nu = torch.linalg.vector_norm(u, dim=-1, keepdim=True)
    u = torch.where(nu > 1e-12, u / nu.clamp(min=1e-300), torch.zeros_like(u))
    ang = s[:, None, None] * theta[None, :, None]
    return torch.cos(ang) * p[None] + torch.sin(ang) * u[None]


def sphere_deviation(x: torch.Tensor) -> float:
    """``max_i | |x_i| - 1 |``: how far a token cloud is from the sphere."""
    return float((torch.linalg.vector_norm(x, dim=-1) - 1.0).abs().max())
