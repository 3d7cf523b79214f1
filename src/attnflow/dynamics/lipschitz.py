"""Lipschitz constants of the particle fields, for the Gronwall estimate of docs/model.md.

For ``X = (x_1, ..., x_N)`` with the norm ``||X||_a = (sum_i a_i |x_i|^2)^{1/2}`` and heads with
``||A_h||_op <= alpha``, ``||V_h||_op <= nu``, one softmax head moves ``u_i = sum_j p_ij V x_j`` by

``|du_i| <= 2 nu alpha |dx_i| + nu (1 + 2 alpha) sum_j p_ij |dx_j|``  (softmax derivative, ``|V x_j - u_i| <= 2 nu``)

and ``p_ij <= a_j e^{2 alpha}`` on the sphere, so ``sum_j p_ij |dx_j| <= e^{2 alpha} ||dX||_a``; the
projection adds ``2 |u| |dx_i| <= 2 nu |dx_i|``. Hence

* ``mha``: ``L = nu (2 (1 + alpha) + (1 + 2 alpha) e^{2 alpha})``;
* ``gf`` (the head mixture ``w_h Z_h / sum w Z`` moves too, by ``2 nu alpha (|dx_i| + e^{2 alpha} ||dX||_a)``):
  ``L = nu (2 (1 + 2 alpha) + (1 + 4 alpha) e^{2 alpha})`` with ``nu = alpha`` when ``V = A``;

and two solutions satisfy ``||X_t - Y_t||_a <= exp(int_0^t L) ||X_0 - Y_0||_a``, the particle form of
``W_2(mu_t, nu_t) <= exp(L t) W_2(mu_0, nu_0)``. The bound is crude (exponential in ``alpha``) but
rigorous; ``attnflow reproduce stability-input`` reports how far the measured growth stays below it.
"""

from __future__ import annotations

import math

import numpy as np

from attnflow.core.arrays import ArrayLike
from attnflow.core.errors import InputError
from attnflow.core.heads import Heads, as_heads
from attnflow.core.trajectory import Trajectory


def lipschitz_bound(A: ArrayLike | Heads, V: ArrayLike | None = None, *, model: str = "gf") -> float:
    """``L`` above for heads ``A`` ``(H, d, d)`` (or :class:`Heads`) and values ``V`` (``None``: ``V = A``)."""
    heads: Heads = as_heads(A, V)
    alpha = float(np.linalg.norm(heads.A.detach().cpu().numpy(), ord=2, axis=(1, 2)).max())
    nu = float(np.linalg.norm(heads.values.detach().cpu().numpy(), ord=2, axis=(1, 2)).max())
    e = math.exp(2.0 * alpha)
    if model == "mha":
        return nu * (2.0 * (1.0 + alpha) + (1.0 + 2.0 * alpha) * e)
    if model == "gf":
        return nu * (2.0 * (1.0 + 2.0 * alpha) + (1.0 + 4.0 * alpha) * e)
    raise InputError(f"lipschitz_bound covers models 'mha' and 'gf'; got {model!r}")


def gronwall_exponent(trajectory: Trajectory) -> np.ndarray:
    """``int_0^t L(s) ds`` at the saved times, ``L(s)`` from the saved heads (trapezoid rule).

    The Gronwall factor is its exponential; work with the exponent, which overflows far later.
    """
    L = np.array(
        [
            lipschitz_bound(trajectory.A[k], None if trajectory.V is None else trajectory.V[k], model=trajectory.model)
            for k in range(len(trajectory.t))
        ]
    )
    return np.concatenate([[0.0], np.cumsum(0.5 * (L[1:] + L[:-1]) * np.diff(trajectory.t))])
