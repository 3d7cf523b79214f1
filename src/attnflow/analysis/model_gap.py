"""The gap between the gradient-flow model ``gf`` and real multi-head attention ``mha``, measured.

For ``H = 1`` the two fields coincide (``V = A``). For ``H > 1`` they weigh the heads differently:
``mha`` averages the heads' softmax outputs with the head masses ``w_h``, ``gf`` with
``w_h Z_h(x) / sum_g w_g Z_g(x)`` (the harmonic-mean mobility, docs/model.md), so the theory's
statements, proven for ``gf``, transfer to ``mha`` only as far as this gap allows.

* :func:`field_gap`: the relative field difference ``||v_gf - v_mha||_a / ||v_gf||_a`` at one state
  (``||v||_a^2 = sum_i a_i |v(x_i)|^2``), for the same heads (``V_h = A_h``);
* :func:`trajectory_gap`: the distance between a ``gf`` and an ``mha`` trajectory from the same tokens
  and heads, at their common saved times: ``W_2`` on the sphere and the largest angle between the same
  token in the two runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from attnflow.analysis.distances import wasserstein_sphere
from attnflow.core.arrays import ArrayLike
from attnflow.core.errors import InputError
from attnflow.core.heads import Heads
from attnflow.core.trajectory import Trajectory
from attnflow.dynamics.fields import field_stats, prepare


def field_gap(
    x: ArrayLike,
    A: ArrayLike | Heads,
    *,
    token_weights: ArrayLike | None = None,
    head_weights: ArrayLike | None = None,
) -> float:
    """``||v_gf - v_mha||_a / ||v_gf||_a`` at tokens ``x`` ``(N, d)`` for heads ``A`` ``(H, d, d)`` with ``V = A``.

    0 for one head (the models coincide); ``nan`` where the ``gf`` field vanishes.
    """
    xt, heads, a, w = prepare(x, A, None, token_weights, head_weights)
    heads.check_gradient_flow()
    st = field_stats(xt, heads, a, w)
    v_gf, v_mha = st.velocity(xt, "gf"), st.velocity(xt, "mha")
    norm = lambda v: float(torch.sqrt((a * (v * v).sum(-1)).sum()))
    ref = norm(v_gf)
    return norm(v_gf - v_mha) / ref if ref > 0 else float("nan")


@dataclass(frozen=True)
class TrajectoryGap:
    """``gf`` against ``mha`` at the saved times ``t``: ``w2`` (on the sphere) and ``max_angle`` (degrees,
    the largest angle between a token in one run and the same token in the other)."""

    t: np.ndarray
    w2: np.ndarray
    max_angle: np.ndarray

    @property
    def final_w2(self) -> float:
        return float(self.w2[-1])

    @property
    def largest_angle(self) -> float:
        return float(self.max_angle.max())


def trajectory_gap(gf: Trajectory, mha: Trajectory) -> TrajectoryGap:
    """Distance between two trajectories from the same tokens and heads, run with models ``gf`` and ``mha``
    at the same saved times (a longer ``gf`` run over a shorter one's span: ``gf.first(len(mha.t))``)."""
    if getattr(gf, "model", "gf") != "gf" or getattr(mha, "model", "mha") != "mha":
        raise InputError(
            f"trajectory_gap compares a 'gf' run with an 'mha' run; got models {getattr(gf, 'model', '?')!r} and "
            f"{getattr(mha, 'model', '?')!r}"
        )
    if gf.x.shape != mha.x.shape or not np.allclose(gf.t, mha.t):
        raise InputError(
            f"the two runs must share their saved times and shapes; got {gf.x.shape} at {len(gf.t)} times and "
            f"{mha.x.shape} at {len(mha.t)} times"
        )
    a = np.asarray(gf.token_weights, dtype=np.float64)
    w2 = np.array([wasserstein_sphere(gf.x[k], mha.x[k], a=a, b=a).value for k in range(len(gf.t))])
    cos = np.clip(np.einsum("snd,snd->sn", gf.x, mha.x), -1.0, 1.0)
    return TrajectoryGap(np.asarray(gf.t, float), w2, np.degrees(np.arccos(cos)).max(axis=1))
