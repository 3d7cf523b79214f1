"""``simulate``: integrate ``dx_i/dt = v_t(x_i)`` from ``t0`` to ``t_end`` and record a :class:`Trajectory`.

Data flows one way: initial tokens + weight process -> integrator -> trajectory -> diagnostics.
"""

from __future__ import annotations

import math
import time as _time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from attnflow.analysis.diagnostics import as_numpy_table, state_diagnostics
from attnflow.analysis.edi import StepRecorder
from attnflow.core.arrays import ArrayLike, to_numpy, to_tensor
from attnflow.core.geometry import project_tangent
from attnflow.core.heads import Heads
from attnflow.dynamics.fields import MODELS, check_model, field_stats, masses
from attnflow.io.checkpoint import Checkpoint, Checkpointer, load_checkpoint
from attnflow.io.checkpoint import fingerprint as _fingerprint
from attnflow.io.trajectory import Trajectory
from attnflow.kernels.dispatch import kernel_options
from attnflow.schemes.integrators import get_integrator
from attnflow.solve import guards as _guards
from attnflow.weights.processes import WeightProcess, WeightSampler, as_process


class TimeField:
    """``(t, x) -> v_t(x)`` for one model, one weight realisation and fixed masses (an integrator's ``Field``)."""

    def __init__(
        self, model: str, sampler: WeightSampler, a: torch.Tensor, w: torch.Tensor, dtype, device, backend: str = "auto"
    ):
        self.model, self.sampler, self.a, self.w = model, sampler, a, w
        self.dtype, self.device, self.backend = dtype, device, backend

    def heads_at(self, t: float) -> Heads:
        return self.sampler(t).to(dtype=self.dtype, device=self.device)

    def __call__(self, t: float, x: torch.Tensor) -> torch.Tensor:
        st = field_stats(x, self.heads_at(t), self.a, self.w, backend=self.backend)
        return project_tangent(x, st.mixed_output(self.model))


def simulate(
    x0: ArrayLike,
    weights: WeightProcess | ArrayLike | Callable | Heads,
    *,
    model: str = "gf",
    t_end: float,
    dt: float,
    method: str = "rk4",
    save_every: int = 1,
    seed: int | None = None,
    token_weights: ArrayLike | None = None,
    head_weights: ArrayLike | None = None,
    t0: float = 0.0,
    cluster_eps: float = 1e-3,
    dtype: torch.dtype | None = None,
    progress: Callable[[int, int], None] | None = None,
    config: dict[str, Any] | None = None,
    record_steps: bool | None = None,
    checkpoint: Checkpointer | None = None,
    resume: Checkpoint | str | None = None,
    backend: str = "auto",
    fast_tol: float | None = None,
) -> Trajectory:
    """Integrate ``dx_i/dt = v_t(x_i)`` of ``model`` (``mha``, ``gf``, ``usa``) on ``[t0, t_end]``.

    ``weights``: a :class:`~attnflow.weights.WeightProcess`, a constant ``(H, d, d)`` array or
    :class:`Heads`, or a callable ``t -> A | (A, V)``. ``seed`` drives stochastic weights (it
    overrides the process's own seed). The state is saved every ``save_every`` steps and at the end.
    ``record_steps`` (default: on for model ``gf``) records at every step the series that
    :func:`attnflow.edi_budget` needs (``Trajectory.steps``).

    ``checkpoint``: a :class:`~attnflow.checkpoint.Checkpointer` that writes the whole state as it
    goes; ``resume``: a :class:`~attnflow.checkpoint.Checkpoint` (or its path) of this same run to
    continue from, giving bit for bit the trajectory of an uninterrupted run. NaN/inf raise
    :class:`~attnflow.guards.NumericalInstability` carrying the last good state; a step too large for
    the weights gives a :class:`~attnflow.guards.StabilityWarning`; float32 runs whose rounding
    exceeds the integrator's error give a :class:`~attnflow.guards.PrecisionWarning`.
    ``backend`` picks the attention kernel (:data:`attnflow.backends.BACKENDS`; ``auto`` by default)
    and ``fast_tol`` the fast summation's proved relative error (default
    :data:`attnflow.backends.AUTO_FAST_TOL`); both hold for every kernel call of the run (field,
    EDI budget, diagnostics).
    """
    with kernel_options(backend, fast_tol):
        return _simulate(
            x0,
            weights,
            model=model,
            t_end=t_end,
            dt=dt,
            method=method,
            save_every=save_every,
            seed=seed,
            token_weights=token_weights,
            head_weights=head_weights,
            t0=t0,
            cluster_eps=cluster_eps,
            dtype=dtype,
            progress=progress,
            config=config,
            record_steps=record_steps,
            checkpoint=checkpoint,
            resume=resume,
            backend=backend,
        )


def _simulate(
    x0,
    weights,
    *,
    model,
    t_end,
    dt,
    method,
    save_every,
    seed,
    token_weights,
    head_weights,
    t0,
    cluster_eps,
    dtype,
    progress,
    config,
    record_steps,
    checkpoint,
    resume,
    backend,
) -> Trajectory:
    x = to_tensor(x0, dtype=dtype)
    if x.ndim != 2:
        raise ValueError(f"x0 must have shape (N, d); got {tuple(x.shape)}")
    if not bool(torch.isfinite(x).all()):
        raise ValueError("x0 contains NaN or inf")
    x = x / torch.linalg.vector_norm(x, dim=-1, keepdim=True)
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; choose one of {MODELS}")
    if not (dt > 0 and math.isfinite(dt)):
        raise ValueError(f"dt must be a positive number; got {dt}")
    if not t_end > t0:
        raise ValueError(f"t_end must be larger than t0={t0}; got {t_end}")
    n_steps = int(round((t_end - t0) / dt))
    if n_steps < 1 or abs(n_steps * dt - (t_end - t0)) > 1e-9 * max(1.0, abs(t_end - t0)):
        raise ValueError(f"t_end - t0 = {t_end - t0} must be a whole number of steps dt = {dt}")
    if int(save_every) < 1:
        raise ValueError(f"save_every must be a positive integer; got {save_every}")
    stepper = get_integrator(method)
    process = as_process(weights)
    if process.d != x.shape[1]:
        raise ValueError(f"tokens have dimension d={x.shape[1]} but the weights act on d={process.d}")
    sampler: WeightSampler = process.sampler(seed)
    a = masses(token_weights, x.shape[0], "token_weights", x)
    w = masses(head_weights, process.H, "head_weights", x)

    f = TimeField(model, sampler, a, w, x.dtype, x.device, backend=backend)
    heads_at = f.heads_at

    check_model(model, heads_at(t0))
    recorder = None
    if record_steps or (record_steps is None and model == "gf"):
        recorder = StepRecorder(f, process.derivative, stepper)
    rows, xs, As, Vs, ts = [], [], [], [], []
    any_V = False

    def record(t: float, y: torch.Tensor) -> None:
        nonlocal any_V
        heads = heads_at(t)
        if model == "gf":
            heads.check_gradient_flow()
        v = f(t, y)
        rows.append(state_diagnostics(y, heads, a, w, v, cluster_eps=cluster_eps))
        ts.append(t)
        xs.append(to_numpy(y).astype(np.float64))
        As.append(to_numpy(heads.A).astype(np.float64))
        Vs.append(to_numpy(heads.values).astype(np.float64))
        any_V = any_V or heads.V is not None

    start = _time.perf_counter()
    run_id = (
        _fingerprint(
            x0=to_numpy(x),
            a=to_numpy(a),
            w=to_numpy(w),
            model=model,
            method=method,
            dt=float(dt),
            t0=float(t0),
            n_steps=n_steps,
            save_every=int(save_every),
            seed=seed,
            cluster_eps=cluster_eps,
            process=process.describe(),
            heads0=to_numpy(heads_at(t0).values),
        )
        if checkpoint is not None or resume is not None
        else ""
    )
    monitor = _guards.Float32Monitor() if x.dtype == torch.float32 else None
    wall0, k0, t = 0.0, 0, float(t0)

    def snapshot(k: int, y: torch.Tensor, sampler_state: dict, stopped: str | None = None) -> Checkpoint:
        return Checkpoint(
            step=k,
            n_steps=n_steps,
            x=to_numpy(y).copy(),
            sampler_state=sampler_state,
            saved_t=np.array(ts),
            saved_x=np.stack(xs),
            saved_A=np.stack(As),
            saved_V=np.stack(Vs),
            any_V=any_V,
            diagnostics=as_numpy_table(rows),
            wall_time_s=wall0 + _time.perf_counter() - start,
            fingerprint=run_id,
            stopped=stopped,
            extra={
                **({} if monitor is None else {"float32": monitor.summary()}),
                # The EDI rows so far (JSON floats round-trip exactly), so a resumed run has the whole budget.
                **({} if recorder is None else {"edi_rows": [list(r) for r in recorder.rows]}),
            },
        )

    if resume is None:
        if (msg := _guards.step_warning(dt, method, heads_at(t0), model, t_end - t0)) is not None:
            _guards.warn(msg, _guards.StabilityWarning)
        record(t, x)
    else:
        ck = load_checkpoint(resume) if not isinstance(resume, Checkpoint) else resume
        k0, wall0, any_V = ck.step, ck.wall_time_s, ck.any_V
        if ck.n_steps != n_steps or ck.fingerprint != run_id:
            raise ValueError(
                "the checkpoint belongs to a different run (its inputs - tokens, weights, model, method, dt, "
                "t_end, seed or save_every - differ from these); resume it with the setup that wrote it"
            )
        sampler.set_state(ck.sampler_state)
        x = torch.from_numpy(np.array(ck.x)).to(device=x.device)
        ts.extend(float(v) for v in ck.saved_t)
        xs.extend(ck.saved_x)
        As.extend(ck.saved_A)
        Vs.extend(ck.saved_V)
        rows.extend({k: float(ck.diagnostics[k][i]) for k in ck.diagnostics} for i in range(len(ck.saved_t)))
        if monitor is not None and "float32" in ck.extra:
            s32 = ck.extra["float32"]
            monitor.rounding, monitor.budget, monitor.checks = s32["rounding_drift"], s32["edi_budget"], s32["checks"]
        if recorder is not None:
            recorder.rows = [tuple(r) for r in ck.extra.get("edi_rows", [])]
        t = t0 + k0 * dt
    if checkpoint is not None and resume is None:
        checkpoint.write(snapshot(0, x, sampler.get_state()))
    for k in range(k0 + 1, n_steps + 1):
        before = sampler.get_state()
        bad, why = False, "the tokens became NaN/inf"
        try:
            x_next = stepper.step(f, t, x, dt) if recorder is None else recorder.step(t, x, dt)
            bad = not bool(torch.isfinite(x_next).all())
            if not bad and (k % save_every == 0 or k == n_steps):
                record(t0 + k * dt, x_next)
        except OverflowError as e:
            bad, why = True, str(e).rstrip(".")
        if bad:
            sampler.set_state(before)
            if ts[-1] != t:
                record(t, x)
            last = snapshot(k - 1, x, sampler.get_state(), stopped=f"{why} at t={t0 + k * dt:.6g} (step {k})")
            raise _guards.NumericalInstability(
                f"{why} at t={t0 + k * dt:.6g} (step {k} of {n_steps}); the last good state is t={t:.6g} (step {k - 1}). "
                f"If the step dt={dt} is too large for these weights, lower it or use the implicit method='jko' for stiff "
                "cases.",
                step=k,
                t=t0 + k * dt,
                checkpoint=last,
                trajectory=_partial(last, a, w, model, method, dt, seed, config),
            )
        x = x_next
        t = t0 + k * dt
        if k % save_every == 0 or k == n_steps:
            if monitor is not None:
                monitor.check(stepper.step, model, heads_at(t), a, w, t, x, dt, weight=min(save_every, n_steps - k + 1))
        if checkpoint is not None and k < n_steps and checkpoint.due(k):
            checkpoint.write(snapshot(k, x, sampler.get_state()))
        if progress is not None:
            progress(k, n_steps)
    if monitor is not None and monitor.flagged:
        _guards.warn(monitor.message(), _guards.PrecisionWarning)
    wall = wall0 + _time.perf_counter() - start
    return Trajectory(
        t=np.array(ts),
        x=np.stack(xs),
        A=np.stack(As),
        V=np.stack(Vs) if any_V else None,
        diagnostics=as_numpy_table(rows),
        token_weights=to_numpy(a).astype(np.float64),
        head_weights=to_numpy(w).astype(np.float64),
        model=model,
        method=method,
        dt=float(dt),
        seed=seed,
        config=config,
        provenance={
            "wall_time_s": wall,
            "steps": n_steps,
            "dtype": str(x.dtype).replace("torch.", ""),
            **({"resumed_from_step": k0} if resume is not None else {}),
            **({"float32_check": monitor.summary()} if monitor is not None else {}),
        },
        steps={} if recorder is None else recorder.series(),
        steps_info={} if recorder is None else recorder.info(),
    )


def _partial(ck: Checkpoint, a, w, model, method, dt, seed, config) -> Trajectory:
    """The trajectory recorded up to a checkpoint (what a stopped run leaves)."""
    return Trajectory(
        t=ck.saved_t,
        x=ck.saved_x,
        A=ck.saved_A,
        V=ck.saved_V if ck.any_V else None,
        diagnostics=ck.diagnostics,
        token_weights=to_numpy(a).astype(np.float64),
        head_weights=to_numpy(w).astype(np.float64),
        model=model,
        method=method,
        dt=float(dt),
        seed=seed,
        config=config,
        provenance={"wall_time_s": ck.wall_time_s, "steps": ck.step, "complete": False, "stopped": ck.stopped},
    )
