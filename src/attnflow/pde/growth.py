"""Linear stability of the uniform state for isotropic heads ``A_h = beta_h I``, ``V_h = gamma_h I``.

Around ``rho_0 = 1/|S^{d-1}|`` a perturbation's spherical-harmonic (Fourier) component of degree
``l`` grows like ``exp(sigma_l t)`` with (docs/model.md, "Linear stability of the uniform state")

* ``usa``: ``sigma_l = l (l + d - 2) sum_h w_h (gamma_h / beta_h) Z_0(beta_h) r_l(beta_h)``;
* ``mha``: ``sigma_l = l (l + d - 2) sum_h w_h (gamma_h / beta_h) r_l(beta_h)``;
* ``gf``:  ``sigma_l = l (l + d - 2) sum_h w_h Z_0(beta_h) r_l(beta_h) / sum_h w_h Z_0(beta_h)`` (``gamma = beta``),

where ``r_l(beta) = I_{l + d/2 - 1}(beta) / I_{d/2 - 1}(beta)`` is the kernel's Funk-Hecke coefficient
of degree ``l`` over that of degree 0 (modified Bessel functions) and
``Z_0(beta) = Gamma(d/2) (2/beta)^{d/2 - 1} I_{d/2 - 1}(beta)`` the partition function at the
uniform state. :func:`measure_growth_rates` fits the same rates from a simulated run (particles or
the PDE) through the empirical degree powers :func:`degree_powers`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from attnflow.core.arrays import to_numpy
from attnflow.core.errors import InputError
from attnflow.core.heads import Heads
from attnflow.pde.basis import basis_functions, degrees
from attnflow.weights.processes import Constant, Layers, OrnsteinUhlenbeck, Oscillating, WeightProcess


def bessel_ratio(l: np.ndarray | int, beta: float, d: int) -> np.ndarray:
    """``r_l(beta) = I_{l + d/2 - 1}(beta) / I_{d/2 - 1}(beta)``: the Funk-Hecke coefficient of ``exp(beta <x, y>)``
    of degree ``l`` relative to degree 0 (exponentially scaled Bessel functions: no overflow)."""
    from scipy.special import ive

    nu = d / 2 - 1
    return np.asarray(ive(np.asarray(l) + nu, beta) / ive(nu, beta), dtype=np.float64)


def uniform_partition(beta: float, d: int) -> float:
    """``Z_0(beta) = int exp(beta <x, y>) dsigma(y) / |S^{d-1}| = Gamma(d/2) (2/beta)^{d/2-1} I_{d/2-1}(beta)``."""
    from scipy.special import gammaln, ive

    nu = d / 2 - 1
    return float(math.exp(gammaln(d / 2) + nu * math.log(2 / beta) + math.log(ive(nu, beta)) + beta))


@dataclass(frozen=True)
class GrowthRates:
    """``sigma_l`` for ``l = 0..lmax`` (``rates[l]``) of the uniform state, with what they came from."""

    degrees: np.ndarray
    rates: np.ndarray
    d: int
    model: str
    betas: np.ndarray
    gammas: np.ndarray
    head_weights: np.ndarray

    @property
    def most_unstable(self) -> int:
        """The degree ``l*`` with the largest growth rate."""
        return int(self.degrees[1:][np.argmax(self.rates[1:])])

    def top(self, k: int = 5) -> np.ndarray:
        """The ``k`` degrees with the largest rates, most unstable first."""
        order = np.argsort(-self.rates[1:], kind="stable")[:k]
        return self.degrees[1:][order]

    @property
    def cluster_count(self) -> int:
        """The early cluster count the most unstable degree predicts: ``l*`` on the circle (the
        maxima of ``cos(l* theta)``); on ``S^2`` the expected number of local maxima of a random
        degree-``l*`` harmonic, ``l*^2 / (2 sqrt 3)`` (at least 1), a heuristic."""
        ls = self.most_unstable
        return ls if self.d == 2 else max(1, round(ls * ls / (2 * math.sqrt(3))))


def _isotropic(A: np.ndarray, what: str) -> np.ndarray:
    """``beta_h`` of matrices ``A_h = beta_h I`` (refused otherwise)."""
    d = A.shape[-1]
    b = np.trace(A, axis1=-2, axis2=-1) / d
    dev = np.abs(A - b[:, None, None] * np.eye(d)).max()
    if dev > 1e-9 * max(1.0, float(np.abs(A).max())):
        raise InputError(
            f"linear_growth_rates needs isotropic heads {what} = beta_h I; the largest off-isotropic entry is {dev:.3g}"
        )
    return b


def _from_weights(beta: Any) -> tuple[np.ndarray, np.ndarray | None, int | None]:
    """``(betas, gammas or None for V = A, d)`` from numbers, matrices, Heads or a weight process."""
    if isinstance(beta, WeightProcess):
        if isinstance(beta, (OrnsteinUhlenbeck, Oscillating)):  # the mean the process relaxes to / oscillates about
            if beta.value != "A":
                raise InputError("linear_growth_rates needs V = A for an OU or oscillating process")
            return _isotropic(beta.A_bar, "A_bar_h"), None, beta.d
        if isinstance(beta, Constant):
            beta = beta.heads
        elif isinstance(beta, Layers):
            raise InputError("linear_growth_rates takes constant (or OU-mean) heads, not Layers; pass one block")
        else:
            raise InputError(f"linear_growth_rates cannot read a {type(beta).__name__} process; pass the betas")
    if isinstance(beta, Heads):
        A = beta.A.detach().double().numpy()
        betas = _isotropic(A, "A_h")
        gam = None if beta.V is None else _isotropic(beta.V.detach().double().numpy(), "V_h")
        return betas, gam, beta.d
    arr = np.asarray(to_numpy(beta), dtype=np.float64)
    if arr.ndim >= 2:
        A = arr if arr.ndim == 3 else arr[None]
        return _isotropic(A, "A_h"), None, A.shape[-1]
    return np.atleast_1d(arr), None, None


def linear_growth_rates(
    beta: float | Sequence[float] | Any,
    *,
    d: int | None = None,
    model: str = "gf",
    head_weights: Sequence[float] | None = None,
    values: str | float | Sequence[float] = "A",
    lmax: int | None = None,
) -> GrowthRates:
    """Growth rate ``sigma_l`` of each degree ``l`` around the uniform density, for heads ``A_h = beta_h I``.

    ``beta``: one number, one per head, ``(H, d, d)`` isotropic matrices, :class:`Heads` or a weight
    process (``Constant``; ``OrnsteinUhlenbeck`` / ``Oscillating``: their mean ``A_bar``). ``values``:
    ``"A"`` (``V_h = A_h``, the default of attnflow's processes and the only choice for ``gf``),
    ``"identity"`` (``V_h = I``) or the ``gamma_h`` of ``V_h = gamma_h I``. ``lmax``: highest degree
    (default: three times the most unstable degree's estimate ``sqrt(2 max beta)``, at least 12).
    """
    from attnflow.dynamics.fields import MODELS

    if model not in MODELS:
        raise InputError(f"unknown model {model!r}; choose one of {MODELS}")
    betas, gam_heads, d_w = _from_weights(beta)
    dim = d if d is not None else d_w
    if dim is None:
        raise InputError("linear_growth_rates needs the dimension d when beta is given as numbers")
    if d_w is not None and dim != d_w:
        raise InputError(f"the heads act on d = {d_w} but d = {dim} was asked for")
    if not (isinstance(dim, int) and dim >= 2):
        raise InputError(f"d must be an integer >= 2; got {dim!r}")
    if not (np.isfinite(betas).all() and (betas > 0).all()):
        raise InputError(f"every beta_h must be positive and finite; got {betas.tolist()}")
    H = betas.size
    if head_weights is None:
        w = np.full(H, 1.0 / H)
    else:
        w = np.asarray(head_weights, dtype=np.float64).reshape(-1)
        if w.shape != (H,) or not (w > 0).all() or abs(w.sum() - 1) > 1e-9:
            raise InputError(f"head_weights must be {H} positive numbers summing to 1")
    if gam_heads is not None:
        gammas = gam_heads
    elif isinstance(values, str):
        if values not in ("A", "identity"):
            raise InputError(f"values must be 'A', 'identity' or numbers; got {values!r}")
        gammas = betas.copy() if values == "A" else np.ones(H)
    else:
        gammas = np.broadcast_to(np.asarray(values, dtype=np.float64), (H,)).copy()
    if model == "gf" and not np.allclose(gammas, betas, rtol=1e-12):
        raise InputError("model 'gf' needs V_h = A_h (values='A')")
    top = lmax if lmax is not None else max(12, 3 * math.ceil(math.sqrt(2 * float(betas.max()))))
    if not (isinstance(top, int) and 1 <= top <= 10_000):
        raise InputError(f"lmax must be an integer in [1, 10000]; got {top!r}")
    ls = np.arange(top + 1)
    lap = ls * (ls + dim - 2.0)
    r = np.stack([bessel_ratio(ls, float(b), dim) for b in betas])  # (H, L+1)
    Z0 = np.array([uniform_partition(float(b), dim) for b in betas])
    if model == "mha":
        mix = (w * gammas / betas) @ r
    elif model == "usa":
        mix = (w * gammas / betas * Z0) @ r
    else:
        mix = (w * Z0) @ r / float(w @ Z0)
    return GrowthRates(ls, lap * mix, dim, model, betas, gammas, w)


def degree_powers(x: Any, lmax: int, token_weights: Any = None) -> np.ndarray:
    """``P_l = sum_{deg k = l} (sum_i a_i Y_k(x_i))^2`` for ``l = 0..lmax``: the power of each degree of the
    token measure (``x`` ``(N, d)`` or ``(T, N, d)``, ``d = 2, 3``), in the PDE basis's normalisation."""
    X = torch.as_tensor(np.asarray(to_numpy(x), dtype=np.float64))
    batch = X.ndim == 3
    X = X if batch else X[None]
    T, N, dim = X.shape
    if dim not in (2, 3):
        raise InputError(f"degree powers are defined here for d = 2 or 3; got d = {dim}")
    a = (
        torch.full((N,), 1.0 / N, dtype=torch.float64)
        if token_weights is None
        else torch.as_tensor(np.asarray(token_weights, dtype=np.float64))
    )
    deg = degrees(lmax, dim)
    out = torch.zeros(T, lmax + 1, dtype=torch.float64)
    for i in range(T):
        c = a @ basis_functions(X[i], lmax, dim)
        out[i].index_add_(0, deg, c * c)
    res = out.numpy()
    return res if batch else res[0]


@dataclass(frozen=True)
class MeasuredRates:
    """Rates fitted from ``log P_l(t) = log P_l(0) + 2 sigma_l t`` over each degree's linear window."""

    degrees: np.ndarray
    rates: np.ndarray
    t_fit: np.ndarray  # end of each degree's window
    points: np.ndarray  # saved times in each window
    t: np.ndarray | None = None  # the run's saved times and degree powers the fit read
    powers: np.ndarray | None = None


def measure_growth_rates(
    t: np.ndarray,
    powers: np.ndarray,
    degrees_: Sequence[int] | np.ndarray,
    *,
    nonlinear_tol: float = 0.03,
    t_max: float | None = None,
    d: int = 2,
) -> MeasuredRates:
    """Least-squares ``sigma_l`` = half the slope of ``log P_l(t)``, degree by degree, while the run is linear.

    With ``a_l = (P_l / (n_l P_0))^{1/2}`` the relative RMS amplitude of one basis function of degree
    ``l`` (``n_l`` of them: 2 on the circle, ``2l + 1`` on ``S^2``), the quadratic terms the
    linearisation drops feed degree ``l`` at about ``max_k a_k^2`` (``k`` over ``degrees_``, the growing
    ones); degree ``l``'s window is the first stretch of saved times where ``max_k a_k^2 / a_l <=
    nonlinear_tol`` (a ratio measured in the run itself), cut at ``t_max``. ``d`` is read from the
    number of degrees only through ``n_l``: pass ``d`` when it is 3. A degree with fewer than 3 saved
    times in its window gets ``nan``.
    """
    t = np.asarray(t, dtype=np.float64)
    P = np.asarray(powers, dtype=np.float64)
    degs = [int(l) for l in degrees_]
    if not degs or min(degs) < 1 or max(degs) >= P.shape[1]:
        raise InputError(f"degrees must lie in 1..{P.shape[1] - 1}; got {degs}")
    ls = np.arange(P.shape[1])
    n_l = np.where(ls == 0, 1, 2 if d == 2 else 2 * ls + 1)
    A = np.sqrt(P / n_l / P[:, :1])
    top = A[:, degs].max(axis=1)
    rates, ends, npts = [], [], []
    for l in degs:
        ok = (top**2 / A[:, l] <= nonlinear_tol) & (t <= (np.inf if t_max is None else t_max) + 1e-12)
        n = int(np.argmin(ok)) if not ok.all() else len(t)
        if n < 3:
            rates.append(np.nan)
            ends.append(t[max(n - 1, 0)])
            npts.append(n)
            continue
        X = np.stack([np.ones(n), t[:n]], axis=1)
        coef, *_ = np.linalg.lstsq(X, np.log(P[:n, l]), rcond=None)
        rates.append(coef[1] / 2)
        ends.append(t[n - 1])
        npts.append(n)
    return MeasuredRates(np.asarray(degs), np.asarray(rates), np.asarray(ends), np.asarray(npts), t, P)


@dataclass(frozen=True)
class GrowthCheck:
    """Measured against predicted rates on the ``k`` most unstable degrees: ``passed`` when every
    ``|measured / predicted - 1| <= tol``; ``margin`` = ``tol - max error`` (negative: failed)."""

    degrees: np.ndarray
    predicted: np.ndarray
    measured: np.ndarray
    rel_error: np.ndarray
    tol: float

    @property
    def passed(self) -> bool:
        return bool(np.isfinite(self.rel_error).all() and (np.abs(self.rel_error) <= self.tol).all())

    @property
    def margin(self) -> float:
        return float(self.tol - np.nanmax(np.abs(self.rel_error))) if np.isfinite(self.rel_error).any() else -np.inf

    def table(self) -> str:
        rows = [f"{'l':>3} {'predicted':>10} {'measured':>10} {'rel.err':>8}"]
        for l, p, m, e in zip(self.degrees, self.predicted, self.measured, self.rel_error):
            rows.append(f"{int(l):>3} {p:>10.4f} {m:>10.4f} {e:>+8.4f}")
        rows.append(f"tol {self.tol:g}: {'PASS' if self.passed else 'FAIL'} (margin {self.margin:+.4f})")
        return "\n".join(rows)


def check_growth(predicted: GrowthRates, measured: MeasuredRates, tol: float) -> GrowthCheck:
    """Compare measured rates with ``predicted`` on the measured degrees (relative error, tolerance ``tol``)."""
    pred = predicted.rates[measured.degrees]
    return GrowthCheck(measured.degrees, pred, measured.rates, measured.rates / pred - 1, tol)


def quantile_tokens(basis: Any, coef: Any, n: int) -> np.ndarray:
    """``n`` tokens on the circle at the quantiles ``(i + 1/2) / n`` of the density ``sum_k c_k Y_k``: a
    deterministic sample whose empirical measure is ``O(1/n)`` from the density (i.i.d. draws: ``n^{-1/2}``),
    so that a prescribed small perturbation, not sampling noise, seeds the growth."""
    if basis.d != 2:
        raise InputError("quantile tokens are defined on the circle (d = 2)")
    m = 64 * max(n, basis.lmax)
    th = (np.arange(m) + 0.5) * (2 * math.pi / m)
    x = torch.from_numpy(np.stack([np.cos(th), np.sin(th)], axis=1))
    rho = (basis.eval_at(x) @ torch.as_tensor(coef, dtype=torch.float64)).numpy()
    cdf = np.concatenate([[0.0], np.cumsum(rho) * (2 * math.pi / m)])
    cdf /= cdf[-1]
    u = (np.arange(n) + 0.5) / n
    theta = np.interp(u, cdf, np.arange(m + 1) * (2 * math.pi / m))
    return np.stack([np.cos(theta), np.sin(theta)], axis=1)


def particle_growth(
    beta: Any,
    *,
    d: int,
    n_tokens: int = 10_000,
    model: str = "gf",
    t_end: float | None = None,
    dt: float | None = None,
    k: int = 5,
    seed: int = 0,
    backend: str = "auto",
    nonlinear_tol: float = 0.03,
    head_weights: Sequence[float] | None = None,
    x0: Any = None,
) -> tuple[GrowthRates, MeasuredRates]:
    """Predicted rates and those measured on ``n_tokens`` i.i.d. uniform tokens (or the given ``x0``) run with :func:`attnflow.simulate`
    (``backend="fast"`` for large clouds on ``S^1``, ``S^2``): the sampling noise, of size ``N^{-1/2}`` in every
    degree, is the perturbation. ``t_end`` defaults to ``3 / sigma_{l*} * log(10)`` (growth by ``10^3``), ``dt``
    to ``t_end / 60``."""
    from attnflow.core.tokens import uniform
    from attnflow.solve.simulation import simulate

    pred = linear_growth_rates(beta, d=d, model=model, head_weights=head_weights)
    degs = pred.top(k)
    T = t_end if t_end is not None else 3 * math.log(10) / float(pred.rates[pred.most_unstable])
    betas, w = pred.betas, pred.head_weights
    A = betas[:, None, None] * np.eye(d)
    V = None if np.allclose(pred.gammas, betas) else pred.gammas[:, None, None] * np.eye(d)
    heads = Heads.from_matrices(A, V)
    tr = simulate(
        uniform(n_tokens, d, seed=seed) if x0 is None else x0,
        heads,
        model=model,
        t_end=T,
        dt=dt if dt is not None else T / 60,
        backend=backend,
        head_weights=w,
        record_steps=False,
    )
    P = degree_powers(np.asarray(tr.x), int(degs.max()))
    return pred, measure_growth_rates(np.asarray(tr.t), P, degs, nonlinear_tol=nonlinear_tol, d=d)


def pde_growth(
    beta: Any,
    *,
    d: int,
    lmax: int | None = None,
    model: str = "gf",
    eps: float = 1e-4,
    t_end: float | None = None,
    dt: float | None = None,
    k: int = 5,
    seed: int = 0,
    nonlinear_tol: float = 0.03,
    head_weights: Sequence[float] | None = None,
) -> tuple[GrowthRates, MeasuredRates]:
    """Predicted rates and those measured on the PDE (:func:`attnflow.solve_pde`) from ``rho_0 = (1 + eps xi)/|S|``,
    ``xi`` random in every resolved degree up to ``2 lmax / 3``. ``t_end`` defaults to growth by ``10^2``, ``dt`` to ``t_end / 60``."""
    from attnflow.pde.basis import make_basis
    from attnflow.pde.solver import perturbed_uniform, solve_pde

    pred = linear_growth_rates(beta, d=d, model=model, head_weights=head_weights)
    degs = pred.top(k)
    L = lmax if lmax is not None else max(12, int(math.ceil(1.5 * (int(degs.max()) + 1))))
    if (2 * L) // 3 < int(degs.max()):
        raise InputError(f"lmax = {L} resolves degrees up to {(2 * L) // 3}; the check needs {int(degs.max())}")
    b = make_basis(L, d)
    c0 = perturbed_uniform(b, eps, degrees=(1, (2 * L) // 3), seed=seed)
    T = t_end if t_end is not None else 2 * math.log(10) / float(pred.rates[pred.most_unstable])
    A = pred.betas[:, None, None] * np.eye(d)
    V = None if np.allclose(pred.gammas, pred.betas) else pred.gammas[:, None, None] * np.eye(d)
    sol = solve_pde(
        c0,
        Heads.from_matrices(A, V),
        model=model,
        t_end=T,
        dt=dt if dt is not None else T / 60,
        basis=b,
        head_weights=pred.head_weights,
    )
    return pred, measure_growth_rates(sol.t, sol.degree_power(), degs, nonlinear_tol=nonlinear_tol, d=d)


def density_maxima(basis: Any, coef: Any, *, n_points: int = 4096) -> int:
    """The number of local maxima above the uniform level ``1/2pi`` of a circle density ``sum_k c_k Y_k``
    (evaluated on ``n_points`` angles): the clusters a density is about to form."""
    if basis.d != 2:
        raise InputError("density_maxima counts maxima on the circle (d = 2)")
    th = np.arange(n_points) * (2 * math.pi / n_points)
    x = torch.from_numpy(np.stack([np.cos(th), np.sin(th)], axis=1))
    rho = (basis.eval_at(x) @ torch.as_tensor(coef, dtype=torch.float64)).numpy()
    peak = (rho > np.roll(rho, 1)) & (rho > np.roll(rho, -1)) & (rho > 1 / (2 * math.pi))
    return int(peak.sum())
