"""Fast summation on the circle (``d = 2``): the kernel's Fourier series, ``O(N K)`` instead of ``O(N^2)``.

For a conformal head ``A_h = [[p, -q], [q, p]] = rho R(psi)`` (``A_h = beta I`` is ``rho = beta``,
``psi = 0``) and unit tokens ``x = (cos theta, sin theta)``, ``y = (cos phi, sin phi)``,
``x^T A_h y = rho cos(theta - phi - psi)``, and the Jacobi-Anger expansion

    ``exp(rho cos u) = sum_{k in Z} I_|k|(rho) e^{i k u} = I_0(rho) + 2 sum_{k >= 1} I_k(rho) cos(k u)``

is the Chebyshev series of :mod:`attnflow.kernels.fastsum` read through ``T_k(cos u) = cos(k u)``: the
truncation at ``|k| <= K`` is off by at most the same ``eps_K = 2 sum_{k > K} I_k(rho)``
(:func:`~attnflow.kernels.fastsum.bounds.chebyshev_tail_bound`), and the relative errors of ``Z_h`` and
``out_h`` by :func:`~attnflow.kernels.fastsum.bounds.relative_bound`. ``K`` is the smallest making that
below the float64 unit roundoff (:func:`circle_modes`): unlike the monomial basis, the Fourier modes
are orthogonal and the sums do not cancel down from ``exp(rho)``.

With the moments ``m_n = sum_j a_j e^{i n phi_j}`` (``m_{-n} = conj(m_n)``), ``c_k = I_|k|(rho) e^{-rho}``
(scipy's ``ive``) and ``u_k(theta) = e^{i k (theta - psi)}``:

    ``Z_h(x) e^{-rho} = sum_{|k| <= K} c_k u_k conj(m_k)``,
    ``sum_j a_j k_h(x, x_j) x_j e^{-rho} = sum_{|k| <= K} c_k u_k m_{1-k}`` (the vector ``x_j`` as ``e^{i phi_j}``),

so ``out_h = V_h (num / Z)`` and ``log Z_h`` cost ``O(N K H)``. Tokens off the circle (a Runge-Kutta stage)
are evaluated at their directions, as in the monomial fast summation.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from scipy.special import ive

from attnflow.core.errors import InputError
from attnflow.core.heads import Heads
from attnflow.kernels.fastsum.bounds import ROUNDING, chebyshev_tail_bound, relative_bound

#: The largest number of modes used: ``I_K(rho) e^{-rho}`` falls below the float64 roundoff by ``K ~ rho +
#: 9 sqrt(rho)`` (``K = 31`` at ``rho = 4.5``); beyond this many the heads are too sharp for the circle's path.
MAX_MODES = 2048


def circle_modes(rho: float, mean_norm: float = 1.0, tol: float = ROUNDING) -> int:
    """Smallest ``K`` with the proved relative error ``relative_bound(rho, eps_K, mean_norm) <= tol``
    (``eps_K = 2 sum_{k > K} I_k(rho)``); ``mean_norm``: ``|m|``, the mean token's length (Jensen's floor
    ``Z >= exp(-rho |m|)``). Raises :class:`InputError` beyond :data:`MAX_MODES`."""
    if not (math.isfinite(rho) and rho >= 0):
        raise InputError(f"rho must be a finite non-negative number; got {rho!r}")
    K = max(1, int(rho))  # the tail is not small before k ~ rho: start there
    while relative_bound(rho, chebyshev_tail_bound(rho, K), mean_norm) > tol:
        K += max(1, K // 8)
        if K > MAX_MODES:
            raise InputError(f"the circle's fast summation needs more than {MAX_MODES} modes at rho = {rho:g}")
    while K > 1 and relative_bound(rho, chebyshev_tail_bound(rho, K - 1), mean_norm) <= tol:
        K -= 1
    return K


def conformal(A: torch.Tensor) -> tuple[np.ndarray, np.ndarray] | None:
    """``(rho_h, psi_h)`` with ``A_h = rho_h R(psi_h)`` for every head of ``A`` ``(H, 2, 2)`` (exactly: the
    circle's path is taken only where it is exact), else ``None``."""
    if A.ndim != 3 or A.shape[-2:] != (2, 2):
        return None
    a = A.detach().to(torch.float64).cpu().numpy()
    p, q = a[:, 0, 0], a[:, 1, 0]
    if not (np.array_equal(a[:, 1, 1], p) and np.array_equal(a[:, 0, 1], -q)):
        return None
    return np.hypot(p, q), np.arctan2(q, p)


def applies(x: torch.Tensor, heads: Heads) -> bool:
    """Whether :func:`circle_stats` evaluates these arguments: one cloud on the circle ``(N, 2)``, plain
    heads, every ``A_h`` conformal (:func:`conformal`)."""
    return x.ndim == 2 and x.shape[-1] == 2 and heads.plain and conformal(heads.A) is not None


def powers(x: torch.Tensor, n: int) -> torch.Tensor:
    """``E[k, j] = e^{i k theta_j}`` for ``k = 0..n`` ``(n + 1, N)`` (complex128) of tokens ``x`` ``(N, 2)`` at angles
    ``theta_j``: the powers of ``(x_1 + i x_2) / |x|`` by repeated multiplication (``k`` roundoffs at mode ``k``;
    the sines and cosines of ``k theta`` cost several times as much), row by row in numpy on the CPU (torch's
    ``cumprod`` and small complex products measured 3x to 9x slower at ``N = 1e5``)."""
    xs = x.detach().to(torch.float64)
    z = torch.complex(xs[:, 0], xs[:, 1]) / torch.linalg.vector_norm(xs, dim=-1)
    if z.device.type == "cpu":
        zn = z.numpy()
        En = np.empty((n + 1, len(zn)), dtype=np.complex128)
        En[0] = 1.0
        for k in range(1, n + 1):
            np.multiply(En[k - 1], zn, out=En[k])
        return torch.from_numpy(En)
    E = torch.empty((n + 1, len(z)), dtype=torch.complex128, device=z.device)
    E[0] = 1.0
    for k in range(1, n + 1):
        torch.mul(E[k - 1], z, out=E[k])
    return E


def moments(E: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """``m_k = sum_j a_j e^{i k theta_j}`` from the powers ``E`` (:func:`powers`) and the masses ``a``."""
    return E @ a.to(device=E.device, dtype=torch.complex128)


def circle_sums(
    x: torch.Tensor, y: torch.Tensor, b: torch.Tensor, rho: float, psi: float = 0.0, *, modes: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(Z, num)`` scaled by ``e^{-rho}``: ``Z_i = sum_j b_j exp(rho cos(theta_i - phi_j - psi))`` ``(N,)``
    and ``num_i = sum_j b_j exp(...) y_j`` ``(N, 2)``, for queries ``x`` ``(N, 2)`` and keys ``y`` ``(M, 2)``
    with masses ``b`` (directions only). ``modes``: ``K`` (default :func:`circle_modes` at ``|m| = 1``)."""
    K = circle_modes(rho) if modes is None else int(modes)
    m = moments(powers(y, K + 1), b)
    return _sums(powers(x, K), m, _coefficients(rho, psi, K, x.device))


def _coefficients(rho: float, psi: float, K: int, device: torch.device) -> torch.Tensor:
    """``c_k e^{-i k psi}`` for ``k = 0..K``, ``c_k = I_k(rho) e^{-rho}`` (complex128)."""
    k = np.arange(K + 1)
    return torch.as_tensor(ive(k, rho) * np.exp(-1j * psi * k), device=device)


def _sums(E: torch.Tensor, m: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The two series of the module docstring from ``E = [e^{i k theta}]_{k = 0..K}`` ``(K + 1, N)``, the moments
    ``m_0 .. m_{K+1}`` and ``c_k e^{-i k psi}`` (``k = 0..K``): ``Z`` from ``k`` and ``-k`` paired (conjugates),
    ``num`` from ``m_{1-k}`` for ``k >= 0`` (``m_1, m_0, conj(m_1) ..``) and ``m_{1+k}`` for ``k < 0``."""
    K = len(c) - 1
    W = torch.zeros((3, K + 1), dtype=torch.complex128, device=E.device)
    W[0] = c * m[: K + 1].conj()
    W[0, 1:] *= 2.0
    W[1] = c * torch.cat([m[1:2], m[0:1], m[1:K].conj()])  # c_k m_{1-k}, k = 0..K
    W[2, 1:] = c[1:] * m[2 : K + 2].conj()  # conj(c_k conj(psi) m_{1+k}): the k < 0 half, conjugated
    R = W @ E  # one pass over the powers
    Z = R[0].real
    num = R[1] + R[2].conj()
    return Z, torch.stack([num.real, num.imag], dim=-1)


def circle_stats(
    x: torch.Tensor, heads: Heads, a: torch.Tensor, *, values: bool = True, extra_values: torch.Tensor | None = None
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """``(out, logZ)`` of every head (the contract of :func:`attnflow.kernels.head_stats`) by the Fourier series:
    ``out_h = V_h num_h / Z_h`` ``(H, N, dv)``, ``logZ_h = log(Z_h e^{-rho_h}) + rho_h`` ``(H, N)``; the
    modes ``K_h`` from :func:`circle_modes` at the cloud's mean length. Requires :func:`applies`."""
    cf = conformal(heads.A)
    if not (x.ndim == 2 and x.shape[-1] == 2 and heads.plain and cf is not None):
        raise InputError(
            "the circle's fast summation needs one cloud (N, 2) and plain conformal heads A_h = rho R(psi)"
        )
    rho, psi = cf
    xs = x.to(torch.float64)
    aw = a.to(torch.float64)
    mean = float(torch.linalg.vector_norm(aw @ (xs / torch.linalg.vector_norm(xs, dim=-1, keepdim=True))))
    Ks = [circle_modes(float(r), min(1.0, mean + 1e-12)) for r in rho]
    E = powers(xs, max(Ks) + 1)  # e^{i k theta}, shared by the heads and the moments (keys = queries)
    m = moments(E, aw)
    logZ, outs = [], []
    V = heads.values if values else None
    if V is not None and extra_values is not None:
        V = torch.cat([V, extra_values.to(V)], dim=-2)
    for h, (r, s, K) in enumerate(zip(rho, psi, Ks)):
        Z, num = _sums(E[: K + 1], m[: K + 2], _coefficients(float(r), float(s), K, x.device))
        logZ.append(torch.log(Z) + float(r))
        if V is not None:
            outs.append((num / Z[:, None]) @ V[h].to(torch.float64).T)
    out = torch.stack(outs).to(x.dtype) if V is not None else None
    return out, torch.stack(logZ).to(x.dtype)
