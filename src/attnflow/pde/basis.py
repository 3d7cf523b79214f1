"""Spectral bases on the circle and on ``S^2``, with the quadrature grid they are evaluated on.

A :class:`Basis` holds an orthonormal real basis ``Y_k`` (Fourier modes on ``S^1``, real spherical
harmonics on ``S^2``), its values ``Y`` ``(M, K)`` and sphere gradients ``G`` ``(M, d, K)`` (tangent
vectors in ``R^d``) at ``M`` quadrature points with weights ``q`` ``(M,)`` (``sum_i q_i = |S^{d-1}|``),
and the degree ``l`` of each basis function. The quadrature integrates products of two basis
functions exactly (Gauss-Legendre in ``cos theta`` times an equispaced longitude grid on ``S^2``, the
trapezoid rule on ``S^1``) and, with the default 3/2 oversampling, the quadratic flux ``rho v``
without aliasing of the resolved modes.

The spherical harmonics are built here (no compiled SHT library): the normalised associated
Legendre recurrence in ``z = cos theta`` times the real and imaginary parts of ``(x + i y)^m``,
which makes every ``Y_lm`` a polynomial in ``(x, y, z)``; forward-mode autodiff of that polynomial,
projected to the tangent plane, gives its sphere gradient exactly. Checked against
``scipy.special.sph_harm_y`` in the tests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from attnflow.core.errors import InputError
from attnflow.core.geometry import project_tangent

#: The largest degree the dense basis accepts: its gradient table has ``3 M K ~ 13 L^4`` entries (650 MB at L = 48).
MAX_DEGREE_SPHERE = 48
MAX_DEGREE_CIRCLE = 2048


@dataclass(frozen=True)
class Basis:
    """An orthonormal real basis on ``S^{d-1}`` (``d = 2, 3``) sampled on a quadrature grid."""

    d: int
    lmax: int
    points: torch.Tensor  # (M, d) quadrature nodes on the sphere
    q: torch.Tensor  # (M,) quadrature weights, sum = |S^{d-1}|
    Y: torch.Tensor  # (M, K) basis values
    G: torch.Tensor  # (M, d, K) sphere gradients of the basis functions
    degree: torch.Tensor  # (K,) degree l of each basis function (the frequency on the circle)

    @property
    def area(self) -> float:
        """``|S^{d-1}|`` (``2 pi`` or ``4 pi``)."""
        return 2 * math.pi if self.d == 2 else 4 * math.pi

    @property
    def n_coef(self) -> int:
        return int(self.Y.shape[1])

    def values(self, c: torch.Tensor) -> torch.Tensor:
        """``rho(x_i) = sum_k c_k Y_k(x_i)`` at the grid points (leading batch dims allowed)."""
        return c @ self.Y.T

    def analyse(self, values: torch.Tensor) -> torch.Tensor:
        """Coefficients ``c_k = sum_i q_i f(x_i) Y_k(x_i)`` (exact for band-limited ``f``)."""
        return (values * self.q) @ self.Y

    def degree_power(self, c: torch.Tensor) -> torch.Tensor:
        """``P_l = sum_{deg k = l} c_k^2`` for ``l = 0..lmax`` (leading batch dims allowed)."""
        out = torch.zeros(*c.shape[:-1], self.lmax + 1, dtype=c.dtype)
        return out.index_add_(-1, self.degree, c * c)

    def eval_at(self, x: torch.Tensor) -> torch.Tensor:
        """Basis values ``Y_k(x_j)`` ``(N, K)`` at arbitrary points ``x`` ``(N, d)`` on the sphere."""
        return basis_functions(x, self.lmax, self.d)


def _fourier(x: torch.Tensor, K: int) -> torch.Tensor:
    theta = torch.atan2(x[:, 1], x[:, 0])
    cols = [torch.full_like(theta, 1.0 / math.sqrt(2 * math.pi))]
    for k in range(1, K + 1):
        cols += [torch.cos(k * theta) / math.sqrt(math.pi), torch.sin(k * theta) / math.sqrt(math.pi)]
    return torch.stack(cols, dim=-1)


def _fourier_grad(x: torch.Tensor, K: int) -> torch.Tensor:
    theta = torch.atan2(x[:, 1], x[:, 0])
    e = torch.stack([-torch.sin(theta), torch.cos(theta)], dim=-1)  # unit tangent d/dtheta
    cols = [torch.zeros_like(theta)]
    for k in range(1, K + 1):
        cols += [-k * torch.sin(k * theta) / math.sqrt(math.pi), k * torch.cos(k * theta) / math.sqrt(math.pi)]
    return e.unsqueeze(-1) * torch.stack(cols, dim=-1).unsqueeze(1)


def _real_sh(x: torch.Tensor, L: int) -> torch.Tensor:
    """Real orthonormal spherical harmonics of degree ``<= L`` at ``x`` ``(M, 3)`` as polynomials in ``x``.

    Ordered by degree, then ``m = 0, 1 (cos), 1 (sin), 2 (cos), ...``: column ``l^2 + j``.
    """
    X, Yc, Z = x[:, 0], x[:, 1], x[:, 2]
    # Re and Im of (x + i y)^m, m = 0..L.
    C, S = [torch.ones_like(X)], [torch.zeros_like(X)]
    for _ in range(L):
        C.append(C[-1] * X - S[-1] * Yc)
        S.append(S[-1] * X + C[-2] * Yc)
    cols: dict[tuple[int, int], torch.Tensor] = {}
    for m in range(L + 1):
        # Normalised Q_l^m = P_l^m / (1 - z^2)^{m/2}; the usual stable three-term recurrence in l.
        qmm = math.sqrt((2 * m + 1) / (4 * math.pi) * math.prod((2 * k - 1) / (2 * k) for k in range(1, m + 1)))
        q_prev2 = None
        q_prev = torch.full_like(Z, qmm)
        for l in range(m, L + 1):
            if l == m:
                q = q_prev
            elif l == m + 1:
                q = math.sqrt(2 * m + 3) * Z * q_prev
            else:
                a = math.sqrt((4 * l * l - 1) / (l * l - m * m))
                b = math.sqrt(((l - 1) ** 2 - m * m) / (4 * (l - 1) ** 2 - 1))
                assert q_prev2 is not None
                q = a * (Z * q_prev - b * q_prev2)
            if l > m:
                q_prev2, q_prev = q_prev, q
            if m == 0:
                cols[(l, 0)] = q
            else:
                cols[(l, 2 * m - 1)] = math.sqrt(2) * q * C[m]
                cols[(l, 2 * m)] = math.sqrt(2) * q * S[m]
    return torch.stack([cols[(l, j)] for l in range(L + 1) for j in range(2 * l + 1)], dim=-1)


def basis_functions(x: torch.Tensor, lmax: int, d: int) -> torch.Tensor:
    """``Y_k(x_j)``, ``(N, K)``: Fourier modes (``d = 2``) or real spherical harmonics (``d = 3``)."""
    return _fourier(x, lmax) if d == 2 else _real_sh(x, lmax)


def _sphere_grad(x: torch.Tensor, L: int) -> torch.Tensor:
    """Sphere gradients ``P_x grad Y_lm`` ``(M, 3, K)``: forward-mode derivatives of the polynomials."""
    from torch.func import jvp

    parts = []
    for k in range(3):
        e = torch.zeros_like(x)
        e[:, k] = 1.0
        parts.append(jvp(lambda p: _real_sh(p, L), (x,), (e,))[1])
    grad = torch.stack(parts, dim=1)  # (M, 3, K) Euclidean gradients
    return project_tangent(
        x.unsqueeze(-1).transpose(1, 2).expand(-1, grad.shape[2], -1), grad.transpose(1, 2)
    ).transpose(1, 2)


def degrees(lmax: int, d: int) -> torch.Tensor:
    """Degree of each basis function: ``0, 1, 1, 2, 2, ...`` (circle) or ``l`` repeated ``2l+1`` times."""
    if d == 2:
        return torch.tensor([0] + [k for k in range(1, lmax + 1) for _ in range(2)], dtype=torch.long)
    return torch.tensor([l for l in range(lmax + 1) for _ in range(2 * l + 1)], dtype=torch.long)


def grid_size(lmax: int, d: int, oversample: float = 1.5) -> tuple[int, ...]:
    """The quadrature grid for degree ``lmax``: ``(M,)`` on the circle, ``(n_lat, n_lon)`` on ``S^2``."""
    if d == 2:
        return (max(2 * lmax + 1, int(math.ceil(oversample * (2 * lmax + 1)))),)
    nlat = max(lmax + 1, int(math.ceil(oversample * (lmax + 1))))
    return (nlat, 2 * nlat)


def make_basis(lmax: int, d: int, *, oversample: float = 1.5, grid: tuple[int, ...] | None = None) -> Basis:
    """The basis of degree ``<= lmax`` on ``S^{d-1}`` on its quadrature grid (float64).

    ``grid``: ``(M,)`` points on the circle or ``(n_lat, n_lon)`` on ``S^2`` (default :func:`grid_size`);
    it must integrate products of two basis functions exactly.
    """
    if d not in (2, 3):
        raise InputError(f"the PDE solver works on the circle (d = 2) or on S^2 (d = 3); got d = {d}")
    top = MAX_DEGREE_CIRCLE if d == 2 else MAX_DEGREE_SPHERE
    if not (isinstance(lmax, int) and 1 <= lmax <= top):
        raise InputError(f"lmax must be an integer in [1, {top}] for d = {d}; got {lmax!r}")
    g = grid or grid_size(lmax, d, oversample)
    dt = torch.float64
    if d == 2:
        (M,) = g
        if M < 2 * lmax + 1:
            raise InputError(f"the circle grid needs at least 2 lmax + 1 = {2 * lmax + 1} points; got {M}")
        theta = torch.arange(M, dtype=dt) * (2 * math.pi / M)
        pts = torch.stack([torch.cos(theta), torch.sin(theta)], dim=-1)
        q = torch.full((M,), 2 * math.pi / M, dtype=dt)
        Y, G = _fourier(pts, lmax), _fourier_grad(pts, lmax)
    else:
        nlat, nlon = g
        if nlat < lmax + 1 or nlon < 2 * lmax + 1:
            raise InputError(f"the S^2 grid needs n_lat >= {lmax + 1} and n_lon >= {2 * lmax + 1}; got {nlat} x {nlon}")
        z, wz = np.polynomial.legendre.leggauss(nlat)
        phi = np.arange(nlon) * (2 * math.pi / nlon)
        Zg, Pg = np.meshgrid(z, phi, indexing="ij")
        s = np.sqrt(1 - Zg**2)
        pts = torch.from_numpy(np.stack([s * np.cos(Pg), s * np.sin(Pg), Zg], axis=-1).reshape(-1, 3))
        q = torch.from_numpy(np.repeat(wz, nlon) * (2 * math.pi / nlon))
        Y, G = _real_sh(pts, lmax), _sphere_grad(pts, lmax)
    return Basis(d=d, lmax=lmax, points=pts, q=q, Y=Y, G=G, degree=degrees(lmax, d))
