"""The infinite-head limit ``H = inf``: ``Theta_t`` a Gaussian law on ``A`` (docs/model.md, "Weight processes").

A :class:`GaussianHeads` law is ``A = m + c S`` with ``S = (G + G^T)/2``, ``G`` i.i.d. standard
normal (a mixture over several means ``m_c`` with weights ``omega_c`` is allowed, common ``c``).
The Gaussian moment generating function gives, for any ``x, y`` (unit ones in docs/model.md),

    E exp(x^T A y) = sum_c omega_c exp(x^T m_c y + c^2 (|x|^2 |y|^2 + (x.y)^2) / 4),

and Stein's identity ``E[S f(S)] = E[df/dS]`` (symmetrised) gives

    E[A exp(x^T A y)] y = sum_c omega_c (m_c y + c^2/2 (x |y|^2 + y (x.y))) exp(x^T m_c y + ...),

so the ``H = inf`` versions of the ``gf`` quantities are closed forms with the averaged partition
``Zbar(x) = sum_j a_j E exp(x^T A x_j)``: ``F = -1/2 sum_i a_i Zbar(x_i)``, ``b = 1 / Zbar``
(the harmonic mean over the law), ``g(x) = -P_x sum_j a_j E[A exp(x^T A x_j)] x_j``, ``v = -b g``.
Sampling ``H`` heads i.i.d. from the law (head masses ``1/H``) reproduces them up to a Monte Carlo
error ``O(H^{-1/2})``.

:class:`GaussianStatic` and :class:`GaussianOU` are the two laws-in-time: a fixed law, and the OU
law ``A_bar + exp(-rate t)(A_0 - A_bar) + c_t S`` with ``c_t = sigma sqrt((1 - exp(-2 rate t)) / (2 rate))``.
Their ``finite(H, seed)`` gives the matching finite-head :mod:`attnflow.weights` process.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from attnflow.core.arrays import ArrayLike, like, to_numpy, to_tensor
from attnflow.core.errors import InputError
from attnflow.dynamics.fields import FieldStats, masses
from attnflow.weights.processes import Constant, OrnsteinUhlenbeck, ou_stationary_scale


def _means(m: ArrayLike) -> np.ndarray:
    arr = np.asarray(to_numpy(m), dtype=np.float64)
    if arr.ndim == 2:
        arr = arr[None]
    if arr.ndim != 3 or arr.shape[1] != arr.shape[2]:
        raise InputError(f"the mean must have shape (d, d) or (C, d, d); got {arr.shape}")
    if not np.allclose(arr, arr.transpose(0, 2, 1), atol=1e-12 * max(1.0, np.abs(arr).max())):
        raise InputError("the mean of a Gaussian head law must be symmetric (the gf class); symmetrise it")
    return arr


@dataclass(frozen=True)
class GaussianHeads:
    """The law of ``A = m_c + c S`` (component ``c`` with probability ``omega_c``), ``S`` symmetric Gaussian."""

    mean: np.ndarray  # (C, d, d)
    c: float
    omega: np.ndarray  # (C,)

    @classmethod
    def create(cls, mean: ArrayLike, c: float, omega: ArrayLike | None = None) -> GaussianHeads:
        m = _means(mean)
        if not (c >= 0 and math.isfinite(c)):
            raise InputError(f"the noise scale c must be a non-negative number; got {c}")
        om = masses(omega, m.shape[0], "omega", torch.zeros(1, dtype=torch.float64)).numpy()
        return cls(mean=m, c=float(c), omega=om)

    @property
    def d(self) -> int:
        return int(self.mean.shape[-1])

    def sample(self, H: int, seed: int | None = None) -> np.ndarray:
        """``H`` i.i.d. draws ``(H, d, d)`` (use them with head masses ``1/H``)."""
        rng = np.random.default_rng(seed)
        comp = rng.choice(len(self.omega), size=H, p=self.omega)
        G = rng.standard_normal((H, self.d, self.d))
        return self.mean[comp] + self.c * 0.5 * (G + G.transpose(0, 2, 1))

    # -- closed forms ---------------------------------------------------------------------------
    def _pair(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``log E_c exp(x_i^T A x_j)`` per component ``(C, N, N)`` and ``log omega_c`` broadcastable."""
        m = torch.from_numpy(self.mean).to(x)
        G = x @ x.T
        n2 = (x * x).sum(-1)
        quad = torch.einsum("id,cde,je->cij", x, m, x)
        return quad + self.c**2 * (n2[:, None] * n2[None, :] + G * G) / 4.0, torch.log(
            torch.from_numpy(self.omega).to(x)
        )

    def law_stats(self, x: torch.Tensor, a: torch.Tensor) -> FieldStats:
        """The ``H = inf`` kernel pass as :class:`~attnflow.dynamics.fields.FieldStats` of one "head" of mass 1.

        ``logZ = log Zbar(x_i)`` (shape ``(1, N)``) and ``out = u(x_i)`` (shape ``(1, N, d)``) with
        ``u = sum_j a_j E[A exp(x^T A x_j)] x_j / Zbar``, so that the ``gf`` formulas of
        :mod:`attnflow.dynamics.fields` (energy, mobility, field, slope) give their ``H = inf`` versions.
        """
        logk, logom = self._pair(x)
        logp = logk + logom[:, None, None] + torch.log(a)[None, None, :]  # (C, N, N)
        logZ = torch.logsumexp(logp, dim=(0, 2))
        p = torch.exp(logp - logZ[None, :, None])  # weights over (c, j), summing to 1 per i
        m = torch.from_numpy(self.mean).to(x)
        mx = torch.einsum("cde,je->cjd", m, x)  # m_c x_j
        u = torch.einsum("cij,cjd->id", p, mx)
        n2 = (x * x).sum(-1)
        pj = p.sum(0)  # (N, N)
        G = x @ x.T
        u = u + self.c**2 / 2.0 * ((pj @ n2)[:, None] * x + (pj * G) @ x)
        return FieldStats(out=u[None], logZ=logZ[None], log_w=torch.zeros(1, dtype=x.dtype, device=x.device))

    def _prepared(self, x: ArrayLike, token_weights: ArrayLike | None) -> tuple[torch.Tensor, torch.Tensor, FieldStats]:
        xt = to_tensor(x)
        a = masses(token_weights, xt.shape[0], "token_weights", xt)
        return xt, a, self.law_stats(xt, a)

    def partition(self, x: ArrayLike, *, token_weights: ArrayLike | None = None) -> ArrayLike:
        """``Zbar(x_i) = sum_j a_j E exp(x_i^T A x_j)``, shape ``(N,)``."""
        _, _, st = self._prepared(x, token_weights)
        return like(st.inverse_mobility(), x)

    def energy(self, x: ArrayLike, *, token_weights: ArrayLike | None = None) -> ArrayLike:
        """``F(mu, Theta) = -1/2 sum_ij a_i a_j E exp(x_i^T A x_j)``."""
        _, a, st = self._prepared(x, token_weights)
        return like(st.energy(a), x)

    def mobility(self, x: ArrayLike, *, token_weights: ArrayLike | None = None) -> ArrayLike:
        """``b(x_i) = 1 / Zbar(x_i)``: the harmonic mean of ``m_A = 1/Z_A`` over the law."""
        _, _, st = self._prepared(x, token_weights)
        return like(st.mobility(), x)

    def velocity(self, x: ArrayLike, *, token_weights: ArrayLike | None = None) -> ArrayLike:
        """``gf`` field ``v(x_i) = -b g = P_x sum_j a_j E[A exp(x^T A x_j)] x_j / Zbar(x_i)`` (Stein)."""
        xt, _, st = self._prepared(x, token_weights)
        return like(st.velocity(xt, "gf"), x)

    def slope(self, x: ArrayLike, *, token_weights: ArrayLike | None = None) -> ArrayLike:
        """``|dF|(mu, Theta) = (sum_i a_i b(x_i) |g(x_i)|^2)^{1/2}`` with ``g = -Zbar P_x u``."""
        xt, a, st = self._prepared(x, token_weights)
        return like(torch.sqrt(st.speed_sq(st.velocity(xt, "gf"), a)), x)  # |dF| = ||v_gf||_mu


class GaussianStatic:
    """``Theta_t = GaussianHeads(mean, c)`` for all ``t`` (an infinite-head constant process)."""

    def __init__(self, mean: ArrayLike, c: float, omega: ArrayLike | None = None):
        self.law0 = GaussianHeads.create(mean, c, omega)
        self.d = self.law0.d

    def law(self, t: float) -> GaussianHeads:
        return self.law0

    def finite(self, H: int, seed: int | None = None) -> Constant:
        """``H`` heads drawn once from the law: the finite-``H`` version of this process."""
        return Constant(self.law0.sample(H, seed))


class GaussianOU:
    """The law of the symmetric OU process ``dA = -rate (A - A_bar) dt + sigma dS_t`` from ``A_0``."""

    def __init__(self, A_bar: ArrayLike, rate: float, sigma: float, A0: ArrayLike | None = None):
        if rate <= 0 or sigma < 0:
            raise InputError(f"need rate > 0 and sigma >= 0; got rate={rate}, sigma={sigma}")
        self.A_bar = _means(A_bar)[0]
        self.A0 = self.A_bar.copy() if A0 is None else _means(A0)[0]
        self.rate, self.sigma = float(rate), float(sigma)
        self.d = self.A_bar.shape[0]

    def c(self, t: float) -> float:
        """``c_t = sigma sqrt((1 - exp(-2 rate t)) / (2 rate))``."""
        return self.sigma * math.sqrt(-math.expm1(-2.0 * self.rate * t) / (2.0 * self.rate))

    def law(self, t: float) -> GaussianHeads:
        """``Theta_t``: ``A_bar + exp(-rate t)(A_0 - A_bar) + c_t S``."""
        return GaussianHeads.create(self.A_bar + math.exp(-self.rate * t) * (self.A0 - self.A_bar), self.c(t))

    def stationary(self) -> GaussianHeads:
        """``Theta_inf = A_bar + sigma / sqrt(2 rate) S``: the limit law (for :func:`stationarity`)."""
        return GaussianHeads.create(self.A_bar, ou_stationary_scale(self.sigma, self.rate))

    def finite(self, H: int, seed: int | None = None) -> OrnsteinUhlenbeck:
        """``H`` independent OU heads from ``A_0``: at each ``t`` they are i.i.d. draws from ``law(t)``."""
        tile = lambda M: np.broadcast_to(M, (H, self.d, self.d)).copy()
        return OrnsteinUhlenbeck(tile(self.A_bar), self.rate, self.sigma, A0=tile(self.A0), seed=seed)
