"""``simulate``: integrate ``dx_i/dt = v_t(x_i)`` from ``t0`` to ``t_end`` and record a :class:`Trajectory`.

Data flows one way: initial tokens + weight process -> integrator -> trajectory -> diagnostics. The
stepping loop is :mod:`attnflow.solve.loop`; what it records and checks are observers
(:mod:`attnflow.solve.observers`).
"""

from __future__ import annotations

import math
import time as _time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from attnflow.analysis.edi import StepRecorder
from attnflow.core.arrays import ArrayLike, to_numpy, to_tensor
from attnflow.core.geometry import project_tangent
from attnflow.core.heads import Heads
from attnflow.dynamics.fields import (
    MODELS,
    FieldStats,
    check_model,
    field_stats,
    identity_values,
    masses,
    mixed_field,
    split_means,
)
from attnflow.io.checkpoint import Checkpoint, Checkpointer, load_checkpoint
from attnflow.io.checkpoint import fingerprint as _fingerprint
from attnflow.io.trajectory import Trajectory
from attnflow.kernels import small as _small
from attnflow.kernels.dispatch import KernelOptions
from attnflow.schemes.integrators import ADAPTIVE, EmbeddedPair, Integrator, get_integrator
from attnflow.solve import guards as _guards
from attnflow.solve.loop import AdaptiveStats, Controller, Costs, Observer, StepFailed, run_adaptive, run_loop
from attnflow.solve.observers import CheckpointWriter, PrecisionCheck, ProgressReport, Saver
from attnflow.weights.processes import Constant, Layers, WeightProcess, WeightSampler, as_process


class TimeField:
    """``(t, x) -> v_t(x)`` for one model, one weight realisation and fixed masses (an integrator's ``Field``)."""

    def __init__(
        self,
        model: str,
        sampler: WeightSampler,
        a: torch.Tensor,
        w: torch.Tensor,
        dtype: torch.dtype,
        device: torch.device,
        options: KernelOptions | None = None,
    ) -> None:
        self.model, self.sampler, self.a, self.w = model, sampler, a, w
        self.dtype, self.device, self.options = dtype, device, options
        # The last evaluate()d state (t, x, x's version, v): the step that starts there reuses v.
        self._kept: tuple[float, torch.Tensor, int, torch.Tensor] | None = None
        self._raw: Heads | None = None  # the sampler's last heads and their conversion to dtype/device
        self._heads: Heads | None = None
        self.passes = 0  # kernel passes made (the cost counter the overhead tests read)
        #: Inside an adaptive step from ``left_after``: later stage times take the weights' left limit,
        #: so a step that ends where ``Layers`` jump sees the old block throughout.
        self.left_after: float | None = None

    def heads_at(self, t: float) -> Heads:
        raw = self.sampler.left(t) if self.left_after is not None and t > self.left_after else self.sampler(t)
        if raw is not self._raw:  # constant weights: the same heads every step, converted once
            self._raw, self._heads = raw, raw.to(dtype=self.dtype, device=self.device)
        assert self._heads is not None
        return self._heads

    def __call__(self, t: float, x: torch.Tensor) -> torch.Tensor:
        kept = self._kept
        if kept is not None and kept[0] == t and kept[1] is x and kept[2] == x._version:
            return kept[3]
        self.passes += 1
        return project_tangent(x, mixed_field(x, self.heads_at(t), self.a, self.w, self.model, options=self.options))

    def evaluate(self, t: float, x: torch.Tensor) -> tuple[torch.Tensor, FieldStats | None]:
        """``v_t(x)`` and, from the same kernel pass, the statistics of the heads' ``A`` alone
        (``out_h`` with ``V = A`` and ``log Z_h``) that ``F``, ``b`` and ``|dF|`` need; ``None`` for
        heads with biases, masks or rotary embeddings, whose ``log Z`` is not that of ``A``.

        ``v`` is kept, so the step that starts from ``(t, x)`` does not evaluate it again.
        """
        heads = self.heads_at(t)
        if not heads.plain:
            return self(t, x), None
        self.passes += 1
        if heads.V is None:  # V = A: the field's own pass is the diagnostics' pass
            v_st = a_st = field_stats(x, heads, self.a, self.w, options=self.options)
        else:  # one pass with identity values gives both (values are linear for plain heads)
            means = field_stats(x, identity_values(heads), self.a, self.w, options=self.options)
            v_st, a_st = split_means(means, heads)
        v = project_tangent(x, v_st.mixed_output(self.model))
        self._kept = (t, x, x._version, v)
        return v, a_st


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
    rtol: float = 1e-6,
    atol: float = 1e-9,
    dt_min: float | None = None,
    dt_max: float | None = None,
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
    ``backend`` picks the attention kernel (:data:`attnflow.kernels.dispatch.BACKENDS`; ``auto`` by
    default) and ``fast_tol`` the fast summation's proved relative error (default
    :data:`attnflow.kernels.dispatch.AUTO_FAST_TOL`): one :class:`~attnflow.kernels.dispatch.KernelOptions`
    built from them is passed to every kernel call of the run (field, EDI budget, diagnostics, float32 check).

    The run is a plain stepping loop (:func:`attnflow.solve.loop.run_loop`) with observers
    (:mod:`attnflow.solve.observers`); the wall time of each part is in ``provenance["seconds"]``.

    Adaptive methods (``method="bosh3"``, ``"dopri5"`` or ``"dop853"``, :data:`attnflow.schemes.integrators.ADAPTIVE`)
    control the local error (:func:`attnflow.solve.loop.run_adaptive`): ``rtol``, ``atol`` set the
    error norm, ``dt`` is the first step tried, ``dt_min`` / ``dt_max`` bound the step (``dt_max``
    defaults to the save spacing). The state is saved exactly at ``t0 + k dt save_every`` and at
    ``t_end`` (which need not be a whole number of ``dt``). Steps stop where ``Layers`` jump; OU weights
    are drawn on the grid ``j dt`` (exact transitions, linear in between: a function of the seed and
    ``t`` only, so rejected steps do not change the path) and steps stop at its nodes. ``progress``
    gets ``(permille of [t0, t_end] done, 1000)``; the float32 monitor does not run. Accepted and
    rejected steps and field evaluations are in ``provenance["adaptive"]``.
    """
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
        options=KernelOptions(backend, fast_tol),
        tolerances=(rtol, atol, dt_min, dt_max),
    )


def _simulate(
    x0: ArrayLike,
    weights: WeightProcess | ArrayLike | Callable | Heads,
    *,
    model: str,
    t_end: float,
    dt: float,
    method: str,
    save_every: int,
    seed: int | None,
    token_weights: ArrayLike | None,
    head_weights: ArrayLike | None,
    t0: float,
    cluster_eps: float,
    dtype: torch.dtype | None,
    progress: Callable[[int, int], None] | None,
    config: dict[str, Any] | None,
    record_steps: bool | None,
    checkpoint: Checkpointer | None,
    resume: Checkpoint | str | None,
    options: KernelOptions,
    tolerances: tuple[float, float, float | None, float | None] = (1e-6, 1e-9, None, None),
) -> Trajectory:
    if method in ADAPTIVE:
        return _simulate_adaptive(
            x0, weights, model=model, t_end=t_end, dt=dt, method=method, save_every=save_every, seed=seed,
            token_weights=token_weights, head_weights=head_weights, t0=t0, cluster_eps=cluster_eps, dtype=dtype,
            progress=progress, config=config, record_steps=record_steps, checkpoint=checkpoint, resume=resume,
            options=options, tolerances=tolerances,
        )  # fmt: skip
    x = _initial_tokens(x0, dtype, model)
    n_steps = step_count(t0, t_end, dt)
    if int(save_every) < 1:
        raise ValueError(f"save_every must be a positive integer; got {save_every}")
    stepper = get_integrator(method)
    process = as_process(weights)
    if process.d != x.shape[1]:
        raise ValueError(f"tokens have dimension d={x.shape[1]} but the weights act on d={process.d}")
    sampler: WeightSampler = process.sampler(seed)
    a = masses(token_weights, x.shape[0], "token_weights", x)
    w = masses(head_weights, process.H, "head_weights", x)

    f = TimeField(model, sampler, a, w, x.dtype, x.device, options)
    heads_at = f.heads_at
    check_model(model, heads_at(t0))
    recorder = None
    if record_steps or (record_steps is None and model == "gf"):
        recorder = StepRecorder(f, process.derivative, stepper)
    saver = Saver(_diagnostics_pass(f, recorder), heads_at, a, w, cluster_eps, check_gf=model == "gf", options=options)
    monitor = _guards.Float32Monitor() if x.dtype == torch.float32 else None

    start = _time.perf_counter()
    costs = Costs({})  # wall time by part (the initial state's diagnostics count as diagnostics)
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
            backend=options.backend,
            fast_tol=options.tol,
        )  # fmt: skip
        if checkpoint is not None or resume is not None
        else ""
    )
    wall0, k0 = 0.0, 0

    def snapshot(k: int, y: torch.Tensor, stopped: str | None = None) -> Checkpoint:
        return Checkpoint(
            step=k, n_steps=n_steps, x=to_numpy(y).copy(), sampler_state=sampler.get_state(),
            **saver.checkpoint_fields(),
            wall_time_s=wall0 + _time.perf_counter() - start, fingerprint=run_id, stopped=stopped,
            extra={
                **({} if monitor is None else {"float32": monitor.summary()}),
                # The EDI rows so far (JSON floats round-trip exactly), so a resumed run has the whole budget.
                **({} if recorder is None else {"edi_rows": [list(r) for r in recorder.rows[:k]]}),
            },
        )  # fmt: skip

    if resume is None:
        if (msg := _guards.step_warning(dt, method, heads_at(t0), model, t_end - t0)) is not None:
            _guards.warn(msg, _guards.StabilityWarning)
        tic = _time.perf_counter()
        saver.record(float(t0), x)
        costs.add(saver.name, _time.perf_counter() - tic)
        if (why := _guards.state_problem(x, saver.rows[0])) is not None:
            raise ValueError(f"the initial state cannot be simulated: {why}")
    else:
        ck = load_checkpoint(resume) if not isinstance(resume, Checkpoint) else resume
        k0, wall0 = ck.step, ck.wall_time_s
        if ck.n_steps != n_steps or ck.fingerprint != run_id:
            raise ValueError(
                "the checkpoint belongs to a different run (its inputs - tokens, weights, model, method, dt, "
                "t_end, seed or save_every - differ from these); resume it with the setup that wrote it"
            )
        sampler.set_state(ck.sampler_state)
        x = torch.from_numpy(np.array(ck.x)).to(device=x.device)
        saver.restore(ck)
        if monitor is not None and "float32" in ck.extra:
            s32 = ck.extra["float32"]
            # "edi_budget" is the key checkpoints of earlier versions wrote for the step error.
            monitor.rounding, monitor.checks = s32["rounding_drift"], s32["checks"]
            monitor.budget = s32["step_error"] if "step_error" in s32 else s32["edi_budget"]
        if recorder is not None:
            recorder.rows = [tuple(r) for r in ck.extra.get("edi_rows", [])]
    if checkpoint is not None and resume is None:
        checkpoint.write(snapshot(0, x))

    def step(t: float, y: torch.Tensor, h: float) -> torch.Tensor:
        return stepper.step(f, t, y, h) if recorder is None else recorder.step(t, y, h)

    def rollback() -> Callable[[], None]:
        before = sampler.get_state()
        return lambda: sampler.set_state(before)

    observers: list[Observer] = []
    if monitor is not None:
        observers.append(
            PrecisionCheck(
                monitor, stepper.step, model, heads_at, a, w, dt, int(save_every), options,
                field_at=saver.field_at, one_stage=stepper.weights is not None and len(stepper.weights) == 1,
            )
        )  # fmt: skip
    if checkpoint is not None:
        observers.append(CheckpointWriter(checkpoint, snapshot))
    if progress is not None:
        observers.append(ProgressReport(progress))
    try:
        x = run_loop(
            step, x, t0=t0, dt=dt, k0=k0, n_steps=n_steps, save_every=int(save_every),
            recorders=[saver], observers=observers, rollback=rollback, costs=costs, check=_guards.state_problem,
        )  # fmt: skip
    except StepFailed as e:
        raise _instability(e, saver, snapshot, recorder, t0, dt, n_steps, a, w, model, method, seed, config) from None
    if monitor is not None and monitor.flagged:
        _guards.warn(monitor.message(), _guards.PrecisionWarning)
    wall = wall0 + _time.perf_counter() - start
    return Trajectory(
        **saver.arrays(),
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
            "seconds": costs.rounded(),
            **({"resumed_from_step": k0} if resume is not None else {}),
            **({"float32_check": monitor.summary()} if monitor is not None else {}),
        },
        steps={} if recorder is None else recorder.series(),
        steps_info={} if recorder is None else recorder.info(),
    )


def _initial_tokens(x0: ArrayLike, dtype: torch.dtype | None, model: str) -> torch.Tensor:
    """``x0`` checked (shape ``(N, d)``, finite) and put on the sphere; ``model`` checked too."""
    x = to_tensor(x0, dtype=dtype)
    if x.ndim != 2:
        raise ValueError(f"x0 must have shape (N, d); got {tuple(x.shape)}")
    if not bool(torch.isfinite(x).all()):
        raise ValueError("x0 contains NaN or inf")
    x = x / torch.linalg.vector_norm(x, dim=-1, keepdim=True)
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; choose one of {MODELS}")
    return x


def _diagnostics_pass(
    f: TimeField, recorder: StepRecorder | None
) -> Callable[[float, torch.Tensor], tuple[torch.Tensor, FieldStats | None]]:
    """What the saver evaluates at a saved state: the EDI recorder's end-of-step pass when it has just
    made it (model ``gf``, plain heads), else the field's own shared pass (:meth:`TimeField.evaluate`)."""

    def evaluate(t: float, y: torch.Tensor) -> tuple[torch.Tensor, FieldStats | None]:
        last = None if recorder is None or f.model != "gf" else recorder.last
        if last is not None and last[0] == t and last[1] is y and f.heads_at(t).plain:
            return last[2], last[3]
        return f.evaluate(t, y)

    return evaluate


def step_count(t0: float, t_end: float, dt: float) -> int:
    """The number of steps ``dt`` from ``t0`` to ``t_end`` (which must be a whole number of them)."""
    if not (dt > 0 and math.isfinite(dt)):
        raise ValueError(f"dt must be a positive number; got {dt}")
    if not t_end > t0:
        raise ValueError(f"t_end must be larger than t0={t0}; got {t_end}")
    n_steps = int(round((t_end - t0) / dt))
    if n_steps < 1 or abs(n_steps * dt - (t_end - t0)) > 1e-9 * max(1.0, abs(t_end - t0)):
        raise ValueError(f"t_end - t0 = {t_end - t0} must be a whole number of steps dt = {dt}")
    return n_steps


def _instability(
    e: StepFailed,
    saver: Saver,
    snapshot: Callable[..., Checkpoint],
    recorder: StepRecorder | None,
    t0: float,
    dt: float,
    n_steps: int,
    a: torch.Tensor,
    w: torch.Tensor,
    model: str,
    method: str,
    seed: int | None,
    config: dict[str, Any] | None,
) -> _guards.NumericalInstability:
    """The error of a failed step, carrying the last good state (saved if it was not) and the run so far."""
    k, t = e.k, e.t
    if saver.ts[-1] != t:
        saver.record(t, e.x)
    if recorder is not None:
        del recorder.rows[k - 1 :]
    last = snapshot(k - 1, e.x, stopped=f"{e.why} at t={t0 + k * dt:.6g} (step {k})")
    return _guards.NumericalInstability(
        f"{e.why} at t={t0 + k * dt:.6g} (step {k} of {n_steps}); the last good state is t={t:.6g} (step {k - 1}). "
        f"If the step dt={dt} is too large for these weights, lower it or use the implicit method='jko' for stiff "
        "cases.",
        step=k, t=t0 + k * dt, checkpoint=last, trajectory=_partial(last, a, w, model, method, dt, seed, config),
    )  # fmt: skip


def _partial(
    ck: Checkpoint,
    a: torch.Tensor,
    w: torch.Tensor,
    model: str,
    method: str,
    dt: float,
    seed: int | None,
    config: dict[str, Any] | None,
) -> Trajectory:
    """The trajectory recorded up to a checkpoint (what a stopped run leaves)."""
    return Trajectory(
        t=ck.saved_t, x=ck.saved_x, A=ck.saved_A, V=ck.saved_V if ck.any_V else None, diagnostics=ck.diagnostics,
        token_weights=to_numpy(a).astype(np.float64), head_weights=to_numpy(w).astype(np.float64), model=model,
        method=method, dt=float(dt), seed=seed, config=config,
        provenance={"wall_time_s": ck.wall_time_s, "steps": ck.step, "complete": False, "stopped": ck.stopped},
    )  # fmt: skip


def save_grid(t0: float, t_end: float, spacing: float) -> list[float]:
    """The save times of an adaptive run: ``t0 + k spacing`` below ``t_end``, then ``t_end``."""
    n = math.floor((t_end - t0) / spacing * (1 + 1e-12))
    times = [t0 + k * spacing for k in range(1, n + 1)]
    times = [s for s in times if s < t_end - 1e-9 * max(1.0, abs(t_end - t0))]
    return [*times, float(t_end)]


@dataclass
class _CompiledStep:
    """What :mod:`attnflow.kernels.small` needs besides the state: the tableau, masses, the heads' arrays."""

    tableau: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, bool]
    a: np.ndarray
    w: np.ndarray
    _last: tuple[Heads, np.ndarray, np.ndarray] | None = None

    def matrices(self, heads: Heads) -> tuple[np.ndarray, np.ndarray]:
        """``(A, V)`` as float64 arrays, converted once per distinct heads object."""
        if self._last is None or self._last[0] is not heads:
            self._last = (heads, heads.A.double().numpy(), heads.values.double().numpy())
        return self._last[1], self._last[2]


#: Up to this many kernel values per evaluation (``H N^2``), in dimension ``d <= COMPILED_MAX_D``, an
#: adaptive run steps through the compiled small-cloud path. Measured one field evaluation against the
#: torch kernel on one thread (d = 3, one head): 9.4x faster at N = 64, 4.4x at 256, 1.1-1.2x at
#: 512-1024, 0.7x at 2048 (docs/performance.md "Small clouds").
COMPILED_MAX_PAIRS = 1024 * 1024
#: The compiled loops sum over ``d`` serially; BLAS products win for wide tokens.
COMPILED_MAX_D = 16


def _compiled_step(
    pair: EmbeddedPair, process: WeightProcess, x: torch.Tensor, a: torch.Tensor, w: torch.Tensor, model: str,
    options: KernelOptions, recording: bool,
) -> _CompiledStep | None:  # fmt: skip
    """The compiled step's inputs when it serves this run, else ``None``: constant or layer weights,
    plain heads, float64 on the CPU, the automatic backend, no EDI step recorder, a small cloud."""
    if not _small.AVAILABLE or recording or options.backend != "auto" or x.dtype != torch.float64:
        return None
    if x.device.type != "cpu" or x.shape[0] ** 2 * process.H > COMPILED_MAX_PAIRS or x.shape[1] > COMPILED_MAX_D:
        return None
    if isinstance(process, Constant):
        all_heads = [process.heads]
    elif isinstance(process, Layers):
        all_heads = process.layers
    else:
        return None
    if not all(_small.supported(h, "cpu", x.dtype) for h in all_heads):
        return None
    return _CompiledStep(pair.arrays(), to_numpy(a).astype(np.float64), to_numpy(w).astype(np.float64))


def _simulate_adaptive(
    x0: ArrayLike,
    weights: WeightProcess | ArrayLike | Callable | Heads,
    *,
    model: str,
    t_end: float,
    dt: float,
    method: str,
    save_every: int,
    seed: int | None,
    token_weights: ArrayLike | None,
    head_weights: ArrayLike | None,
    t0: float,
    cluster_eps: float,
    dtype: torch.dtype | None,
    progress: Callable[[int, int], None] | None,
    config: dict[str, Any] | None,
    record_steps: bool | None,
    checkpoint: Checkpointer | None,
    resume: Checkpoint | str | None,
    options: KernelOptions,
    tolerances: tuple[float, float, float | None, float | None],
) -> Trajectory:
    """:func:`simulate` with an embedded pair and error control (see its docstring)."""
    rtol, atol, dt_min, dt_max = tolerances
    x = _initial_tokens(x0, dtype, model)
    if not (dt > 0 and math.isfinite(dt)):
        raise ValueError(f"dt must be a positive number; got {dt}")
    if not (math.isfinite(t_end) and t_end > t0):
        raise ValueError(f"t_end must be larger than t0={t0}; got {t_end}")
    if int(save_every) < 1:
        raise ValueError(f"save_every must be a positive integer; got {save_every}")
    if not (rtol >= 0 and atol >= 0 and rtol + atol > 0):
        raise ValueError(f"rtol and atol must be non-negative and not both zero; got rtol={rtol}, atol={atol}")
    spacing = float(dt) * int(save_every)
    lo = 0.0 if dt_min is None else float(dt_min)
    hi = spacing if dt_max is None else float(dt_max)
    if not (0 <= lo <= hi and hi > 0):
        raise ValueError(f"need 0 <= dt_min <= dt_max and dt_max > 0; got dt_min={dt_min}, dt_max={dt_max}")
    pair = ADAPTIVE[method]
    process = as_process(weights)
    if process.d != x.shape[1]:
        raise ValueError(f"tokens have dimension d={x.shape[1]} but the weights act on d={process.d}")
    sampler: WeightSampler = process.adaptive_sampler(seed, float(dt))
    a = masses(token_weights, x.shape[0], "token_weights", x)
    w = masses(head_weights, process.H, "head_weights", x)
    f = TimeField(model, sampler, a, w, x.dtype, x.device, options)
    heads_at = f.heads_at
    check_model(model, heads_at(t0))
    ctrl = Controller(k=min(pair.order, pair.embedded_order) + 1, dt=min(float(dt), hi), rtol=float(rtol),
                      atol=float(atol), dt_min=lo, dt_max=hi)  # fmt: skip
    stats = AdaptiveStats()
    evals = [0]
    err_box: list[torch.Tensor] = []

    def counted(g: Callable[[float, torch.Tensor], torch.Tensor]) -> Callable[[float, torch.Tensor], torch.Tensor]:
        def call(t: float, y: torch.Tensor) -> torch.Tensor:
            evals[0] += 1
            return g(t, y)

        return call

    def pair_step(g: Any, t: float, y: torch.Tensor, h: float) -> torch.Tensor:
        y1, e, _ = pair.attempt(counted(g), t, y, h)
        err_box[:] = [e]
        return y1

    recorder = None
    if record_steps or (record_steps is None and model == "gf"):
        recorder = StepRecorder(f, process.derivative, Integrator(pair.name, pair.order, pair_step, pair.b))
    saver = Saver(_diagnostics_pass(f, recorder), heads_at, a, w, cluster_eps, check_gf=model == "gf", options=options)
    saves = save_grid(float(t0), float(t_end), spacing)
    start = _time.perf_counter()
    costs = Costs({})  # wall time by part (the initial state's diagnostics count as diagnostics)
    run_id = (
        _fingerprint(
            x0=to_numpy(x),
            a=to_numpy(a),
            w=to_numpy(w),
            model=model,
            method=method,
            dt=float(dt),
            t0=float(t0),
            t_end=float(t_end),
            save_every=int(save_every),
            seed=seed,
            cluster_eps=cluster_eps,
            process=process.describe(),
            heads0=to_numpy(heads_at(t0).values),
            backend=options.backend,
            fast_tol=options.tol,
            tolerances=[float(rtol), float(atol), lo, hi],
        )  # fmt: skip
        if checkpoint is not None or resume is not None
        else ""
    )
    wall0, k0 = 0.0, 0
    now = {"t": float(t0)}

    def snapshot(k: int, y: torch.Tensor, stopped: str | None = None) -> Checkpoint:
        return Checkpoint(
            step=k, n_steps=0, x=to_numpy(y).copy(), sampler_state=sampler.get_state(),
            **saver.checkpoint_fields(),
            wall_time_s=wall0 + _time.perf_counter() - start, fingerprint=run_id, stopped=stopped,
            extra={
                "adaptive": {"t": now["t"], "controller": ctrl.state(), "stats": stats.as_dict(), "evaluations": evals[0]},
                **({} if recorder is None else {"edi_rows": [list(r) for r in recorder.rows]}),
            },
        )  # fmt: skip

    if resume is None:
        tic = _time.perf_counter()
        saver.record(float(t0), x)
        costs.add(saver.name, _time.perf_counter() - tic)
        if (why := _guards.state_problem(x, saver.rows[0])) is not None:
            raise ValueError(f"the initial state cannot be simulated: {why}")
    else:
        ck = load_checkpoint(resume) if not isinstance(resume, Checkpoint) else resume
        k0, wall0 = ck.step, ck.wall_time_s
        if ck.fingerprint != run_id or "adaptive" not in ck.extra:
            raise ValueError(
                "the checkpoint belongs to a different run (its inputs - tokens, weights, model, method, dt, "
                "tolerances, t_end, seed or save_every - differ from these); resume it with the setup that wrote it"
            )
        ad = ck.extra["adaptive"]
        now["t"] = float(ad["t"])
        ctrl.set_state(ad["controller"])
        st = ad["stats"]
        stats.accepted, stats.rejected = int(st["accepted_steps"]), int(st["rejected_steps"])
        if st["dt_smallest"] is not None:
            stats.dt_smallest, stats.dt_largest = float(st["dt_smallest"]), float(st["dt_largest"])
        evals[0] = int(ad["evaluations"])
        sampler.set_state(ck.sampler_state)
        x = torch.from_numpy(np.array(ck.x)).to(device=x.device)
        saver.restore(ck)
        if recorder is not None:
            recorder.rows = [tuple(r) for r in ck.extra.get("edi_rows", [])]
    if checkpoint is not None and resume is None:
        checkpoint.write(snapshot(0, x))

    fsal: dict[str, Any] = {}  # the last trial's (t, x, v_t(x)) at its start and end: reused when stepping on from them

    def attempt(t: float, y: torch.Tensor, h: float) -> tuple[torch.Tensor, float]:
        f.left_after = t
        try:
            if recorder is not None:
                y1 = recorder.step(t, y, h)
                e = err_box[0]
            else:
                k1 = None
                for key in ("start", "end"):
                    c = fsal.get(key)
                    if c is not None and c[0] == t and c[1] is y:
                        k1 = c[2]
                if compiled is not None:
                    return compiled_attempt(t, y, h, k1)
                if k1 is None:
                    k1 = counted(f)(t, y)
                y1, e, k_last = pair.attempt(counted(f), t, y, h, k1=k1)
                fsal["start"], fsal["end"] = (t, y, k1), (t + h, y1, k_last)
        finally:
            f.left_after = None
        return y1, ctrl.norm(y, y1, e)

    # Small clouds: the whole trial step in one compiled call (attnflow.kernels.small); the heads are
    # those of the step's start (constant or layer weights, whose breaks the loop steps onto).
    compiled = _compiled_step(pair, process, x, a, w, model, options, recorder is not None)

    def compiled_attempt(t: float, y: torch.Tensor, h: float, k1: torch.Tensor | None) -> tuple[torch.Tensor, float]:
        assert compiled is not None
        hd = heads_at(t)
        A_np, V_np = compiled.matrices(hd)
        y_np, err, k_last_np, ok = _small.embedded_attempt(
            y.numpy(), h, A_np, V_np, compiled.w, compiled.a, model, compiled.tableau, ctrl.rtol, ctrl.atol,
            k1=None if k1 is None else k1.numpy(),
        )  # fmt: skip
        evals[0] += pair.stages - (1 if k1 is not None else 0)
        y1 = torch.from_numpy(y_np)
        fsal["start"], fsal["end"] = (t, y, k1), (t + h, y1, torch.from_numpy(k_last_np))
        return y1, (err if ok else math.inf)

    def rollback(t: float) -> Callable[[], None]:
        sampler.forget_before(t)
        before = sampler.get_state()
        mark = recorder.mark() if recorder is not None else None

        def undo() -> None:
            sampler.set_state(before)
            if recorder is not None and mark is not None:
                recorder.restore(mark)

        return undo

    def on_accept(t: float, h: float, hit_break: bool) -> None:
        now["t"] = t
        if hit_break and sampler.left(t) is not sampler(t):  # the weights jumped at t
            fsal.clear()
            if recorder is not None:
                recorder.weights_jump(heads_at(t))

    observers: list[Observer] = []
    if checkpoint is not None:
        observers.append(CheckpointWriter(checkpoint, snapshot))
    if progress is not None:
        span = float(t_end) - float(t0)
        report = progress
        observers.append(ProgressReport(lambda k, n: report(int(1000 * (now["t"] - t0) / span), 1000)))
    try:
        x = run_adaptive(
            attempt, x, t=now["t"], t_end=float(t_end), save_times=saves, controller=ctrl,
            next_break=sampler.next_break, k0=k0, recorders=[saver], observers=observers, rollback=rollback,
            on_accept=on_accept, costs=costs, stats=stats,
        )  # fmt: skip
    except StepFailed as e:
        if saver.ts[-1] != e.t:
            saver.record(e.t, e.x)
        last = snapshot(e.k - 1, e.x, stopped=f"{e.why} at t={e.t:.6g} (step {e.k})")
        raise _guards.NumericalInstability(
            f"{e.why} at t={e.t:.6g} (adaptive step {e.k}, dt={ctrl.dt:.3g}); the last good state is t={e.t:.6g}. "
            "Loosen rtol/atol, lower dt_min, or for stiff cases use the implicit method='jko'.",
            step=e.k, t=e.t, checkpoint=last,
            trajectory=_partial(last, a, w, model, method, dt, seed, config),
        ) from None  # fmt: skip
    wall = wall0 + _time.perf_counter() - start
    adaptive = {
        **stats.as_dict(),
        "field_evaluations": evals[0],
        "rtol": float(rtol),
        "atol": float(atol),
        "dt_min": lo,
        "dt_max": hi,
        "dt_next": ctrl.dt,
        "compiled": compiled is not None,
    }
    return Trajectory(
        **saver.arrays(),
        token_weights=to_numpy(a).astype(np.float64),
        head_weights=to_numpy(w).astype(np.float64),
        model=model,
        method=method,
        dt=float(dt),
        seed=seed,
        config=config,
        provenance={
            "wall_time_s": wall,
            "steps": stats.accepted,
            "dtype": str(x.dtype).replace("torch.", ""),
            "seconds": costs.rounded(),
            "adaptive": adaptive,
            **({"resumed_from_step": k0} if resume is not None else {}),
        },
        steps={} if recorder is None else recorder.series(),
        steps_info={} if recorder is None else recorder.info(),
    )
