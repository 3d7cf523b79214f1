"""Minimising movements (JKO) of the ``gf`` energy on the sphere (docs/model.md, "Minimising movements").

One step from ``mu_k = sum_i a_i delta_{x_i}`` solves the particle problem

    y = argmin_{y_i in S^{d-1}}  F(sum_i a_i delta_{y_i}, t_k) + 1/(2 tau) sum_i a_i d(x_i, y_i)^2 / b_k(x_i)

with ``d`` the geodesic distance and the mobility ``b_k`` frozen at ``mu_k``. The unknowns are
parametrised as ``y = z / |z|`` (the sphere retraction), so L-BFGS on ``z`` with torch autograd is a
Riemannian quasi-Newton method. Convergence is measured in position units: the Riemannian
gradient turned into a displacement by the cost's curvature, ``max_i tau b_k(x_i) |P_{y_i} grad_{y_i}| / a_i``
(how far, roughly, ``y`` is from the minimiser); the objective is divided by ``|F(mu_k)|`` so that
the line search works at any ``beta``. The warm start is the better (by objective) of ``x`` and
one explicit Euler step, so the returned energy never exceeds ``F(mu_k)`` (the movement can only
lower ``F + cost``, and the cost is non-negative).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnflow.core.arrays import ArrayLike, like, to_tensor
from attnflow.core.errors import InputError
from attnflow.core.geometry import geodesic_distance_sq, project_tangent, retract
from attnflow.core.heads import Heads
from attnflow.dynamics.fields import field_stats, prepare
from attnflow.kernels.dispatch import KernelOptions
from attnflow.schemes.field import Field


def _energy_t(
    y: torch.Tensor, heads: Heads, a: torch.Tensor, w: torch.Tensor, options: KernelOptions | None = None
) -> torch.Tensor:
    """``F(sum_i a_i delta_{y_i})`` as a differentiable tensor (the heads' values are not used)."""
    return field_stats(y, heads.without_values(), a, w, values=False, options=options).energy(a)


@dataclass(frozen=True)
class JKOResult:
    """A solved minimising movement: the new tokens ``y``, the objective and the solver's report."""

    y: ArrayLike
    energy: float  # F(mu_{k+1}, t_k)
    objective: float  # F + cost
    iterations: int
    grad_norm: float  # Riemannian gradient at y as a displacement, max_i tau b_i |P grad_i| / a_i
    converged: bool
    tol: float
    max_iter: int


def _solve(
    x: torch.Tensor,
    heads: Heads,
    a: torch.Tensor,
    w: torch.Tensor,
    tau: float,
    tol: float,
    max_iter: int,
    y0: torch.Tensor | None,
    options: KernelOptions | None = None,
) -> tuple[torch.Tensor, float, float, int, float]:
    x = x.detach()
    with torch.no_grad():
        b = field_stats(x, heads.without_values(), a, w, values=False, options=options).mobility()
        weight = a / (2.0 * tau * b)

        scale = abs(float(_energy_t(x, heads, a, w, options)))
        to_position = (tau * b / a)[:, None] * scale  # per-token gradient -> displacement

    def objective(y: torch.Tensor) -> torch.Tensor:
        return (_energy_t(y, heads, a, w, options) + (weight * geodesic_distance_sq(x, y)).sum()) / scale

    with torch.no_grad():
        candidates = [x] if y0 is None else [retract(y0.detach())]
        if y0 is None:
            candidates.append(retract(x + tau * field_stats(x, heads, a, w, options=options).velocity(x, "gf")))
        start = min(candidates, key=lambda c: float(objective(c)))

    z = start.clone().requires_grad_(True)
    # The z-gradient is P_y grad / |z| with |z| ~ 1: scale the position tolerance back to it.
    opt = torch.optim.LBFGS(
        [z],
        lr=1.0,
        max_iter=max_iter,
        tolerance_grad=0.5 * tol / float(to_position.max()),
        tolerance_change=1e-20,
        history_size=20,
        line_search_fn="strong_wolfe",
    )

    def closure() -> torch.Tensor:
        opt.zero_grad()
        f = objective(retract(z))
        f.backward()
        return f

    opt.step(closure)
    y = retract(z.detach())
    yg = y.clone().requires_grad_(True)
    f = objective(yg)
    f.backward()
    assert yg.grad is not None
    rg = float((torch.linalg.vector_norm(to_position * project_tangent(y, yg.grad), dim=-1)).max())
    with torch.no_grad():
        E = float(_energy_t(y, heads, a, w, options))
    return y, E, float(f.detach()) * scale, int(opt.state[z].get("n_iter", 0)), rg


def jko_step(
    x: ArrayLike,
    A: ArrayLike | Heads,
    tau: float,
    *,
    token_weights: ArrayLike | None = None,
    head_weights: ArrayLike | None = None,
    tol: float = 1e-7,
    max_iter: int = 200,
    y0: ArrayLike | None = None,
) -> JKOResult:
    """One minimising movement ``argmin_y F(y) + 1/(2 tau) sum_i a_i d(x_i, y_i)^2 / b(x_i)``.

    ``x`` ``(N, d)`` tokens on the sphere; ``A`` ``(H, d, d)`` symmetric heads (or :class:`Heads`,
    ``V = A``) at the time ``t_k``; ``tau > 0`` the step. ``tol`` bounds ``grad_norm``, the Riemannian
    gradient at the answer expressed as a displacement (module docstring), ``max_iter`` the L-BFGS iterations; ``y0`` a warm start.
    Returns a :class:`JKOResult` whose ``y`` has the array type of ``x``.
    """
    if not tau > 0:
        raise InputError(f"tau must be positive; got {tau}")
    xt, heads, a, w = prepare(x, A, None, token_weights, head_weights, energy_only=True)
    heads.check_gradient_flow()
    y0t = None if y0 is None else to_tensor(y0, dtype=xt.dtype, device=xt.device)
    y, E, obj, it, rg = _solve(retract(xt), heads, a, w, float(tau), tol, int(max_iter), y0t)
    return JKOResult(
        y=like(y, x),
        energy=E,
        objective=obj,
        iterations=int(it),
        grad_norm=rg,
        converged=rg <= tol,
        tol=tol,
        max_iter=int(max_iter),
    )


def jko_field_step(
    f: Field, t: float, x: torch.Tensor, dt: float, *, tol: float = 1e-7, max_iter: int = 200
) -> torch.Tensor:
    """The ``jko`` stepper of :data:`attnflow.INTEGRATORS`: one movement with the heads at ``t``."""
    if f.model != "gf":
        raise InputError(f"method 'jko' minimises the gf energy; it needs model 'gf', not {f.model!r}")
    heads = f.heads_at(t)
    heads.check_gradient_flow()
    y, *_ = _solve(x, heads.without_values(), f.a, f.w, float(dt), tol, max_iter, None, f.options)
    return y
