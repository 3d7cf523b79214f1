"""Numerical guards of a simulation: blow-up detection, a step-size stability estimate, float32 drift.

* :class:`NumericalInstability`: raised by :func:`attnflow.simulate` when the tokens become NaN/inf
  (or the field overflows); it carries the last good state as a :class:`~attnflow.checkpoint.Checkpoint`
  and the trajectory up to it.
* :func:`stability_estimate` ``L`` from the weights and :func:`step_warning`: explicit steps with
  ``dt * L`` beyond the method's stable range give a :class:`StabilityWarning` with a suggested step.
* :class:`Float32Monitor`: in float32 runs, compares the energy error that float32 rounding adds in
  one step with the integrator's own truncation error (the step error, by Richardson); a run whose
  rounding drift exceeds the budget gets a :class:`PrecisionWarning`.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from attnflow.core.caller import caller_stacklevel
from attnflow.core.geometry import project_tangent
from attnflow.core.heads import Heads
from attnflow.dynamics.fields import field_stats, state_energy
from attnflow.kernels.dispatch import KernelOptions


class StabilityWarning(UserWarning):
    """The step ``dt`` is large compared to the stiffness ``L`` of the field."""


class PrecisionWarning(UserWarning):
    """A float32 run lost accuracy: its rounding error exceeds the integrator's error."""


class NumericalInstability(FloatingPointError):
    """The simulation produced NaN/inf. ``checkpoint``: the last good state (resumable);
    ``trajectory``: everything recorded up to and including that state; ``step``, ``t``: where it failed."""

    def __init__(self, message: str, *, step: int, t: float, checkpoint: Any = None, trajectory: Any = None) -> None:
        super().__init__(message)
        self.step, self.t = step, t
        self.checkpoint, self.trajectory = checkpoint, trajectory


#: Half the length of each explicit method's stability interval on the negative real axis
#: (Euler and Heun: 2, classical RK4: 2.785). Beyond ``dt * L`` of this size the gf energy stopped
#: decreasing in calibration runs (identity and GOE heads, beta 1 to 64; see tests/test_guards.py).
STABLE_DT_L: dict[str, float] = {"euler": 1.0, "heun": 1.0, "rk4": 1.39}


#: A stable step that needs more steps than this is not advised: the weights are too stiff for an
#: explicit method (use ``jko``) or unusable.
MAX_ADVISED_STEPS = 1e7


def stability_estimate(heads: Heads, model: str = "gf") -> float:
    """Stiffness ``L = max_h ||V_h||_op`` of the field (times ``max_h exp(||A_h||_op)`` for ``usa``).

    ``L`` is the rate at which a cluster of tokens contracts (``v(x) ~ P_x V xbar`` when the softmax
    is flat inside the cluster), the fastest mode an explicit step has to resolve. For ``gf``
    ``V_h = A_h``, so it grows like ``beta``. Never raises: weights with NaN give ``nan``, weights
    too large for a norm give ``inf``.
    """
    V = heads.values.detach().to(torch.float64)
    L = _op_norm_max(V)
    if model == "usa" and not math.isnan(L):
        alpha = _op_norm_max(heads.A.detach().to(torch.float64))
        if math.isnan(alpha):
            return math.nan
        L = math.inf if alpha > 700.0 else L * math.exp(alpha)
    return L


def _op_norm_max(M: torch.Tensor) -> float:
    """``max_h ||M_h||_2`` without overflow (rescaled by the largest entry); ``nan`` for NaN entries."""
    if not bool(torch.isfinite(M).all()):
        return math.nan if bool(torch.isnan(M).any()) else math.inf
    scale = float(M.abs().max()) if M.numel() else 0.0
    if scale == 0.0:
        return 0.0
    try:
        n = float(torch.linalg.matrix_norm(M / scale, ord=2).max())
    except RuntimeError:  # LinAlgError: the SVD did not converge
        n = float(torch.linalg.matrix_norm(M / scale, ord="fro").max())
    return n * scale  # may overflow to inf: that is the honest answer


def suggested_step(L: float, method: str, span: float) -> float:
    """A step with ``dt * L`` at half the stable limit that divides ``span`` (``1, 2, 5 x 10^k`` if possible).

    ``nan`` when no such step is worth advising: ``L`` or ``span`` not finite, or the step would
    need more than :data:`MAX_ADVISED_STEPS` steps.
    """
    if not (math.isfinite(L) and math.isfinite(span) and span > 0):
        return math.nan
    target = 0.5 * STABLE_DT_L.get(method, 1.0) / max(L, 1e-300)
    if target >= span:
        return span
    if not target > 0 or span / target > MAX_ADVISED_STEPS:
        return math.nan
    k = math.floor(math.log10(target))
    for e in (k, k - 1, k - 2):
        for m in (5.0, 2.0, 1.0):
            c = m * 10.0**e
            n = round(span / c)
            if c <= target and 1 <= n <= MAX_ADVISED_STEPS and abs(n * c - span) <= 1e-9 * span:
                return c
    return span / math.ceil(span / target)


def step_warning(dt: float, method: str, heads: Heads, model: str, span: float) -> str | None:
    """The warning text when ``dt * L`` exceeds the method's stable range, else ``None``.

    Never raises. When the stable step would take more than :data:`MAX_ADVISED_STEPS` steps (or
    ``L`` is infinite) it advises the implicit method ``jko``; weights with NaN are called unusable.
    """
    limit = STABLE_DT_L.get(method)
    if limit is None:  # implicit methods (jko) have no explicit step limit
        return None
    L = stability_estimate(heads, model)
    if math.isnan(L):
        return "the weights contain NaN: they are unusable; check how they were made (heads.beta, the weight file)."
    if dt * L <= limit:
        return None
    good = suggested_step(L, method, span)
    head = (
        f"the step dt = {dt:g} is large for these weights: dt * L = {dt * L:.3g} exceeds {limit:g}, the stable range "
        f"of method {method!r} (L = {L:.3g}, the stiffness estimated from the weights at the start). Expect "
        "oscillation or garbage; "
    )
    if math.isnan(good):
        steps = span * L / (0.5 * limit) if math.isfinite(span) else math.inf
        many = f"about {steps:.3g}" if math.isfinite(steps) else "more than any run can take"
        return head + (
            f"a stable explicit step would need {many} steps, so no explicit step is worth taking: use the "
            "implicit method='jko' (--set integration.method=jko), or check the weights (they may be unusable)."
        )
    return (
        head
        + f"use dt <= {good:.3g} (e.g. --set integration.dt={good:.3g}), or for stiff cases the implicit method='jko'."
    )


def _row_norms(x: torch.Tensor) -> torch.Tensor:
    """``||x_i||`` in float64 without overflow or underflow (rows rescaled by their largest entry)."""
    x64 = x.to(torch.float64)
    m = x64.abs().amax(dim=-1, keepdim=True)
    safe = torch.where(m > 0, m, torch.ones_like(m))
    return (m * torch.linalg.vector_norm(x64 / safe, dim=-1, keepdim=True)).squeeze(-1)


def state_problem(x: torch.Tensor, row: dict[str, float] | None = None, *, tol: float | None = None) -> str | None:
    """The sentence naming what is wrong with a state, or ``None`` when it is a usable point of the flow.

    ``x`` ``(N, d)``: the tokens, which must be finite and on the unit sphere (``| ||x_i|| - 1 | <= tol``;
    default ``1e-6`` in float64, ``1e-3`` in float32). ``row``: the diagnostics of the state
    (:func:`attnflow.analysis.diagnostics.state_diagnostics`); every value must be a number (no
    NaN), ``log|F|`` finite, and the slope ``|dF|`` and metric speed finite whenever the energy ``F``
    is (``F = -inf`` with finite ``log|F|`` is an overflow of the number, not of the state).
    """
    if not bool(torch.isfinite(x).all()):
        bad = (~torch.isfinite(x)).any(dim=-1).nonzero()
        return f"the tokens became NaN/inf (token {int(bad[0])} first)"
    if tol is None:
        tol = 1e-3 if x.dtype in (torch.float32, torch.float16, torch.bfloat16) else 1e-6
    norms = _row_norms(x)
    off = (norms - 1.0).abs()
    if x.shape[0] and float(off.max()) > tol:
        i = int(off.argmax())
        r = float(norms[i])
        if r == 0.0:
            return f"token {i} collapsed to the zero vector (norm 0): the tokens left the unit sphere"
        return f"token {i} left the unit sphere (its norm is {r:.6g}, off 1 by {abs(r - 1.0):.3g})"
    if row is None:
        return None
    for name, value in row.items():
        if isinstance(value, float) and math.isnan(value):
            return f"the diagnostic {name!r} is NaN"
    log_f = row.get("log_abs_energy")
    if log_f is not None and not math.isfinite(log_f):
        return f"the energy F is degenerate (log|F| = {log_f})"
    energy: float | None = row.get("energy")
    if energy is not None and log_f is None and not math.isfinite(energy):
        return f"the energy F is infinite (F = {energy})"
    # |dF|^2 and ||v||_mu^2 grow at most like |F|^3 (the usa field is Z_h times a mean), so they can
    # overflow as numbers while F does not: an infinite one is a broken state only when |F| is small
    # enough that its cube is representable (log|F| < 709 / 3).
    if energy is not None and math.isfinite(energy) and (log_f is None or log_f < 709.0 / 3.0):
        for name, label in (("slope", "the slope |dF|"), ("metric_speed", "the metric speed ||v||")):
            got: float | None = row.get(name)
            if got is not None and not math.isfinite(got):
                return f"{label} is infinite while the energy F = {energy:.6g} is finite"
    return None


def trajectory_problem(traj: Any) -> tuple[int, str] | None:
    """The first saved state of a :class:`~attnflow.io.Trajectory` that :func:`state_problem` rejects,
    as ``(index, sentence)``, or ``None``. A safety net for a finished run (the simulation loop
    checks every step itself)."""
    for k in range(len(traj.t)):
        row = {name: float(values[k]) for name, values in traj.diagnostics.items()}
        why = state_problem(torch.from_numpy(traj.x[k]), row)
        if why is not None:
            return k, why
    return None


class _Frozen:
    """The field with the heads frozen at one time (for the float32 check; touches no sampler)."""

    def __init__(
        self, model: str, heads: Heads, a: torch.Tensor, w: torch.Tensor, options: KernelOptions | None = None
    ) -> None:
        self.model, self.a, self.w, self.options = model, a, w, options
        self._heads = heads.to(dtype=a.dtype)

    def heads_at(self, t: float) -> Heads:
        return self._heads

    def __call__(self, t: float, x: torch.Tensor) -> torch.Tensor:
        st = field_stats(x, self._heads, self.a, self.w, options=self.options)
        return project_tangent(x, st.mixed_output(self.model))


def _energy64(
    x: torch.Tensor, heads64: Heads, a64: torch.Tensor, w64: torch.Tensor, options: KernelOptions | None = None
) -> float:
    return state_energy(x.to(torch.float64), heads64, a64, w64, options=options)


@dataclass
class Float32Monitor:
    """Energy drift of a float32 run against the truncation error of its steps (``step_error``).

    At a state ``x`` with the heads frozen, one step in float32 and the same step in float64 differ
    in energy by the rounding error ``r``; one step against two half steps (float64) differ by the
    truncation error ``e`` (Richardson). Summed over the checked states, ``sum r > sum e`` means
    float32 rounding, not the step size, limits the accuracy: the run is flagged.
    """

    rounding: float = 0.0
    budget: float = 0.0
    checks: int = 0
    scale: float = 0.0
    per_check: list[Any] = field(default_factory=list)

    def check(
        self,
        step: Callable[..., torch.Tensor],
        model: str,
        heads: Heads,
        a: torch.Tensor,
        w: torch.Tensor,
        t: float,
        x: torch.Tensor,
        dt: float,
        weight: int = 1,
        options: KernelOptions | None = None,
    ) -> None:
        try:
            a64, w64 = a.to(torch.float64), w.to(torch.float64)
            h64 = heads.to(dtype=torch.float64)
            f64 = _Frozen(model, h64, a64, w64, options)
            f32 = _Frozen(model, heads, a.to(torch.float32), w.to(torch.float32), options)
            x64 = x.to(torch.float64)
            y64 = step(f64, t, x64, dt)
            y64h = step(f64, t + 0.5 * dt, step(f64, t, x64, 0.5 * dt), 0.5 * dt)
            y32 = step(f32, t, x.to(torch.float32), dt)
            F64 = _energy64(y64, h64, a64, w64, options)
            r = abs(_energy64(y32, h64, a64, w64, options) - F64)
            e = abs(F64 - _energy64(y64h, h64, a64, w64, options))
            self.rounding += weight * r
            self.budget += weight * e
            self.scale = max(self.scale, abs(F64))
            self.checks += 1
        except OverflowError:  # the float32 shadow step overflowed (usa): nothing to compare here
            return

    @property
    def flagged(self) -> bool:
        # Below ~1e-12 |F| both are float64 noise: nothing to flag.
        return self.checks > 0 and self.rounding > max(self.budget, 1e-12 * self.scale)

    def summary(self) -> dict:
        return {
            "rounding_drift": self.rounding,
            "step_error": self.budget,
            "checks": self.checks,
            "flagged": self.flagged,
        }

    def message(self) -> str:
        return (
            f"this float32 run lost accuracy: float32 rounding moves the energy by about {self.rounding:.3g} over the run, "
            f"more than the integrator's own error budget {self.budget:.3g} (step vs two half steps, float64). "
            "Rerun with dtype float64 (--set dtype=float64) for results as accurate as the method and step allow."
        )


def warn(message: str, category: type[Warning]) -> None:
    warnings.warn(message, category, stacklevel=caller_stacklevel())
