"""Batched ensembles: ``B`` independent token systems (seeds, temperatures ``beta``) in one call.

Member ``b`` follows ``dx_i/dt = v_t(x_i)`` with heads ``beta_b A_h(t)`` drawn from its own weight
sampler (seed ``seeds[b]``). All members share ``N``, ``d``, ``H`` and the model, so one batched
kernel call (leading dimension ``B``) evaluates every field, and the integrators of
:mod:`attnflow.integrators` step the stacked state ``(B, N, d)`` unchanged. This is how phase
diagrams over ``(t, beta)`` are made.
"""

from __future__ import annotations

import math
import time as _time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, cast

import numpy as np
import torch

from attnflow.core.arrays import ArrayLike, to_numpy, to_tensor
from attnflow.core.errors import InputError
from attnflow.core.geometry import project_tangent, retract
from attnflow.core.heads import Heads
from attnflow.dynamics.fields import MODELS, FieldStats, check_model, masses
from attnflow.kernels import small as _small
from attnflow.kernels.dense import attention_stats
from attnflow.kernels.dispatch import KernelOptions
from attnflow.schemes.integrators import ADAPTIVE, INTEGRATORS, MOVEMENTS, Field, get_integrator
from attnflow.solve.guards import NumericalInstability
from attnflow.solve.loop import BatchedController, Controller, Costs, Observer, StepFailed, StepState, run_loop
from attnflow.solve.observers import ProgressReport
from attnflow.solve.simulation import save_grid, step_count
from attnflow.weights.processes import Constant, WeightProcess, WeightSampler, as_process

#: Per-member diagnostics recorded at every save time, shape ``(S, B)``.
ENSEMBLE_DIAGNOSTICS: dict[str, str] = {
    "order_parameter": "|sum_i a_i x_i|",
    "log_abs_energy": "log |F(mu, t)| with F = -1/2 sum_h w_h sum_ij a_i a_j exp(x_i^T beta A_h x_j)",
    "mean_inner": "mean_{i != j} <x_i, x_j> (unit masses' average, from |sum_i x_i|^2)",
}


@dataclass
class Ensemble:
    """``B`` trajectories at common save times: ``t`` ``(S,)``, ``x`` ``(S, B, N, d)``,
    ``diagnostics[name]`` ``(S, B)`` (see :data:`ENSEMBLE_DIAGNOSTICS`), ``betas`` ``(B,)``, ``seeds``."""

    t: np.ndarray
    x: np.ndarray
    betas: np.ndarray
    seeds: list[int | None]
    diagnostics: dict[str, np.ndarray]
    model: str
    method: str
    dt: float
    provenance: dict[str, Any] = field(default_factory=dict)

    @property
    def B(self) -> int:
        return int(self.x.shape[1])

    def to_xarray(self) -> Any:
        """An ``xarray.Dataset`` with dims ``time, member, token, dim``."""
        import xarray as xr  # loaded only when asked for, like the other optional outputs

        data: dict[str, Any] = {"x": (("time", "member", "token", "dim"), self.x)}
        data.update({k: (("time", "member"), v) for k, v in self.diagnostics.items()})
        return xr.Dataset(
            data,
            coords={"time": self.t, "member": np.arange(self.B), "beta": ("member", self.betas)},
            attrs={"model": self.model, "method": self.method, "dt": self.dt},
        )


class EnsembleField:
    """``(t, X) -> v_t(X)`` for the stacked state ``X`` ``(B, N, d)`` (an integrator's ``Field``)."""

    def __init__(
        self,
        model: str,
        samplers: Sequence[WeightSampler],
        betas: np.ndarray,
        a: torch.Tensor,
        w: torch.Tensor,
        dtype: torch.dtype,
        device: torch.device,
        options: KernelOptions | None = None,
    ) -> None:
        self.model, self.samplers, self.a, self.w = model, samplers, a, w
        self.betas = torch.as_tensor(betas, dtype=dtype, device=device)
        self.dtype, self.device = dtype, device
        self.options = KernelOptions() if options is None else options
        if self.options.backend == "fast":
            raise ValueError(
                "fast summation evaluates one token cloud at a time; an ensemble uses the dense kernel: "
                "choose backend 'auto', 'flash' or 'stream'"
            )

    def heads_at(self, t: float) -> list[Heads]:
        """Each member's heads at ``t``, temperature included."""
        out = []
        for b, sampler in enumerate(self.samplers):
            h = sampler(t).to(dtype=self.dtype, device=self.device)
            beta = self.betas[b]
            out.append(replace(h, K=h.K * beta))  # V = None keeps V = beta A
        return out

    def matrices(self, t: float) -> tuple[torch.Tensor, torch.Tensor]:
        """Stacked ``A`` and ``V`` of shape ``(B, H, d, d)``."""
        hs = self.heads_at(t)
        return torch.stack([h.A for h in hs]), torch.stack([h.values for h in hs])

    def stats(self, t: float, X: torch.Tensor, *, values: bool = True) -> FieldStats:
        A, V = self.matrices(t)
        H = A.shape[1]
        q = X.unsqueeze(1).expand(-1, H, -1, -1)
        k = torch.einsum("bnd,bhed->bhne", X, A)
        v = torch.einsum("bnd,bhed->bhne", X, V) if values else None
        dense = self.options.backend if self.options.backend in ("flash", "stream") else "auto"
        out, logZ = attention_stats(q, k, v, torch.log(self.a), backend=dense)
        return FieldStats(out=out, logZ=logZ, log_w=torch.log(self.w))

    def __call__(self, t: float, X: torch.Tensor) -> torch.Tensor:
        return project_tangent(X, self.stats(t, X).mixed_output(self.model))


def _member_count(*lengths: int | None) -> int:
    given = {n for n in lengths if n is not None and n != 1}
    if len(given) > 1:
        raise ValueError(f"x0, seeds, betas and weights give different ensemble sizes {sorted(given)}; make them agree")
    return given.pop() if given else 1


def simulate_ensemble(
    x0: ArrayLike,
    weights: WeightProcess | ArrayLike | Callable | Heads | Sequence[Any],
    *,
    model: str = "gf",
    t_end: float,
    dt: float,
    method: str = "rk4",
    save_every: int = 1,
    seeds: Sequence[int | None] | None = None,
    betas: ArrayLike | None = None,
    token_weights: ArrayLike | None = None,
    head_weights: ArrayLike | None = None,
    t0: float = 0.0,
    dtype: torch.dtype | None = None,
    backend: str = "auto",
    progress: Callable[[int, int], None] | None = None,
    rtol: float = 1e-6,
    atol: float = 1e-9,
    dt_min: float | None = None,
    dt_max: float | None = None,
) -> Ensemble:
    """Integrate ``B`` independent systems at once (see the module docstring).

    ``x0``: ``(B, N, d)`` or one ``(N, d)`` cloud shared by all members. ``weights``: one process
    (member ``b`` samples it with ``seeds[b]``) or a list of ``B`` processes. ``betas`` ``(B,)``
    multiply every ``A_h`` (and ``V_h`` when ``V = A``). Member ``b`` equals
    ``simulate(x0[b], beta_b * weights, seed=seeds[b], ...)``. The steps run in the loop of
    :func:`attnflow.simulate` (:func:`attnflow.solve.loop.run_loop`); NaN/inf tokens raise
    :class:`~attnflow.solve.guards.NumericalInstability`.

    Adaptive methods (``bosh3``, ``dopri5``, ``dop853``; ``rtol``, ``atol``, ``dt_min``, ``dt_max`` as in
    :func:`attnflow.simulate`) give every member its own step control, through the compiled
    small-cloud step (:mod:`attnflow.kernels.small`): constant weights, plain heads, float64, small
    clouds. Member ``b`` then steps exactly as its single run does.
    """
    options = KernelOptions(backend)
    X = to_tensor(x0, dtype=dtype)
    if X.ndim == 2:
        X = X.unsqueeze(0)
    if X.ndim != 3:
        raise ValueError(f"x0 must have shape (B, N, d) or (N, d); got {tuple(X.shape)}")
    if not bool(torch.isfinite(X).all()):
        raise ValueError("x0 contains NaN or inf")
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; choose one of {MODELS}")
    procs = list(weights) if isinstance(weights, (list, tuple)) else None
    beta_arr = None if betas is None else np.atleast_1d(np.asarray(betas, dtype=np.float64))
    B = _member_count(
        X.shape[0],
        None if seeds is None else len(seeds),
        None if beta_arr is None else len(beta_arr),
        None if procs is None else len(procs),
    )
    X = retract(X.expand(B, -1, -1).clone())
    seed_list: list[int | None] = list(seeds) if seeds is not None else [None] * B
    seed_list = seed_list * B if len(seed_list) == 1 else seed_list
    beta_arr = np.ones(B) if beta_arr is None else np.broadcast_to(beta_arr, (B,)).copy()
    processes = [as_process(p) for p in procs] if procs is not None else [as_process(weights)] * B
    processes = processes * B if len(processes) == 1 else processes
    n_steps = step_count(t0, t_end, dt)
    d, H = X.shape[2], processes[0].H
    if any(p.d != d or p.H != H for p in processes):
        raise ValueError(f"every member's weights must act on d={d} with H={H} heads")
    if method in ADAPTIVE:
        return _adaptive_ensemble(
            X, processes, beta_arr, seed_list, model=model, t0=float(t0), t_end=float(t_end), dt=float(dt),
            method=method, save_every=int(save_every), token_weights=token_weights, head_weights=head_weights,
            options=options, tolerances=(rtol, atol, dt_min, dt_max), progress=progress,
        )  # fmt: skip
    if method in MOVEMENTS:
        raise ValueError(
            f"method {method!r} is a minimising movement of one token cloud; ensembles step with an explicit "
            f"method: one of {', '.join(INTEGRATORS)}"
        )
    stepper = get_integrator(method)
    a = masses(token_weights, X.shape[1], "token_weights", X)
    w = masses(head_weights, H, "head_weights", X)
    f = EnsembleField(
        model, [p.sampler(s) for p, s in zip(processes, seed_list)], beta_arr, a, w, X.dtype, X.device, options
    )
    for h in f.heads_at(t0):
        check_model(model, h)

    # An explicit stepper only calls the field (jko, which reads heads_at, was refused above), so the
    # batched field stands in for a single-cloud Field.
    field = cast(Field, f)
    saver = _EnsembleSaver(f, a)
    start = _time.perf_counter()
    saver.record(float(t0), X)
    observers: list[Observer] = [] if progress is None else [ProgressReport(progress)]
    costs = Costs({})
    try:
        run_loop(
            lambda t, Y, h: stepper.step(field, t, Y, h), X, t0=t0, dt=dt, k0=0, n_steps=n_steps,
            save_every=int(save_every), recorders=[saver], observers=observers, costs=costs,
        )  # fmt: skip
    except StepFailed as e:
        raise NumericalInstability(
            f"{e.why} at t={t0 + e.k * dt:.6g} (step {e.k} of {n_steps}) in at least one member; the last good "
            f"state is t={e.t:.6g}. Lower dt, or the largest beta.",
            step=e.k,
            t=t0 + e.k * dt,
        ) from None
    return Ensemble(
        t=np.array(saver.ts),
        x=np.stack(saver.xs),
        betas=beta_arr,
        seeds=seed_list,
        diagnostics={k: np.stack([r[k] for r in saver.rows]) for k in ENSEMBLE_DIAGNOSTICS},
        model=model,
        method=method,
        dt=float(dt),
        provenance={"wall_time_s": _time.perf_counter() - start, "steps": n_steps, "seconds": costs.rounded()},
    )


class _EnsembleSaver:
    """Saves each member's state and :data:`ENSEMBLE_DIAGNOSTICS` at the save times."""

    name = "diagnostics"

    def __init__(self, f: EnsembleField, a: torch.Tensor) -> None:
        self.f, self.a = f, a
        self.rows: list[dict[str, np.ndarray]] = []
        self.ts: list[float] = []
        self.xs: list[np.ndarray] = []

    def record(self, t: float, Y: torch.Tensor) -> None:
        st = self.f.stats(t, Y, values=False)
        log_F = st.log_abs_energy(self.a)
        m = (self.a[:, None] * Y).sum(-2)
        N = Y.shape[1]
        s2 = (Y.sum(-2) ** 2).sum(-1)
        self.rows.append(
            {
                "order_parameter": to_numpy(torch.linalg.vector_norm(m, dim=-1)).astype(np.float64),
                "log_abs_energy": to_numpy(log_F).astype(np.float64),
                "mean_inner": to_numpy((s2 - N) / max(1, N * (N - 1))).astype(np.float64),
            }
        )
        self.ts.append(t)
        self.xs.append(to_numpy(Y).astype(np.float64))

    def on_step(self, state: StepState) -> None:
        if state.save:
            self.record(state.t, state.x)


def _adaptive_ensemble(
    X: torch.Tensor, processes: list[WeightProcess], betas: np.ndarray, seeds: list[int | None], *, model: str,
    t0: float, t_end: float, dt: float, method: str, save_every: int, token_weights: ArrayLike | None,
    head_weights: ArrayLike | None, options: KernelOptions,
    tolerances: tuple[float, float, float | None, float | None], progress: Callable[[int, int], None] | None,
) -> Ensemble:  # fmt: skip
    """Every member with its own PI step control (:class:`BatchedController`), all members' trial
    steps in one compiled call per round; each member lands exactly on every save time."""
    rtol, atol, dt_min, dt_max = tolerances
    if not (dt > 0 and math.isfinite(dt) and math.isfinite(t_end) and t_end > t0 and save_every >= 1):
        raise InputError(f"need dt > 0, t_end > t0 and save_every >= 1; got dt={dt}, t0={t0}, t_end={t_end}")
    if not (rtol >= 0 and atol >= 0 and rtol + atol > 0):
        raise InputError(f"rtol and atol must be non-negative and not both zero; got rtol={rtol}, atol={atol}")
    spacing = dt * save_every
    lo = 0.0 if dt_min is None else float(dt_min)
    hi = spacing if dt_max is None else float(dt_max)
    B, N, d = X.shape
    if not all(isinstance(p, Constant) for p in processes) or X.dtype != torch.float64 or X.device.type != "cpu":
        raise InputError(
            f"adaptive ensembles ({method!r}) run through the compiled small-cloud step: constant weights, "
            "float64 tokens on the CPU; use simulate for other runs, or a fixed-step method"
        )
    heads = [cast(Constant, p).heads for p in processes]
    if not _small.AVAILABLE or not all(_small.supported(h, "cpu", X.dtype) for h in heads):
        raise InputError(f"adaptive ensembles ({method!r}) need plain heads (no biases, mask or rotary) and numba")
    for h in heads:
        check_model(model, h)
    a = masses(token_weights, N, "token_weights", X)
    w = masses(head_weights, heads[0].H, "head_weights", X)
    A = np.stack([h.A.double().numpy() * bt for h, bt in zip(heads, betas)])
    V = np.stack([h.values.double().numpy() * (bt if h.V is None else 1.0) for h, bt in zip(heads, betas)])
    pair = ADAPTIVE[method]
    tab = pair.arrays()
    ctrl = BatchedController.like(
        Controller(k=min(pair.order, pair.embedded_order) + 1, dt=min(dt, hi), rtol=float(rtol), atol=float(atol),
                   dt_min=lo, dt_max=hi), B,
    )  # fmt: skip
    saves = [t0, *save_grid(t0, t_end, spacing)]
    x = X.numpy().copy()
    out = np.empty((len(saves), B, N, d))
    out[0] = x
    T = np.full(B, t0)
    nxt = np.ones(B, dtype=np.int64)  # index of each member's next save time
    K1 = np.empty_like(x)
    have = np.zeros(B, dtype=np.bool_)
    accepted = np.zeros(B, dtype=np.int64)
    rejected = np.zeros(B, dtype=np.int64)
    evals = np.zeros(B, dtype=np.int64)
    a_np, w_np = to_numpy(a).astype(np.float64), to_numpy(w).astype(np.float64)
    start = _time.perf_counter()
    rounds = 0
    while True:
        active = nxt < len(saves)
        if not active.any():
            break
        target = np.array(saves)[np.minimum(nxt, len(saves) - 1)]
        h = np.minimum(ctrl.dt, target - T)
        Y, err, KL, ok = _small.batched_attempt(x, h, active, A, V, w_np, a_np, model, tab, rtol, atol, K1, have)
        evals[active] += pair.stages - have[active]
        err = np.where(ok, err, np.inf)
        acc = active & (err <= 1.0)
        rej = active & ~acc
        # A member whose step cannot shrink further (dt_min, or below the resolution of t) has failed.
        stuck = rej & (h <= np.maximum(lo, 1e-13 * np.maximum(1.0, np.abs(T))))
        if stuck.any():
            m = int(np.flatnonzero(stuck)[0])
            why = "the field is not finite" if not ok[m] else "the tolerance cannot be met"
            raise NumericalInstability(
                f"member {m}: {why} at t={T[m]:.6g} with the smallest allowed step; loosen rtol/atol, lower "
                "dt_min, or lower its beta",
                step=int(accepted[m]), t=float(T[m]),
            )  # fmt: skip
        ctrl.accept(acc, err, h)
        ctrl.reject(rej, err, h)
        hit = acc & (h == target - T)
        x[acc], K1[acc] = Y[acc], KL[acc]
        have = have | acc
        T[acc] = np.where(hit[acc], target[acc], T[acc] + h[acc])
        for j in np.flatnonzero(hit).tolist():
            out[nxt[j], j] = x[j]
        nxt[hit] += 1
        accepted += acc
        rejected += rej
        rounds += 1
        if progress is not None and rounds % 64 == 0:
            progress(int(1000 * float(np.mean((T - t0) / (t_end - t0)))), 1000)
    f = EnsembleField(
        model, [p.sampler(sd) for p, sd in zip(processes, seeds)], betas, a, w, X.dtype, X.device, options
    )
    saver = _EnsembleSaver(f, a)
    for s_, t_s in enumerate(saves):
        saver.record(t_s, torch.from_numpy(out[s_]))
    return Ensemble(
        t=np.array(saves), x=out, betas=betas, seeds=seeds,
        diagnostics={k: np.stack([r[k] for r in saver.rows]) for k in ENSEMBLE_DIAGNOSTICS},
        model=model, method=method, dt=float(dt),
        provenance={
            "wall_time_s": _time.perf_counter() - start, "rounds": rounds,
            "adaptive": {"accepted_steps": accepted.tolist(), "rejected_steps": rejected.tolist(),
                         "field_evaluations": evals.tolist(), "rtol": float(rtol), "atol": float(atol),
                         "dt_min": lo, "dt_max": hi},
        },
    )  # fmt: skip
