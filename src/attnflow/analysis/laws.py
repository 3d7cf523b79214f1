"""The path length of a weight law ``int |Theta'_t| dt``, measured from sampled paths.

``paths`` independent weight paths (each head replicated ``paths / H`` times with independent noise), the
Bures-Wasserstein distance (:func:`bures_wasserstein`) between Gaussian fits of the empirical laws at
successive times (a lower bound of their ``W_2``, Gelbrich), summed (:func:`law_path_length`). The closed
form (the same distance between the exact moments) is a cross-check only.

Moved here from ``attnflow.experiments.relaxation`` (issue 42), which imports these names back.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from attnflow.weights.processes import OrnsteinUhlenbeck


def sym_vec(A: np.ndarray) -> np.ndarray:
    """Symmetric ``(..., d, d)`` -> ``(..., d(d+1)/2)`` with the Frobenius norm preserved."""
    d = A.shape[-1]
    iu = np.triu_indices(d, 1)
    return np.concatenate([np.diagonal(A, axis1=-2, axis2=-1), math.sqrt(2.0) * A[..., iu[0], iu[1]]], axis=-1)


def _psd_sqrt(S: np.ndarray) -> np.ndarray:
    w, U = np.linalg.eigh(0.5 * (S + S.T))
    return (U * np.sqrt(np.maximum(w, 0.0))) @ U.T


def bures_wasserstein(m1: np.ndarray, S1: np.ndarray, m2: np.ndarray, S2: np.ndarray) -> float:
    """``W_2`` between the Gaussians ``N(m1, S1)`` and ``N(m2, S2)`` (a lower bound of ``W_2`` of any laws
    with these moments, Gelbrich)."""
    r = _psd_sqrt(S1)
    cross = np.trace(_psd_sqrt(r @ S2 @ r))
    b2 = float(np.trace(S1) + np.trace(S2) - 2.0 * cross)
    return math.sqrt(max(float(((m1 - m2) ** 2).sum()) + b2, 0.0))


def _moments(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return v.mean(0), np.cov(v, rowvar=False)


def law_path_length(process, paths: int, step: float, t_end: float, seed: int) -> dict[str, np.ndarray]:
    """``int_0^t |Theta'_s| ds`` measured from ``paths`` sampled weight paths (and its closed form).

    Each of the process's ``H`` heads is replicated ``ceil(paths / H)`` times; OU replicas get
    independent noise. Returns the times, the cumulative sampled length and the cumulative closed
    form (Bures-Wasserstein between the exact moments on the same grid). ``sampled`` is the raw sum
    minus the same sum for a law at rest with the same number of samples (``null``): finite samples
    make the raw sum grow like ``t`` even for a law at rest.
    """
    H, d = process.H, process.d
    K = max(1, math.ceil(paths / H))
    ts = np.arange(0.0, t_end + 0.5 * step, step)
    sampled = [0.0]
    exact = [0.0]
    if isinstance(process, OrnsteinUhlenbeck):
        rep = lambda M: np.repeat(M, K, axis=0)
        big = OrnsteinUhlenbeck(rep(process.A_bar), process.rate, process.sigma, A0=rep(process.A0))
        sampler = big.sampler(seed)
        dim = d * (d + 1) // 2

        def sample(t: float) -> np.ndarray:
            sampler(t)
            return sym_vec(sampler.A)

        def exact_moments(t: float) -> tuple[np.ndarray, np.ndarray]:
            means = sym_vec(process.mean(t))
            c = process.transition_scale(t) if t > 0 else 0.0
            # Symmetric noise S = (G + G^T)/2 has identity covariance in these coordinates.
            return means.mean(0), np.cov(means, rowvar=False, bias=True) + c * c * np.eye(dim)
    else:

        def sample(t: float) -> np.ndarray:
            return np.repeat(sym_vec(process.A_at(t)), K, axis=0)

        def exact_moments(t: float) -> tuple[np.ndarray, np.ndarray]:
            v = sym_vec(process.A_at(t))
            return v.mean(0), np.cov(v, rowvar=False, bias=True)

    sample_rest: Callable[[float], np.ndarray] | None = None  # deterministic paths: the null length is 0
    if isinstance(process, OrnsteinUhlenbeck) and process.rate > 0:
        # The null: the same estimator on a law at rest (replicas started in the stationary law), whose
        # sampled length is the sampling noise of `paths` finite samples alone.
        c_inf = process.stationary_scale
        rest = OrnsteinUhlenbeck(
            big.A_bar, process.rate, process.sigma, A0=big.A_bar + c_inf * big.noise(np.random.default_rng(seed + 1))
        )
        rest_sampler = rest.sampler(seed + 2)

        def _sample_rest(t: float) -> np.ndarray:
            rest_sampler(t)
            return sym_vec(rest_sampler.A)

        sample_rest = _sample_rest
    null = [0.0]
    prev, prev_exact = _moments(sample(0.0)), exact_moments(0.0)
    prev_rest = _moments(sample_rest(0.0)) if sample_rest is not None else None
    for t in ts[1:]:
        cur, cur_exact = _moments(sample(float(t))), exact_moments(float(t))
        sampled.append(sampled[-1] + bures_wasserstein(*prev, *cur))
        exact.append(exact[-1] + bures_wasserstein(*prev_exact, *cur_exact))
        prev, prev_exact = cur, cur_exact
        if sample_rest is not None and prev_rest is not None:  # both set, or neither
            cur_rest = _moments(sample_rest(float(t)))
            null.append(null[-1] + bures_wasserstein(*prev_rest, *cur_rest))
            prev_rest = cur_rest
        else:
            null.append(0.0)
    raw, null_arr = np.array(sampled), np.array(null)
    return {
        "t": ts,
        "sampled": raw - null_arr,
        "raw": raw,
        "null": null_arr,
        "closed_form": np.array(exact),
        "paths": H * K,
    }


def length_at(law: dict[str, np.ndarray], T: float, key: str = "sampled") -> float:
    return float(np.interp(T, law["t"], law[key]))
