"""Explicit Runge-Kutta steppers on the sphere, each followed by the retraction ``x / |x|``.

The field ``v(x) = P_x u(x)`` extends smoothly off the sphere and leaves it invariant
(``d|x|^2/dt = 2 (1 - |x|^2) x.u``), so a Runge-Kutta step in ``R^d`` followed by the metric
projection keeps the method's classical order (Hairer, Lubich & Wanner, GNI IV.4). The stage
times are passed to the field so that the weights are evaluated, or for SDE weights sampled, on
the same grid: ``t``, ``t + dt/2``, ``t + dt``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from attnflow.core.geometry import retract
from attnflow.core.heads import Heads
from attnflow.kernels.dispatch import KernelOptions
from attnflow.schemes.jko import jko_field_step


class Field(Protocol):
    """What a stepper is given: the field ``v_t(x)`` plus what defines it (for implicit schemes)."""

    # Read-only members, so that frozen dataclasses qualify too.
    @property
    def model(self) -> str: ...

    @property
    def a(self) -> torch.Tensor:
        """Token masses ``(N,)``."""

    @property
    def w(self) -> torch.Tensor:
        """Head masses ``(H,)``."""

    @property
    def options(self) -> KernelOptions | None:
        """How the kernel evaluates the field (``None``: the defaults)."""

    def __call__(self, t: float, x: torch.Tensor) -> torch.Tensor: ...

    def heads_at(self, t: float) -> Heads: ...


@dataclass(frozen=True)
class Integrator:
    """A stepper: ``name``, its classical ``order`` and ``step(f, t, x, dt) -> x_next``.

    ``weights`` are the Runge-Kutta weights ``b_s`` of the field evaluations in the order the step
    makes them (``None`` for schemes that do not evaluate the field, such as ``jko``): the same
    weights integrate any scalar along the step at the scheme's order (see :mod:`attnflow.edi`).
    """

    name: str
    order: int
    step: Callable[[Field, float, torch.Tensor, float], torch.Tensor]
    weights: tuple[float, ...] | None = None


def _euler(f: Field, t: float, x: torch.Tensor, dt: float) -> torch.Tensor:
    return retract(x + dt * f(t, x))


def _heun(f: Field, t: float, x: torch.Tensor, dt: float) -> torch.Tensor:
    k1 = f(t, x)
    k2 = f(t + dt, x + dt * k1)
    return retract(x + 0.5 * dt * (k1 + k2))


def _rk4(f: Field, t: float, x: torch.Tensor, dt: float) -> torch.Tensor:
    k1 = f(t, x)
    k2 = f(t + 0.5 * dt, x + 0.5 * dt * k1)
    k3 = f(t + 0.5 * dt, x + 0.5 * dt * k2)
    k4 = f(t + dt, x + dt * k3)
    return retract(x + (dt / 6.0) * (k1 + 2.0 * k2 + 2.0 * k3 + k4))


def _jko(f: Field, t: float, x: torch.Tensor, dt: float) -> torch.Tensor:
    # Imported here: the minimising movement needs autograd machinery the explicit schemes do not.
    return jko_field_step(f, t, x, dt)


INTEGRATORS: dict[str, Integrator] = {
    "euler": Integrator("euler", 1, _euler, (1.0,)),
    "heun": Integrator("heun", 2, _heun, (0.5, 0.5)),
    "rk4": Integrator("rk4", 4, _rk4, (1.0 / 6.0, 1.0 / 3.0, 1.0 / 3.0, 1.0 / 6.0)),
}

#: Implicit steppers (model ``gf`` only), kept apart from the explicit schemes above.
MOVEMENTS: dict[str, Integrator] = {"jko": Integrator("jko", 1, _jko)}


def get_integrator(method: str) -> Integrator:
    try:
        return INTEGRATORS[method] if method in INTEGRATORS else MOVEMENTS[method]
    except KeyError:
        raise ValueError(
            f"unknown method {method!r}; choose one of {sorted(INTEGRATORS) + sorted(MOVEMENTS)}"
        ) from None
