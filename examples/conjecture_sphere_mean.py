"""A conjecture file: ``attnflow reproduce examples/conjecture_sphere_mean.py --random-sets 4``.

The claim: the mean ``m`` of ``N`` independent uniform points on the sphere ``S^(d-1)`` has
``E |m|^2 = 1/N`` exactly (each point has norm 1 and mean 0), so ``N E|m|^2 = 1`` and ``E|m|^2 ~ N^-1``.
The control, where the claim must not hold: points drawn from a cap (a cloud with a mean direction),
whose ``|m|^2`` tends to a positive constant (exponent 0) and whose ``N E|m|^2`` grows with ``N``.
Each prediction is checked by one criterion on both cases; it passes only when the control fails.
"""

from __future__ import annotations

import numpy as np

from attnflow.verdicts import Choice, Estimate, Exponent, Prediction, Space, Uniform, Within, experiment, fit_exponent

NS = np.array([16, 64, 256, 1024])  # four sizes: an exponent needs three points at least
REPS = 200  # independent clouds per size


def cloud(rng: np.random.Generator, n: int, d: int, spread: float | None) -> np.ndarray:
    """``n`` points on ``S^(d-1)``: uniform (``spread`` None) or around the first axis with that spread."""
    x = rng.standard_normal((n, d))
    if spread is not None:
        x = spread * x
        x[:, 0] += 1.0
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def mean_sq(rng: np.random.Generator, n: int, d: int, spread: float | None) -> tuple[float, float]:
    """``E |m|^2`` over :data:`REPS` clouds of ``n`` points, and its standard error."""
    v = np.array([np.sum(cloud(rng, n, d, spread).mean(axis=0) ** 2) for _ in range(REPS)])
    return float(v.mean()), float(v.std(ddof=1) / np.sqrt(REPS))


@experiment("sphere-mean", space=Space(d=Choice([2, 3, 5, 8]), spread=Uniform(0.3, 1.0)), seeds=1)
def claim(params: dict, seed: int) -> list[Prediction]:
    """The squared mean of N uniform points on the sphere is 1/N; a cap's is not."""
    rng = np.random.default_rng(seed)
    d, spread = int(params["d"]), float(params["spread"])
    uni = np.array([mean_sq(rng, int(n), d, None) for n in NS])
    cap = np.array([mean_sq(rng, int(n), d, spread) for n in NS])
    big = NS[-1]
    return [
        Prediction(
            "E|m|^2 falls like 1/N",
            fit_exponent(NS, uni[:, 0], uni[:, 1]),
            fit_exponent(NS, cap[:, 0], cap[:, 1]),
            Exponent(-1, competitor=0),
        ),
        Prediction(
            f"N E|m|^2 = 1 at N = {big}",
            Estimate(big * uni[-1, 0], big * uni[-1, 1]),
            Estimate(big * cap[-1, 0], big * cap[-1, 1]),
            Within(1.0, 0.5),
        ),
    ]
