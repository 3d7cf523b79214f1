"""The Transformer PDE: the continuity equation ``d/dt rho + div_S(rho v_t[rho]) = 0`` on ``S^1`` and ``S^2``.

The token density ``rho`` (with respect to the surface measure, ``int rho = 1``) is a finite
expansion ``rho = sum_k c_k Y_k`` in the orthonormal basis of :mod:`attnflow.pde.basis` (Fourier
modes, real spherical harmonics up to degree ``lmax``). The field ``v_t[rho]`` is the model's field
(``mha``, ``gf``, ``usa``) with the sums over tokens replaced by integrals against ``rho``: the
quadrature grid *is* a weighted token cloud (masses ``a_i = q_i rho(x_i)``), so the field comes from
the same kernel and the same formulas as the particles' (:func:`attnflow.dynamics.fields.field_stats`),
exactly for the band-limited part. The coefficients evolve by the Galerkin (weak) form

    ``d c_k / dt = int rho v . grad_S Y_k  =  sum_i a_i v(x_i) . grad_S Y_k(x_i)``,

stepped with classical Runge-Kutta 4 (the schemes' tableau, :data:`attnflow.schemes.integrators.RK4_TABLEAU`). Mass is ``c_0 |S|^{1/2}`` and ``grad Y_0 = 0``, so it is
conserved to rounding. The solution is trusted while the density is resolved: after every step the
solver checks that ``rho > 0`` on the grid and that the top third of the degrees holds less than
``tail_tol`` of ``sum_k c_k^2``; otherwise it raises :class:`~attnflow.core.errors.NumericalError`
(one sentence; the exception's ``partial`` holds the solution up to the last resolved step).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from attnflow.core.arrays import ArrayLike, to_tensor
from attnflow.core.errors import Hint, InputError, NumericalError
from attnflow.core.geometry import project_tangent
from attnflow.core.heads import Heads
from attnflow.dynamics.fields import MODELS, FieldStats, check_model, field_stats, identity_values, split_means
from attnflow.kernels.dispatch import BACKENDS, KernelOptions
from attnflow.pde.basis import Basis, make_basis
from attnflow.schemes.integrators import RK4_TABLEAU, explicit_rk_step
from attnflow.weights.processes import WeightProcess, as_process


class ResolutionExceeded(NumericalError):
    """The density concentrated beyond the basis (spectral tail or a non-positive density on the grid)."""

    def __init__(self, message: str, partial: PDESolution | None = None) -> None:
        super().__init__(message, hint=Hint("lmax"))
        self.partial = partial


@dataclass
class PDESolution:
    """The density ``rho_t = sum_k c_k(t) Y_k`` at the saved times, with its diagnostics.

    ``coef`` ``(T, K)``; ``energy``, ``slope``, ``speed``, ``mass``, ``tail``, ``min_density`` ``(T,)``
    at the saved times ``t``. ``steps``: per-step series of the energy-dissipation budget
    (``t``, ``energy_change``, ``weight_work``, ``speed_action``, ``slope_action``), each ``(n_steps,)``:
    the actions are trapezoid rules of ``|mu'|^2`` and ``|dF|^2``, the weights' work the average of the
    exact increments ``F(rho, t_{k+1}) - F(rho, t_k)`` at ``rho_k`` and ``rho_{k+1}``, so the budget
    closes at ``O(dt^2)``.
    """

    basis: Basis
    model: str
    dt: float
    t: np.ndarray
    coef: np.ndarray
    energy: np.ndarray
    slope: np.ndarray
    speed: np.ndarray
    mass: np.ndarray
    tail: np.ndarray
    min_density: np.ndarray
    steps: dict[str, np.ndarray]
    info: dict[str, Any] = field(default_factory=dict)

    def density(self, i: int = -1) -> np.ndarray:
        """``rho(x_i)`` on the quadrature grid at saved time index ``i``."""
        return self.basis.values(torch.from_numpy(self.coef[i])).numpy()

    def degree_power(self) -> np.ndarray:
        """``P_l(t) = sum_{deg k = l} c_k(t)^2``, ``(T, lmax + 1)``: the amplitude of each degree."""
        return self.basis.degree_power(torch.from_numpy(self.coef)).numpy()

    @property
    def mass_error(self) -> float:
        """``max_t |m(t) - m(0)| / m(0)``: the relative drift of the total mass."""
        return float(np.abs(self.mass - self.mass[0]).max() / abs(self.mass[0]))

    def edi_residual(self) -> np.ndarray:
        """Cumulative budget residual ``F(t_k) - F(0) + 1/2 int |mu'|^2 + 1/2 int |dF|^2 - int dF/dr``
        at the step ends (``gf`` only; zero for the exact flow, ``O(dt^2)`` here: the actions are
        integrated by the trapezoid rule)."""
        s = self.steps
        if not s or self.model != "gf":
            raise InputError("the energy-dissipation budget is defined for model 'gf' only")
        per = s["energy_change"] - s["weight_work"] + 0.5 * s["speed_action"] + 0.5 * s["slope_action"]
        return np.cumsum(per)

    def edi_scale(self) -> float:
        """The budget's own scale: the total dissipation ``1/2 int |mu'|^2 + 1/2 int |dF|^2``."""
        return float(0.5 * (self.steps["speed_action"].sum() + self.steps["slope_action"].sum()))


def uniform_density(basis: Basis) -> torch.Tensor:
    """Coefficients of the uniform density ``1 / |S^{d-1}|``."""
    c = torch.zeros(basis.n_coef, dtype=torch.float64)
    c[0] = 1.0 / math.sqrt(basis.area)
    return c


def perturbed_uniform(
    basis: Basis, eps: float, *, degrees: tuple[int, int] = (1, 8), seed: int | None = 0
) -> torch.Tensor:
    """``rho_0 = (1 + eps xi) / |S|`` with ``xi`` a random combination of the basis functions of degree
    ``degrees[0]..degrees[1]``, normalised to ``max |xi| = 1`` on the grid (so ``rho_0 > 0`` for ``eps < 1``)."""
    lo, hi = degrees
    if not (1 <= lo <= hi <= basis.lmax):
        raise InputError(f"perturbation degrees must satisfy 1 <= lo <= hi <= lmax = {basis.lmax}; got {degrees}")
    if not (0 <= eps < 1):
        raise InputError(f"the perturbation amplitude eps must be in [0, 1); got {eps}")
    rng = np.random.default_rng(seed)
    sel = (basis.degree >= lo) & (basis.degree <= hi)
    xi = torch.zeros(basis.n_coef, dtype=torch.float64)
    xi[sel] = torch.from_numpy(rng.standard_normal(int(sel.sum())))
    top = float(basis.values(xi).abs().max())
    c = uniform_density(basis)
    return c + (eps / top) * xi / basis.area


def initial_coefficients(rho0: Any, basis: Basis) -> torch.Tensor:
    """Coefficients of ``rho0`` normalised to mass 1: ``rho0`` is ``"uniform"``, a callable ``x (M, d) -> rho (M,)``,
    the values ``(M,)`` at the basis grid, or coefficients ``(K,)``."""
    if isinstance(rho0, str):
        if rho0 != "uniform":
            raise InputError(f"unknown initial density {rho0!r}; pass 'uniform', a callable, values or coefficients")
        return uniform_density(basis)
    if callable(rho0) and not isinstance(rho0, (np.ndarray, torch.Tensor)):
        vals = to_tensor(rho0(basis.points.numpy()), dtype=torch.float64).reshape(-1)
        c = basis.analyse(vals)
    else:
        arr = to_tensor(rho0, dtype=torch.float64).reshape(-1)
        if arr.shape[0] == basis.points.shape[0]:
            c = basis.analyse(arr)
        elif arr.shape[0] == basis.n_coef:
            c = arr.clone()
        else:
            raise InputError(
                f"rho0 must hold {basis.points.shape[0]} grid values or {basis.n_coef} coefficients; got {arr.shape[0]}"
            )
    if not bool(torch.isfinite(c).all()):
        raise InputError("the initial density rho0 contains NaN or inf")
    mass = float(c[0]) * math.sqrt(basis.area)
    if not mass > 0:
        raise InputError(f"the initial density rho0 must have positive mass; its integral is {mass:.3g}")
    c = c / mass
    if float(basis.values(c).min()) <= 0:
        raise InputError("the initial density rho0 must be positive on the grid (raise lmax or smooth rho0)")
    return c


class _Field:
    """``c -> dc/dt`` at time ``t`` for one model and one weight realisation, plus the diagnostics."""

    def __init__(self, basis: Basis, model: str, w: torch.Tensor, options: KernelOptions):
        self.basis, self.model, self.w, self.options = basis, model, w, options

    def stats(self, c: torch.Tensor, heads: Heads) -> tuple[torch.Tensor, torch.Tensor, FieldStats]:
        """``(a, v, stats of A)``: grid masses, the field at the grid, the ``A``-only kernel statistics."""
        b = self.basis
        a = b.q * b.values(c)
        if heads.V is None:
            v_st = a_st = field_stats(b.points, heads, a, self.w, options=self.options)
        else:  # one pass with identity values gives both outputs (values are linear for plain heads)
            means = field_stats(b.points, identity_values(heads), a, self.w, options=self.options)
            v_st, a_st = split_means(means, heads)
        return a, project_tangent(b.points, v_st.mixed_output(self.model)), a_st

    def rate(self, c: torch.Tensor, heads: Heads) -> torch.Tensor:
        a, v, _ = self.stats(c, heads)
        return torch.einsum("i,id,idk->k", a, v, self.basis.G)

    def diagnostics(self, c: torch.Tensor, heads: Heads) -> tuple[float, float, float]:
        """``(F, |dF|^2, |mu'|^2)`` at ``c``: energy, squared slope, squared metric speed of the model's field."""
        a, v, st = self.stats(c, heads)
        F = float(st.energy(a))
        v_gf = st.velocity(self.basis.points, "gf")
        slope_sq = float((a * st.inverse_mobility() * (v_gf * v_gf).sum(-1)).sum())
        return F, slope_sq, float(st.speed_sq(v, a))

    def energy(self, c: torch.Tensor, heads: Heads) -> float:
        a = self.basis.q * self.basis.values(c)
        return float(field_stats(self.basis.points, heads, a, self.w, values=False, options=self.options).energy(a))


def _resolution(basis: Basis, c: torch.Tensor, tail_tol: float) -> tuple[float, float]:
    """``(tail fraction, min rho on the grid)``: the share of ``sum c_k^2`` above degree ``2 lmax / 3``."""
    cut = (2 * basis.lmax) // 3
    sq = c * c
    tail = float(sq[basis.degree > cut].sum() / sq.sum())
    return tail, float(basis.values(c).min())


def solve_pde(
    rho0: Any,
    weights: WeightProcess | ArrayLike | Heads | Callable,
    *,
    model: str = "gf",
    t_end: float,
    dt: float,
    lmax: int = 32,
    d: int | None = None,
    head_weights: ArrayLike | None = None,
    seed: int | None = None,
    save_every: int = 1,
    tail_tol: float = 1e-8,
    oversample: float = 1.5,
    backend: str = "flash",
    basis: Basis | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> PDESolution:
    """Solve ``d/dt rho + div_S(rho v_t[rho]) = 0`` on ``[0, t_end]`` on the circle (``d = 2``) or ``S^2`` (``d = 3``).

    ``rho0``: ``"uniform"``, a callable ``x (M, d) -> rho(x)``, grid values or coefficients
    (normalised to mass 1). ``weights``: a weight process of :mod:`attnflow.weights` (evaluated at each
    Runge-Kutta stage time), a constant ``(H, d, d)`` array, :class:`Heads` or a callable
    ``t -> A``; ``head_weights`` the masses ``w_h``; ``seed`` drives stochastic weights. ``lmax``:
    the highest Fourier frequency / spherical-harmonic degree. ``tail_tol``: the largest share of
    ``sum_k c_k^2`` allowed above degree ``2 lmax / 3`` before the solver refuses to continue.

    Returns a :class:`PDESolution`. Raises :class:`ResolutionExceeded` (a
    :class:`~attnflow.core.errors.NumericalError`) once the density is no longer resolved.
    """
    if model not in MODELS:
        raise InputError(f"unknown model {model!r}; choose one of {MODELS}")
    for name, val in (("t_end", t_end), ("dt", dt)):
        if not (isinstance(val, (int, float)) and math.isfinite(val) and val > 0):
            raise InputError(f"{name} must be a positive finite number; got {val!r}")
    if not (isinstance(save_every, int) and save_every >= 1):
        raise InputError(f"save_every must be a positive integer; got {save_every!r}")
    if not (0 < tail_tol < 1):
        raise InputError(f"tail_tol must be in (0, 1); got {tail_tol!r}")
    if backend not in BACKENDS:
        raise InputError(f"unknown backend {backend!r}; choose one of {BACKENDS}")
    process = as_process(weights)
    dim = d if d is not None else process.d
    if dim != process.d:
        raise InputError(f"the weights act on d = {process.d} but d = {dim} was asked for")
    b = basis if basis is not None else make_basis(lmax, dim, oversample=oversample)
    if b.d != process.d:
        raise InputError(f"the basis lives in d = {b.d} but the weights act on d = {process.d}")
    sampler = process.sampler(seed)
    H = process.H
    if head_weights is None:
        w = torch.full((H,), 1.0 / H, dtype=torch.float64)
    else:
        w = to_tensor(head_weights, dtype=torch.float64).reshape(-1)
        if w.shape != (H,) or not bool((w > 0).all()) or abs(float(w.sum()) - 1) > 1e-9:
            raise InputError(f"head_weights must be {H} positive numbers summing to 1")
    c = initial_coefficients(rho0, b)
    fld = _Field(b, model, w, KernelOptions(backend))

    def heads_at(t: float) -> Heads:
        return sampler(t).to(dtype=torch.float64)

    h0 = heads_at(0.0)
    check_model(model, h0)
    n = max(1, int(math.ceil(t_end / dt - 1e-9)))
    h = t_end / n
    saved: dict[str, list] = {k: [] for k in ("t", "coef", "energy", "slope", "speed", "mass", "tail", "min_density")}
    steps: dict[str, list] = {k: [] for k in ("t", "energy_change", "weight_work", "speed_action", "slope_action")}

    def save(t: float, c: torch.Tensor, diag: tuple[float, float, float], res: tuple[float, float]) -> None:
        saved["t"].append(t)
        saved["coef"].append(c.numpy().copy())
        saved["energy"].append(diag[0])
        saved["slope"].append(math.sqrt(max(diag[1], 0.0)))
        saved["speed"].append(math.sqrt(max(diag[2], 0.0)))
        saved["mass"].append(float(c[0]) * math.sqrt(b.area))
        saved["tail"].append(res[0])
        saved["min_density"].append(res[1])

    def solution() -> PDESolution:
        arr = {k: np.asarray(v, dtype=np.float64) for k, v in saved.items()}
        return PDESolution(
            basis=b,
            model=model,
            dt=h,
            steps={k: np.asarray(v, dtype=np.float64) for k, v in steps.items()},
            info={"lmax": b.lmax, "grid_points": int(b.points.shape[0]), "tail_tol": tail_tol, "steps": n},
            **arr,
        )

    diag = fld.diagnostics(c, h0)
    save(0.0, c, diag, _resolution(b, c, tail_tol))
    t = 0.0
    for k in range(n):
        heads_k = heads_at(t)
        stage_heads = {t: heads_k}  # the heads at each stage time, sampled once a step

        def rate(s: float, y: torch.Tensor, at: dict[float, Heads] = stage_heads) -> torch.Tensor:
            if s not in at:
                at[s] = heads_at(s)
            return fld.rate(y, at[s])

        c_new = explicit_rk_step(rate, t, c, h, RK4_TABLEAU)
        h1 = stage_heads[t + h]
        c_new[0] = c[0]  # grad Y_0 = 0: the mass mode does not move (kept bit-exact)
        t_new = (k + 1) * h
        res = _resolution(b, c_new, tail_tol)
        if not (math.isfinite(res[0]) and res[0] <= tail_tol and res[1] > 0):
            why = (
                f"the density became non-positive on the grid (min rho = {res[1]:.3g})"
                if res[1] <= 0 or not math.isfinite(res[1])
                else f"{res[0]:.2g} of its spectral energy sits above degree {(2 * b.lmax) // 3} "
                f"(more than tail_tol = {tail_tol:g})"
            )
            raise ResolutionExceeded(
                f"the PDE solution is no longer resolved at t = {t_new:.4g} with lmax = {b.lmax}: {why}; "
                "the density has concentrated, so raise lmax or stop earlier (particles resolve clusters).",
                solution(),
            )
        diag_new = fld.diagnostics(c_new, h1)
        if model == "gf":
            # The weights' work int dF/dr dr over the step, by the trapezoid rule in the state: the
            # exact increments at rho_{k+1} and at rho_k averaged (one-sided would be first order only).
            work = (
                0.5 * (diag_new[0] - fld.energy(c_new, heads_k) + fld.energy(c, h1) - diag[0])
                if h1 is not heads_k
                else 0.0
            )
            steps["t"].append(t_new)
            steps["energy_change"].append(diag_new[0] - diag[0])
            steps["weight_work"].append(work)
            steps["speed_action"].append(0.5 * h * (diag[2] + diag_new[2]))
            steps["slope_action"].append(0.5 * h * (diag[1] + diag_new[1]))
        c, diag, t = c_new, diag_new, t_new
        if (k + 1) % save_every == 0 or k + 1 == n:
            save(t, c, diag, res)
        if progress is not None:
            progress(k + 1, n)
    return solution()
