"""What a stepper is given: the :class:`Field` protocol (its own module, so that the steppers
:mod:`attnflow.schemes.integrators` registers, such as :mod:`attnflow.schemes.jko`, name it without
importing the registry: no import cycle, even for annotations)."""

from __future__ import annotations

from typing import Protocol

import torch

from attnflow.core.heads import Heads
from attnflow.kernels.dispatch import KernelOptions

__all__ = ["Field"]


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
