"""Numerical guards of a simulation: blow-up detection, a step-size stability estimate, float32 drift.

* :class:`NumericalInstability`: raised by :func:`attnflow.simulate` when the tokens become NaN/inf
  (or the field overflows); it carries the last good state as a :class:`~attnflow.io.checkpoint.Checkpoint`
  and the trajectory up to it.
* :func:`stability_estimate` ``L`` from the weights and :func:`step_warning`: explicit steps with
  ``dt * L`` beyond the method's stable range give a :class:`StabilityWarning` with a suggested step.
* :class:`Float32Monitor`: in float32 runs, compares the energy that float32 rounding moves in one
  step with that of the integrator's own truncation error (the step error, by Richardson), token by
  token at a few random tokens; a run whose rounding drift exceeds the budget gets a
  :class:`PrecisionWarning`.
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from attnflow.core.caller import AttnflowWarning, caller_stacklevel
from attnflow.core.errors import Hint, NumericalError
from attnflow.core.geometry import project_tangent
from attnflow.core.heads import Heads
from attnflow.dynamics.fields import FieldStats, field_stats, identity_values, mixed_field, split_means
from attnflow.kernels import small as _small
from attnflow.kernels.dense import attention_stats
from attnflow.kernels.dispatch import KernelOptions
from attnflow.schemes.integrators import INTEGRATORS


class StabilityWarning(AttnflowWarning):
    """The step ``dt`` is large compared to the stiffness ``L`` of the field (``hint``: the step or
    the method to use, as ``integration.dt`` / ``integration.method``)."""


class PrecisionWarning(AttnflowWarning):
    """A float32 run lost accuracy: its rounding error exceeds the integrator's error (``hint``:
    ``dtype`` float64)."""


class Advice(str):
    """A warning's sentence with its structured :class:`~attnflow.core.errors.Hint` (``hint``)."""

    hint: Hint | None

    def __new__(cls, text: str, hint: Hint | None = None) -> Advice:
        self = super().__new__(cls, text)
        self.hint = hint
        return self


class NumericalInstability(NumericalError):
    """The simulation produced NaN/inf. ``checkpoint``: the last good state (resumable);
    ``trajectory``: everything recorded up to and including that state; ``step``, ``t``: where it failed."""

    def __init__(self, message: str, *, step: int, t: float, checkpoint: Any = None, trajectory: Any = None) -> None:
        super().__init__(message)
        self.step, self.t = step, t
        self.checkpoint, self.trajectory = checkpoint, trajectory


#: Half the length of each explicit method's stability interval on the negative real axis
#: (Euler and Heun: 2, classical RK4: 2.785). Beyond ``dt * L`` of this size the gf energy stopped
#: decreasing in calibration runs (identity and GOE heads, beta 1 to 64; see tests/solve/test_guards.py).
STABLE_DT_L: dict[str, float] = {
    name: stepper.stable_dt_l for name, stepper in INTEGRATORS.items() if stepper.stable_dt_l is not None
}


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
    """The warning text when ``dt * L`` exceeds the method's stable range, else ``None``; an
    :class:`Advice` whose ``hint`` names the step (``integration.dt``) or method to use.

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
        return Advice(
            head + f"a stable explicit step would need {many} steps, so no explicit step is worth taking: use the "
            "implicit method='jko' (integration.method in a config), or check the weights (they may be unusable).",
            Hint("integration.method", "jko"),
        )
    return Advice(
        head + f"use dt <= {good:.3g} (integration.dt in a config), or for stiff cases the implicit method='jko'.",
        Hint("integration.dt", float(f"{good:.3g}")),
    )


def _row_norms(x: torch.Tensor) -> torch.Tensor:
    """``||x_i||`` in float64 without overflow or underflow (rows rescaled by their largest entry)."""
    x64 = x.to(torch.float64)
    m = x64.abs().amax(dim=-1, keepdim=True)
    safe = torch.where(m > 0, m, torch.ones_like(m))
    return (m * torch.linalg.vector_norm(x64 / safe, dim=-1, keepdim=True)).squeeze(-1)


#: The float64 fast path's squared-norm bounds (half the default tolerance 1e-6, as below).
_FINE64 = ((1.0 - 0.5e-6) ** 2, (1.0 + 0.5e-6) ** 2)


def unit_rows(x: Any) -> bool:
    """Whether every row of the float64 array ``x`` ``(N, d)`` has ``| ||x_i||^2 - 1 |`` inside the fast
    path's bounds (NaN fails): exactly when :func:`state_problem` (default tolerance, no diagnostics
    row) passes a float64 CPU state at once. One compiled pass; a caller that holds the array (the
    compiled small-cloud step) asks it instead of the guard."""
    return bool(_small.AVAILABLE and x.shape[0] and _small.rows_within(x, *_FINE64))


def state_problem(x: torch.Tensor, row: dict[str, float] | None = None, *, tol: float | None = None) -> str | None:
    """The sentence naming what is wrong with a state, or ``None`` when it is a usable point of the flow.

    ``x`` ``(N, d)``: the tokens, which must be finite and on the unit sphere (``| ||x_i|| - 1 | <= tol``;
    default ``1e-6`` in float64, ``1e-3`` in float32). ``row``: the diagnostics of the state
    (:func:`attnflow.analysis.diagnostics.state_diagnostics`); every value must be a number (no
    NaN), ``log|F|`` finite, and the slope ``|dF|`` and metric speed finite whenever the energy ``F``
    is (``F = -inf`` with finite ``log|F|`` is an overflow of the number, not of the state).
    """
    if (
        tol is None and row is None and x.dtype == torch.float64 and x.ndim == 2 and _small.AVAILABLE
        and x.device.type == "cpu" and x.shape[0] and not x.requires_grad and unit_rows(x.numpy())
    ):  # fmt: skip
        return None  # the common case after every step of a small float64 run, in one compiled pass
    if tol is None:
        tol = 1e-3 if x.dtype in (torch.float32, torch.float16, torch.bfloat16) else 1e-6
    if x.ndim == 3:  # an ensemble's stacked state (B, N, d): every member's tokens, named by member
        why = state_problem(x.reshape(-1, x.shape[-1]), row, tol=tol)
        if why is None or x.shape[1] == 0:
            return why
        return re.sub(
            r"token (\d+)", lambda m: "member {}, token {}".format(*divmod(int(m[1]), x.shape[1])), why, count=1
        )
    # Fast path (every step of a run): finite norms within half the tolerance, computed in x's own
    # dtype (off by ~d eps, far below tol), prove the tokens finite and on the sphere; anything
    # else is decided by the careful float64 check below.
    # One reduction and two numbers (NaN fails both comparisons): this runs after every step.
    if _small.AVAILABLE and x.dtype == torch.float64 and x.device.type == "cpu" and x.shape[0] and not x.requires_grad:
        # A small float64 state: the same test on squared norms in one compiled pass (torch's two
        # reductions cost ~15 us a step, more than a compiled small-cloud step at N = 8).
        fine = bool(_small.rows_within(x.numpy(), (1.0 - 0.5 * tol) ** 2, (1.0 + 0.5 * tol) ** 2))
    else:
        lo, hi = torch.aminmax(torch.linalg.vector_norm(x, dim=-1)) if x.shape[0] else (math.nan, math.nan)
        fine = float(lo) >= 1.0 - 0.5 * tol and float(hi) <= 1.0 + 0.5 * tol
    if not fine:
        if not bool(torch.isfinite(x).all()):
            bad = (~torch.isfinite(x)).any(dim=-1).nonzero()
            return f"the tokens became NaN/inf (token {int(bad[0])} first)"
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


#: Tokens at which the float32 check takes the float64 step (all of them when there are fewer).
PRECISION_ROWS = 64


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
        return project_tangent(x, mixed_field(x, self._heads, self.a, self.w, self.model, options=self.options))


def _row_stats(heads: Heads, a: torch.Tensor, w: torch.Tensor, x: torch.Tensor, rows: torch.Tensor) -> FieldStats:
    """The kernel pass of the tokens ``rows`` of ``x`` as queries against all of ``x`` as keys (``m / N``
    of a pass). Causal heads, whose mask depends on the positions, take the whole pass."""
    if heads.causal:
        st = field_stats(x, heads, a, w)
        return FieldStats(out=None if st.out is None else st.out[..., rows, :], logZ=st.logZ[..., rows], log_w=st.log_w)
    q, k, c = heads.logit_features(x)
    out, logZ = attention_stats(q[..., rows, :], k, heads.value_features(x), torch.log(a), key_bias=c)
    return FieldStats(out=out, logZ=logZ, log_w=torch.log(w))


class _Shadow:
    """The float64 field for the float32 check: exact at the checked ``rows``, to float32 accuracy at the
    other tokens (which only carry the keys along the stages), heads frozen at one time.

    At the start state (:meth:`at_start`, passed to the steps as their first stage) the other rows
    are the run's own float32 field ``v0``; elsewhere one float32 pass gives them, unless
    ``rows_only`` (the last step of a one-stage method, whose rows depend on the field at those rows
    alone: the others are NaN, never read).
    """

    def __init__(
        self,
        model: str,
        heads64: Heads,
        a64: torch.Tensor,
        w64: torch.Tensor,
        rows: torch.Tensor,
        coarse: _Frozen,
        options: KernelOptions | None = None,
    ) -> None:
        self.model, self._heads, self.a, self.w, self.options = model, heads64, a64, w64, options
        self.rows, self.coarse = rows, coarse
        self.rows_only = False
        #: The row statistics of ``A`` alone at the start state, when a pass there gave them (plain heads).
        self.start_stats: FieldStats | None = None

    def heads_at(self, t: float) -> Heads:
        return self._heads

    def at_start(self, x: torch.Tensor, v0: torch.Tensor) -> torch.Tensor:
        """The field at the start state ``x``: ``v0`` (the run's float32 field) with the checked rows exact."""
        return self._rows(x, v0.to(torch.float64, copy=True), start=True)

    def __call__(self, t: float, x: torch.Tensor) -> torch.Tensor:
        if self.rows_only:
            v = torch.full_like(x, math.nan)
        else:
            v = self.coarse(t, x.to(torch.float32)).to(torch.float64)
        return self._rows(x, v)

    def _rows(self, x: torch.Tensor, v: torch.Tensor, *, start: bool = False) -> torch.Tensor:
        heads = self._heads
        if heads.plain:  # one row pass gives the values' and A's outputs (see split_means)
            st, a_st = split_means(_row_stats(identity_values(heads), self.a, self.w, x, self.rows), heads)
            if start:
                self.start_stats = a_st
        else:
            st = _row_stats(heads, self.a, self.w, x, self.rows)
        v[self.rows] = project_tangent(x[self.rows], st.mixed_output(self.model))
        return v


def check_rows(n: int, seed: int, m: int = PRECISION_ROWS) -> torch.Tensor:
    """The ``min(m, n)`` tokens a float32 check looks at: drawn without replacement, a function of ``seed``."""
    if n <= m:
        return torch.arange(n)
    g = torch.Generator().manual_seed(int(seed))
    return torch.randperm(n, generator=g)[:m].sort().values


@dataclass
class Float32Monitor:
    """Energy moved by the float32 rounding of a run's steps against that of their truncation error.

    At a state ``x`` with the heads frozen, the float32 step ``y32`` (the run's own, from the run's own
    field ``v32`` when given) and the same step in float64 ``y64`` differ by the rounding ``y32 - y64``;
    ``y64`` and two half steps ``y64h`` differ by the truncation error (Richardson). Each token's share
    of the energy change, ``a_i |<g_i, .>|`` with ``g`` the gradient of ``F``
    (:meth:`~attnflow.dynamics.fields.FieldStats.energy_gradient`), summed over the tokens gives the
    rounding ``r`` and the truncation ``e`` of the step (an energy-weighted distance: zero at a
    critical point of ``F``, where neither matters). The float64 steps are taken at ``m``
    (:data:`PRECISION_ROWS`) random tokens only, as queries against all tokens as keys, the keys moved
    along the stages by their float32 field (off by ``dt eps32``, which moves the checked rows by
    ``dt^2 L eps32``, far below the rounding measured); the sum over the tokens is estimated by
    ``N/m`` times the sum over those rows (exact when ``N <= m``). Summed over the checked states,
    ``sum r > sum e`` means float32 rounding, not the step size, limits the accuracy: the run is flagged.
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
        *,
        v32: torch.Tensor | None = None,
        one_stage: bool = False,
        seed: int = 0,
        rows: int = PRECISION_ROWS,
    ) -> None:
        """Check the step ``dt`` from ``x`` at time ``t``. ``v32``: the run's float32 field at ``x``
        (computed when not given); ``one_stage``: ``step`` evaluates the field once (Euler), so the
        last half step needs the checked rows only; ``seed`` picks the rows."""
        try:
            n = x.shape[0]
            idx = check_rows(n, seed, rows).to(x.device)
            a64, w64 = a.to(torch.float64), w.to(torch.float64)
            h64 = heads.to(dtype=torch.float64)
            x32 = x.to(torch.float32)
            f32 = _Frozen(model, heads, a.to(torch.float32), w.to(torch.float32), options)
            if v32 is None:
                v32 = f32(t, x32)
            x64 = x.to(torch.float64)
            f64 = _Shadow(model, h64, a64, w64, idx, f32, options)
            y32 = step(f32, t, x32, dt, k1=v32.to(torch.float32))[idx].to(torch.float64)
            v64 = f64.at_start(x64, v32)  # every step below starts at x64 with this first stage
            y64 = step(f64, t, x64, dt, k1=v64)[idx]
            half = step(f64, t, x64, 0.5 * dt, k1=v64)
            f64.rows_only = one_stage
            y64h = step(f64, t + 0.5 * dt, half, 0.5 * dt)[idx]
            st = f64.start_stats or _row_stats(h64.without_values(), a64, w64, x64, idx)
            g = st.energy_gradient(x64[idx])
            share = lambda u: float((a64[idx] * ((g * u).sum(-1)).abs()).sum()) * n / len(idx)
            r, e = share(y32 - y64), share(y64 - y64h)
            F = 0.5 * float((a64[idx] * st.inverse_mobility()).sum()) * n / len(idx)
            if not (math.isfinite(r) and math.isfinite(e)):
                raise OverflowError("the float32 check's shadow step left the float range")
            self.rounding += weight * r
            self.budget += weight * e
            self.scale = max(self.scale, F)
            self.checks += 1
        except OverflowError:  # the float64 shadow step overflowed (usa): nothing to compare here
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
        return Advice(
            f"this float32 run lost accuracy: float32 rounding moves the energy by about {self.rounding:.3g} over the run "
            f"(summed token by token), more than the integrator's own error {self.budget:.3g} (step vs two half steps, "
            "float64). "
            "Rerun with dtype float64 for results as accurate as the method and step allow.",
            Hint("dtype", "float64"),
        )


def warn(message: str, category: type[Warning]) -> None:
    """Issue ``category`` at the user's line, carrying the :class:`Advice`'s hint when it has one."""
    hint = getattr(message, "hint", None)
    w = category(str(message), hint=hint) if issubclass(category, AttnflowWarning) else category(str(message))
    warnings.warn(w, stacklevel=caller_stacklevel())
