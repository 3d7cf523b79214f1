"""Long-time behaviour: is the weight path integrable, and is a limit point stationary?

* :func:`weight_path_length`: the discrete length ``int |Theta'_t| dt`` of the head measure, for the
  sampled heads and, where the law of the process is known in closed form, for the law.
  The metric on head measures is Wasserstein-2 on matrices (Frobenius norm), heads kept by label:
  ``|Theta_{t_{k+1}} - Theta_{t_k}| = (sum_h w_h ||A_h(t_{k+1}) - A_h(t_k)||_F^2)^{1/2}`` (an upper
  bound for the unlabelled measure). A length that levels off marks the integrable regime (the
  theory's limit points are then stationary); one that grows linearly, the non-integrable regime.
* :func:`stationarity`: the slope ``|dF|(mu, Theta_inf)`` of the limiting energy at a state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from scipy.integrate import quad

from attnflow.config import build, parse_config
from attnflow.core.arrays import ArrayLike, to_tensor
from attnflow.dynamics.fields import FieldStats, field_stats, masses, prepare
from attnflow.dynamics.infinite import GaussianHeads
from attnflow.weights.processes import Constant, Layers, OrnsteinUhlenbeck, Oscillating, WeightProcess


@dataclass(frozen=True)
class PathLength:
    """``int_0^t |Theta'_s| ds`` at the trajectory's saved times, for the samples and the law."""

    t: np.ndarray
    sampled: np.ndarray  # cumulative length of the sampled heads (piecewise geodesic between saves)
    law: np.ndarray | None  # cumulative length of the law of Theta_t, where known
    law_total: float | None  # int_0^inf |Theta'_t| dt of the law (inf for non-integrable processes)
    process: str

    @property
    def total(self) -> float:
        return float(self.sampled[-1])


def _ou_law_speed(p: OrnsteinUhlenbeck, w: np.ndarray, t: float) -> float:
    # Theta_t = A_bar + e^{-rt}(A0 - A_bar) + c_t S; for such Gaussians the W2 metric speed is
    # (|m'|_F^2 + c_t'^2 E|S|_F^2)^{1/2} with E|S|_F^2 = d(d+1)/2 (symmetric) or d^2.
    r, s, d = p.rate, p.sigma, p.d
    trS = d * (d + 1) / 2 if p.symmetric else d * d
    dm2 = (r * math.exp(-r * t)) ** 2 * ((p.A0 - p.A_bar) ** 2).sum(axis=(1, 2))
    if r == 0.0:
        dc = s / (2.0 * math.sqrt(t)) if t > 0 else math.inf
    else:
        one = -math.expm1(-2.0 * r * t)
        dc = s * r * math.exp(-2.0 * r * t) / math.sqrt(2.0 * r * one) if one > 0 else math.inf
    return math.sqrt(float((w * (dm2 + dc**2 * trS)).sum()))


def _law_speed(process: WeightProcess, w: np.ndarray):
    """``t -> |Theta'_t|`` of the law, and the length to infinity, or ``None`` if unknown."""
    if isinstance(process, Constant):
        return (lambda t: 0.0), 0.0
    if isinstance(process, Oscillating):

        def speed(t: float) -> float:
            dA = process.derivative(t).numpy()
            return math.sqrt(float((w * (dA**2).sum(axis=(1, 2))).sum()))

        nonzero = bool(np.any(process.C != 0) and np.any(process.omega != 0))
        return speed, (math.inf if nonzero else 0.0)
    if isinstance(process, OrnsteinUhlenbeck):
        speed = lambda t: _ou_law_speed(process, w, t)
        if process.rate == 0.0:
            return speed, (math.inf if process.sigma > 0 else 0.0)
        # Mean part and noise part are both integrable (exponential decay); quad handles the t^{-1/2} at 0.
        total = quad(speed, 0.0, math.inf, limit=200)[0]
        return speed, total
    return None


def weight_path_length(trajectory, process: WeightProcess | None = None) -> PathLength:
    """Discrete ``int_0^t |Theta'_s| ds`` along a trajectory's saved heads, and for the law of ``Theta_t``.

    ``process``: the weight process the run used; by default rebuilt from ``trajectory.config`` (runs
    made by :func:`attnflow.runs.run_config` or ``attnflow run``). The law is known for constant,
    oscillating (deterministic paths) and OU processes (Gaussian laws, whose length to infinity is
    finite: the integrable regime). Sampled OU paths are rough: their discrete length grows like
    ``dt^{-1/2}`` as the save step shrinks, which is why the law is the quantity to read.
    """
    A = np.asarray(trajectory.A, dtype=np.float64)
    w = np.asarray(trajectory.head_weights, dtype=np.float64)
    t = np.asarray(trajectory.t, dtype=np.float64)
    inc = np.sqrt((w[None] * ((A[1:] - A[:-1]) ** 2).sum(axis=(2, 3))).sum(axis=1))
    sampled = np.concatenate([[0.0], np.cumsum(inc)])
    if process is None and trajectory.config:
        _, process, _ = build(parse_config(trajectory.config, "of the trajectory"))
    law, law_total, name = None, None, "unknown"
    if process is not None:
        name = type(process).__name__
        known = _law_speed(process, w)
        if known is None and isinstance(process, Layers):
            law, law_total = sampled.copy(), float(sampled[-1])
        elif known is not None:
            speed, law_total = known
            pieces = [quad(speed, t[k], t[k + 1], limit=100)[0] for k in range(len(t) - 1)]
            law = np.concatenate([[0.0], np.cumsum(pieces)])
    return PathLength(t=t, sampled=sampled, law=law, law_total=law_total, process=name)


@dataclass(frozen=True)
class Stationarity:
    """The slope of the limiting energy at a state: ``slope`` ``|dF|(mu, Theta_inf)`` and
    ``relative`` = ``slope / (sum_i a_i b(x_i) |grad_i|^2)^{1/2}`` (tangent part of the Euclidean
    gradient; 0 at a stationary point, 1 when the whole gradient is tangent)."""

    slope: float
    relative: float
    per_token: np.ndarray  # |v(x_i)| = b |g(x_i)|, the speed each token would have


def stationarity(
    x: ArrayLike, A_inf, *, token_weights: ArrayLike | None = None, head_weights: ArrayLike | None = None
) -> Stationarity:
    """``|dF|(mu, Theta_inf) = (sum_i a_i b(x_i) |g(x_i)|^2)^{1/2}``: zero at a stationary point.

    ``A_inf``: finite heads ``(H, d, d)`` (or :class:`Heads`) or an infinite-head law
    (:class:`attnflow.dynamics.infinite.GaussianHeads`, e.g. ``GaussianOU(...).stationary()``).
    """
    st: FieldStats
    if isinstance(A_inf, GaussianHeads):
        xt = to_tensor(x)
        a = masses(token_weights, xt.shape[0], "token_weights", xt)
        st = A_inf.law_stats(xt, a)
    else:
        xt, heads, a, w = prepare(x, A_inf, None, token_weights, head_weights, energy_only=True)
        heads.check_gradient_flow()
        st = field_stats(xt, heads, a, w)
    u = st.mixed_output("gf")
    v = st.velocity(xt, "gf")
    slope = torch.sqrt(st.speed_sq(v, a))  # |dF| = ||v_gf||_mu
    full = torch.sqrt(st.speed_sq(u, a))  # |grad| in the mobility metric: b |S u|^2 = |u|^2 / b
    return Stationarity(
        slope=float(slope),
        relative=float(slope / full) if float(full) > 0 else 0.0,
        per_token=torch.linalg.vector_norm(v, dim=-1).detach().cpu().numpy(),
    )
