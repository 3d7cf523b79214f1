"""Particles -> mean field: how far ``N`` tokens are from the PDE's density, and how fast that shrinks in ``N``.

Tokens are drawn i.i.d. from the PDE's initial density, moved by :func:`attnflow.simulate`, and
compared at fixed times with the PDE solution (the density is a weighted cloud on the quadrature
grid) by

* the maximum mean discrepancy :func:`mmd_sphere` with the kernel ``k(x, y) = exp(kappa (<x, y> - 1))``
  (characteristic on the sphere: every Funk-Hecke coefficient is positive). For i.i.d. samples
  ``E MMD^2 = (E k(x, x) - E k(x, y)) / N``: the rate stated beforehand is ``N^{-1/2}``;
* ``W_2`` for the geodesic cost (:func:`attnflow.analysis.distances.wasserstein_sphere`): on the
  circle ``N^{-1/2}``, on ``S^2`` ``(log N / N)^{1/2}`` (rate ``-1/2`` up to the logarithm).

:func:`meanfield_convergence` fits ``log distance = a + rate log N`` and a bootstrap CI over seeds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from attnflow.core.arrays import ArrayLike, to_numpy
from attnflow.core.errors import InputError
from attnflow.pde.basis import Basis, make_basis
from attnflow.pde.solver import PDESolution, perturbed_uniform, solve_pde
from attnflow.verdicts.stats import asymptotic_start, hierarchical_bootstrap, local_slopes, percentile_ci

#: The rates stated before measuring (the exponent of N); W2 on S^2 is corrected by :func:`expected_rate`.
EXPECTED_RATE = {"mmd": -0.5, "w2": -0.5}


def expected_rate(metric: str, d: int, Ns: np.ndarray) -> float:
    """The exponent stated beforehand: ``-1/2`` for the MMD and for ``W_2`` on the circle; for ``W_2`` on
    ``S^2`` the least-squares slope of ``log (log N / N)^{1/2}`` over the same ``Ns`` (the logarithm makes
    the local exponent ``-1/2 + 1/(2 log N)``)."""
    if metric == "w2" and d == 3:
        n = np.asarray(Ns, dtype=np.float64)
        return float(np.polyfit(np.log(n), 0.5 * np.log(np.log(n) / n), 1)[0])
    return EXPECTED_RATE[metric]


def _kernel_sum(X: torch.Tensor, a: torch.Tensor, Y: torch.Tensor, b: torch.Tensor, kappa: float) -> float:
    """``sum_ij a_i b_j exp(kappa (<x_i, y_j> - 1))``: on the circle by the kernel's Fourier series in ``O((N + M) K)``
    (:func:`~attnflow.kernels.fastsum.circle.circle_sums`, whose ``Z`` is scaled by ``e^{-kappa}`` already; exact to
    rounding, and what lets the self-term reach ``N = 1e5``), elsewhere in blocks (no ``N x M`` matrix at once)."""
    if X.shape[1] == 2:
        from attnflow.kernels.fastsum.circle import circle_sums

        return float(a @ circle_sums(X, Y, b, kappa)[0])
    total = 0.0
    step = max(1, 4_000_000 // max(Y.shape[0], 1))
    for i in range(0, X.shape[0], step):
        K = torch.exp(kappa * (X[i : i + step] @ Y.T - 1.0))
        total += float(a[i : i + step] @ K @ b)
    return total


def mmd_sphere(
    x: ArrayLike, y: ArrayLike, *, a: ArrayLike | None = None, b: ArrayLike | None = None, kappa: float = 4.0
) -> float:
    """``MMD(mu, nu)`` for ``k(x, y) = exp(kappa (<x, y> - 1))``: ``(a^T K_xx a - 2 a^T K_xy b + b^T K_yy b)^{1/2}``.

    ``x`` ``(N, d)``, ``y`` ``(M, d)`` on the sphere with masses ``a``, ``b`` (uniform by default).
    """
    if not (isinstance(kappa, (int, float)) and 0 < kappa < 1e4):
        raise InputError(f"kappa must be a positive number below 1e4; got {kappa!r}")
    X = torch.as_tensor(np.asarray(to_numpy(x), dtype=np.float64))
    Y = torch.as_tensor(np.asarray(to_numpy(y), dtype=np.float64))
    if X.ndim != 2 or Y.ndim != 2 or X.shape[1] != Y.shape[1]:
        raise InputError(f"x and y must be (N, d) and (M, d) clouds of one d; got {tuple(X.shape)}, {tuple(Y.shape)}")
    pa = torch.full((X.shape[0],), 1.0 / X.shape[0], dtype=torch.float64) if a is None else torch.as_tensor(a)
    pb = torch.full((Y.shape[0],), 1.0 / Y.shape[0], dtype=torch.float64) if b is None else torch.as_tensor(b)
    pa, pb = pa.to(torch.float64), pb.to(torch.float64)
    sq = _kernel_sum(X, pa, X, pa, kappa) - 2 * _kernel_sum(X, pa, Y, pb, kappa) + _kernel_sum(Y, pb, Y, pb, kappa)
    return math.sqrt(max(sq, 0.0))


def sample_density(basis: Basis, coef: torch.Tensor, n: int, seed: int | None = None) -> np.ndarray:
    """``n`` i.i.d. points from ``rho = sum_k c_k Y_k`` by rejection from the uniform law (bound: 1.1 max of ``rho``
    on a grid twice as fine, checked on every batch)."""
    from attnflow.core.tokens import uniform

    rng = np.random.default_rng(seed)
    fine = make_basis(basis.lmax, basis.d, oversample=3.0)
    bound = 1.1 * float(fine.values(coef).max())
    out: list[np.ndarray] = []
    got = 0
    while got < n:
        x = uniform(max(2 * (n - got), 64), basis.d, seed=int(rng.integers(2**63)))
        rho = (basis.eval_at(torch.from_numpy(x)) @ coef).numpy()
        if rho.max() > bound:
            bound = 1.1 * float(rho.max())  # a finer peak than the grid saw: restart with the higher bound
            out, got = [], 0
            continue
        keep = x[rng.uniform(0, bound, len(x)) < rho]
        out.append(keep)
        got += len(keep)
    return np.concatenate(out)[:n]


@dataclass(frozen=True)
class RateFit:
    """``log distance = a + rate log N`` fitted to the seed means over the asymptotic range, with a bootstrap
    CI over seeds.

    ``local``: the local slopes between successive ``N``; ``asymptotic_from``: the first ``N`` of the range
    where they stop drifting (:func:`attnflow.verdicts.stats.asymptotic_start`; ``None``: none found).
    With three ``N`` or more and no such range the data are **pre-asymptotic**: ``rate`` and ``ci`` are then
    the fit over every ``N``, for information only, and no rate is claimed."""

    rate: float
    ci: tuple[float, float]
    expected: float
    local: tuple[float, ...] = ()
    asymptotic_from: int | None = None
    checked: bool = False  # three N or more: the local slopes could be compared

    @property
    def pre_asymptotic(self) -> bool:
        """The local slopes drift over every range of three ``N`` or more: no rate is reported."""
        return self.checked and self.asymptotic_from is None

    @property
    def consistent(self) -> bool:
        """Whether the rate is asymptotic and the expected rate lies inside its CI."""
        return not self.pre_asymptotic and self.ci[0] <= self.expected <= self.ci[1]

    def describe(self) -> str:
        slopes = ", ".join(f"{v:+.2f}" for v in self.local)
        if self.pre_asymptotic:
            return (
                f"pre-asymptotic: the local slopes {slopes} drift beyond their bootstrap errors (fit over every N "
                f"{self.rate:+.3f} [{self.ci[0]:+.3f}, {self.ci[1]:+.3f}], not a rate)"
            )
        start = f" over N >= {self.asymptotic_from}" if self.asymptotic_from is not None else ""
        return (
            f"rate {self.rate:+.3f}{start} (95% CI [{self.ci[0]:+.3f}, {self.ci[1]:+.3f}], expected "
            f"{self.expected:+.2f}: {'inside' if self.consistent else 'OUTSIDE'}; local slopes {slopes})"
        )


@dataclass
class MeanFieldConvergence:
    """Distances between ``N``-particle runs and the PDE: ``values[metric]`` ``(len(Ns), seeds, len(times))``.
    :meth:`table` prints per ``N`` the seed mean of ``d`` and ``N`` times the seed mean of ``d^2`` (flat at the
    rate ``N^{-1/2}``), then the fit (:meth:`RateFit.describe`)."""

    Ns: np.ndarray
    times: np.ndarray
    values: dict[str, np.ndarray]
    fits: dict[str, list[RateFit]]  # one fit per time
    pde: PDESolution
    info: dict[str, Any] = field(default_factory=dict)

    def table(self) -> str:
        rows = []
        for metric, vals in self.values.items():
            for j, t in enumerate(self.times):
                fit = self.fits[metric][j]
                means = ", ".join(
                    f"N={int(n)}: {np.nanmean(vals[i, :, j]):.3g}"
                    for i, n in enumerate(self.Ns)
                    if np.isfinite(vals[i, :, j]).any()
                )
                # N E[d^2] is flat under the rate N^{-1/2}: its trend shows a slower rate (or an approach to it)
                # in the distances' own units, beside the local slopes
                scaled = ", ".join(
                    f"{n * np.nanmean(vals[i, :, j] ** 2):.3g}"
                    for i, n in enumerate(self.Ns)
                    if np.isfinite(vals[i, :, j]).any()
                )
                rows.append(f"{metric} at t={t:g}: {means}; N mean d^2: {scaled}; {fit.describe()}")
        return "\n".join(rows)


def fit_rate(Ns: np.ndarray, vals: np.ndarray, expected: float, *, n_boot: int = 2000, seed: int = 0) -> RateFit:
    """Least-squares slope of ``log mean_s d(N, s)`` against ``log N`` over the asymptotic range; CI: seeds
    resampled within each ``N`` (:func:`~attnflow.verdicts.stats.hierarchical_bootstrap`). The range starts
    where the local slopes stop drifting (:func:`~attnflow.verdicts.stats.asymptotic_start`, judged by the
    same bootstrap); with none, the fit is :attr:`RateFit.pre_asymptotic`."""
    ok = np.isfinite(vals).all(axis=1)
    Ns, vals = Ns[ok], vals[ok]
    if len(Ns) < 2:
        raise InputError("a rate needs distances at two values of N at least")
    lx = np.log(Ns)
    rng = np.random.default_rng(seed)
    means = vals.mean(axis=1)
    boots = hierarchical_bootstrap(list(vals), lambda g: [v.mean() for v in g], n_boot=n_boot, rng=rng)
    local = local_slopes(Ns, means)
    checked = len(Ns) >= 3
    # The bootstrap variance of a mean of S seeds is (S - 1) / S of its unbiased estimate: widen the local
    # slopes' replicates about their estimate by sqrt(S / (S - 1)), else 4 seeds call a clean N^-1/2 series
    # pre-asymptotic 12% of the time (4% with it, at the detector's 5% level; tests/pde/test_meanfield_rate_mmd.py).
    S = vals.shape[1]
    local_b = np.log(boots[:, 1:] / boots[:, :-1]) / np.diff(lx)
    local_b = local + (local_b - local) * math.sqrt(S / (S - 1)) if S > 1 else local_b
    start = asymptotic_start(local, local_b) if checked else 0
    i = 0 if start is None else start

    def slope(m: np.ndarray) -> float:
        return float(np.polyfit(lx[i:], np.log(m[i:]), 1)[0])

    lo, hi = percentile_ci([slope(b) for b in boots])
    return RateFit(
        slope(means), (lo, hi), expected, tuple(float(v) for v in local),
        None if start is None else int(Ns[start]), checked,
    )  # fmt: skip


def meanfield_convergence(
    weights: Any,
    *,
    d: int,
    Ns: Sequence[int] = (10, 100, 1000, 10_000),
    seeds: int = 4,
    times: Sequence[float] = (0.5, 1.0),
    model: str = "gf",
    lmax: int = 24,
    dt: float = 0.01,
    eps: float = 0.5,
    degrees: tuple[int, int] = (1, 3),
    kappa: float = 4.0,
    w2_max: int = 10_000,
    backend: str = "auto",
    seed: int = 0,
    pde_weights: Any = None,
) -> MeanFieldConvergence:
    """Distances from ``N``-token runs to the PDE at ``times`` for every ``N`` in ``Ns`` and ``seeds`` seeds.

    The initial density is ``(1 + eps xi)/|S|`` with ``xi`` random in the degrees ``degrees``
    (:func:`~attnflow.pde.solver.perturbed_uniform`); tokens are drawn from it i.i.d. ``w2_max``: the
    largest ``N`` for which the exact ``W_2`` is computed (against the density on a grid three times
    finer than the solver's; with fewer than two ``N`` at or below it, e.g. ``0``, no ``W_2``: ``values`` and
    ``fits`` hold the MMD alone). ``pde_weights``: other weights for the PDE than for the particles (a
    negative control: the distance must then stop shrinking). Returns the distances and the fitted
    rates with their CIs.
    """
    from attnflow.analysis.distances import wasserstein_sphere
    from attnflow.solve.simulation import simulate

    Ns_arr = np.asarray(sorted(int(n) for n in Ns))
    if Ns_arr.min() < 2 or Ns_arr.max() > 1_000_000 or len(Ns_arr) < 2:
        raise InputError(f"Ns must hold at least two token counts in [2, 1e6]; got {list(Ns)}")
    if not (isinstance(seeds, int) and 2 <= seeds <= 1000):
        raise InputError(f"seeds must be an integer in [2, 1000]; got {seeds!r}")
    if not (isinstance(w2_max, int) and w2_max >= 0):
        raise InputError(f"w2_max must be a whole number >= 0 (0: no W2); got {w2_max!r}")
    metrics = ("mmd", "w2") if int((Ns_arr <= w2_max).sum()) >= 2 else ("mmd",)  # a rate needs two N
    ts = np.asarray(sorted(float(t) for t in times))
    steps = np.round(ts / dt)
    if ts.min() <= 0 or np.abs(steps * dt - ts).max() > 1e-9 * ts.max():
        raise InputError(f"every time must be a positive whole number of steps dt = {dt}; got {list(times)}")
    basis = make_basis(lmax, d)
    c0 = perturbed_uniform(basis, eps, degrees=degrees, seed=seed)
    pde = solve_pde(
        c0, weights if pde_weights is None else pde_weights, model=model, t_end=float(ts.max()), dt=dt, basis=basis
    )
    idx = [int(np.argmin(np.abs(pde.t - t))) for t in ts]
    fine = make_basis(lmax, d, oversample=3.0)
    values = {m: np.full((len(Ns_arr), seeds, len(ts)), np.nan) for m in metrics}
    # Saved only where read (every time is a whole number of steps): each save runs the diagnostics' kernel pass
    save_every = math.gcd(*(int(k) for k in steps))
    for i, n in enumerate(Ns_arr):
        for s in range(seeds):
            x0 = sample_density(basis, c0, int(n), seed=seed * 1_000_003 + 7919 * i + s)
            tr = simulate(
                x0,
                weights,
                model=model,
                t_end=float(ts.max()),
                dt=dt,
                save_every=save_every,
                record_steps=False,
                backend=backend,
            )
            tt = np.asarray(tr.t)
            for j, t in enumerate(ts):
                x = np.asarray(tr.x[int(np.argmin(np.abs(tt - t)))])
                c = torch.from_numpy(pde.coef[idx[j]])
                grid_mass = (basis.q * basis.values(c)).numpy()
                values["mmd"][i, s, j] = mmd_sphere(x, basis.points.numpy(), b=grid_mass, kappa=kappa)
                if "w2" in values and n <= w2_max:
                    fm = (fine.q * fine.values(c)).numpy()
                    fm = np.clip(fm, 0, None) / np.clip(fm, 0, None).sum()
                    values["w2"][i, s, j] = wasserstein_sphere(x, fine.points.numpy(), b=fm, method="exact").value
    fits = {}
    for m, v in values.items():
        ok = np.isfinite(v).all(axis=(1, 2))
        fits[m] = [fit_rate(Ns_arr, v[:, :, j], expected_rate(m, d, Ns_arr[ok])) for j in range(len(ts))]
    return MeanFieldConvergence(Ns_arr, ts, values, fits, pde, {"kappa": kappa, "lmax": lmax, "d": d, "model": model})
