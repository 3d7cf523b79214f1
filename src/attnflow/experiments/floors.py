"""The finite-``H`` slope floor predicted per seed, and the run's own time scales.

Under OU weights the heads' empirical measure ``Theta^(H)_t`` keeps fluctuating around the stationary
law ``Theta_inf`` (its path has infinite length: docs/model.md), so the slope ``|dF|(mu_t, Theta_t)``
does not decay to zero but to a floor. At a cloud ``mu`` that is a stationary point of the limiting
energy, that floor is the central-limit constant of averaging ``H`` i.i.d. heads drawn from the
stationary law (docs/model.md, "What the numbers say"):

    floor(mu, H) = E |dF|^2(mu, Theta^(H)),   Theta^(H) = (1/H) sum_h delta_{A_h},  A_h ~ Abar_h + c S_h,

``c = sigma / sqrt(2 rate)``. :func:`predicted_floor` computes it by Monte Carlo over independent draws
of the ``H`` heads, with its standard error. For a single cluster under an isotropic mean
``Abar = beta I`` it has a closed form in the limit (:func:`single_cluster_constant`): with ``x`` the
cluster, ``x^T S x ~ N(0, 1)`` independent of the tangent part ``P_x S x`` (``E |P_x S x|^2 = (d-1)/2``),
so the Gaussian moment generating function gives
``H floor -> c^2 (d - 1) / 2 exp(beta + 3 c^2 / 2)`` as ``H -> inf``.

Time scales are the run's own (:mod:`attnflow.analysis.relaxation`, imported back here): :func:`relaxation_time` is the ``1/e`` time of the energy's approach
to its late level, and the late window starts :data:`WINDOW_TAUS` of them in (never before half the
run), so a window never depends on a parameter that can exceed the run.

Errors of time averages come from the series' own **integrated autocorrelation time**
(:func:`integrated_time`, Sokal's automatic windowing, as emcee's ``integrated_time``;
:func:`correlated_means` pools the autocovariance over series of one law), not from batch means,
which underestimate the error when a batch is no longer than the correlation time. An estimate from
fewer than :data:`MIN_TAUS` ``tau_int`` is not trusted.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from attnflow.analysis.relaxation import (  # noqa: F401  (their home since issue 42)
    MIN_WINDOW_TAUS,
    WINDOW_TAUS,
    Window,
    late_window,
    relaxation_time,
)
from attnflow.dynamics.fields import masses
from attnflow.solve.ensemble import EnsembleField
from attnflow.verdicts.stats import (  # noqa: F401  (their home; imported back for the experiments)
    AUTO_WINDOW_C,
    BATCHES,
    MIN_TAUS,
    CorrelatedMeans,
    correlated_means,
    integrated_time,
    time_average,
)
from attnflow.weights.processes import Constant

#: Heads per chunk of the Monte Carlo draws (bounds the memory of one batched kernel pass).
DRAW_CHUNK = 32


def slopes_sq(x: np.ndarray, A: np.ndarray) -> np.ndarray:
    """``|dF|^2(mu, Theta_r)`` of one cloud ``x`` ``(N, d)`` under ``R`` head sets ``A`` ``(R, H, d, d)``
    (uniform token and head masses, model ``gf``), in one batched kernel pass."""
    R, H = A.shape[0], A.shape[1]
    X = torch.from_numpy(np.repeat(np.asarray(x, dtype=np.float64)[None], R, axis=0))
    a = masses(None, x.shape[0], "token_weights", X)
    w = masses(None, H, "head_weights", X)
    samplers = [Constant(A[r]).sampler() for r in range(R)]
    f = EnsembleField("gf", samplers, np.ones(R), a, w, X.dtype, X.device)
    st = f.stats(0.0, X)
    return torch.exp(2.0 * st.log_slope(X, a)).numpy()


def predicted_floor(
    x: np.ndarray, A_bar: np.ndarray, c: float, draws: int, seed: int, symmetric: bool = True
) -> tuple[float, float]:
    """``E |dF|^2(mu, Theta^(H))`` over ``draws`` independent draws of the ``H`` heads
    ``A_h = Abar_h + c S_h`` (``A_bar`` ``(H, d, d)``), and its Monte Carlo standard error."""
    rng = np.random.default_rng(seed)
    H, d = A_bar.shape[0], A_bar.shape[1]
    out = []
    per = max(1, DRAW_CHUNK * 16 // max(H, 1))
    done = 0
    while done < draws:
        r = min(per, draws - done)
        G = rng.standard_normal((r, H, d, d))
        S = 0.5 * (G + G.transpose(0, 1, 3, 2)) if symmetric else G
        out.append(slopes_sq(x, A_bar[None] + c * S))
        done += r
    v = np.concatenate(out)
    return float(v.mean()), float(v.std(ddof=1) / math.sqrt(len(v))) if len(v) > 1 else float("nan")


def single_cluster_constant(beta: float, c: float, d: int) -> float:
    """``lim_{H -> inf} H floor`` at a single cluster under heads ``beta I + c S``:
    ``c^2 (d - 1) / 2 exp(beta + 3 c^2 / 2)`` (module docstring)."""
    return c * c * (d - 1) / 2.0 * math.exp(beta + 1.5 * c * c)
