"""``solve``: a :class:`~attnflow.solve.problem.Problem`, a stepper, a step controller and what to save -> a :class:`Trajectory`.

The diffrax way: the pieces are objects, and one loop (:func:`attnflow.solve.loop.integrate`) runs
every combination. The stepper comes from the tableau registry
(:data:`attnflow.schemes.integrators.METHODS`: explicit Runge-Kutta, the implicit ``jko``, the
embedded pairs); the controller is a :class:`~attnflow.solve.controllers.ConstantStep` (fixed
steps) or a :class:`~attnflow.solve.controllers.PIController` (error control, embedded pairs
only); :class:`~attnflow.solve.saveat.SaveAt` says which states are saved. What the run records and
checks are observers (:mod:`attnflow.solve.observers`): the saver and its diagnostics, the EDI
recorder (model ``gf``), the float32 check, checkpoints, progress. Every state of every mode passes
the same state guard, and float32 runs get the float32 check in every mode.
"""

from __future__ import annotations

import logging
import time as _time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from attnflow.analysis.edi import StepRecorder
from attnflow.config.spec import RunSpec
from attnflow.core.arrays import to_numpy
from attnflow.core.errors import FloatRangeError, Hint, InputError
from attnflow.core.geometry import project_tangent, retract
from attnflow.core.heads import Heads
from attnflow.core.threads import ThreadPolicy
from attnflow.core.trajectory import DeferredDiagnostics, Trajectory
from attnflow.dynamics.fields import FieldStats, check_model, field_stats, identity_values, mixed_field, split_means
from attnflow.io.checkpoint import Checkpoint, Checkpointer, load_checkpoint
from attnflow.io.checkpoint import fingerprint as _fingerprint
from attnflow.kernels import small as _small
from attnflow.kernels.announce import prepare
from attnflow.kernels.dispatch import KernelOptions
from attnflow.schemes.integrators import ADAPTIVE, DOP853Pair, EmbeddedPair, Integrator, get_integrator
from attnflow.solve import guards as _guards
from attnflow.solve import saveat as _saveat
from attnflow.solve.controllers import ConstantStep, PIController
from attnflow.solve.loop import AdaptiveStats, Costs, Evaluation, Observer, StepFailed, Trial, integrate
from attnflow.solve.observers import CheckpointWriter, PrecisionCheck, ProgressReport, Saver
from attnflow.solve.problem import Problem
from attnflow.solve.saveat import SaveAt, save_grid
from attnflow.weights.processes import Constant, Layers, WeightSampler

__all__ = ["solve", "TimeField", "Stepper", "stepper"]

_log = logging.getLogger(__name__)

#: A stepper: a fixed-step :class:`Integrator` or an :class:`EmbeddedPair` (which also steps fixed).
Stepper = Integrator | EmbeddedPair


def stepper(method: str) -> Stepper:
    """The stepper named ``method`` from the registry (an embedded pair for ``bosh3``/``dopri5``)."""
    if isinstance(method, str) and method in ADAPTIVE:
        return ADAPTIVE[method]
    return get_integrator(method)


class TimeField:
    """``(t, x) -> v_t(x)`` for one model, one weight realisation and fixed masses (an integrator's ``Field``)."""

    def __init__(
        self,
        model: str,
        sampler: WeightSampler,
        a: torch.Tensor,
        w: torch.Tensor,
        dtype: torch.dtype,
        device: torch.device | str,
        options: KernelOptions | None = None,
    ) -> None:
        self.model, self.sampler, self.a, self.w = model, sampler, a, w
        self.dtype, self.device, self.options = dtype, device, options
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
        self.passes += 1
        return project_tangent(x, mixed_field(x, self.heads_at(t), self.a, self.w, self.model, options=self.options))

    def evaluate(self, t: float, x: torch.Tensor) -> tuple[torch.Tensor, FieldStats | None]:
        """``v_t(x)`` and, from the same kernel pass, the statistics of the heads' ``A`` alone
        (``out_h`` with ``V = A`` and ``log Z_h``) that ``F``, ``b`` and ``|dF|`` need; ``None`` for
        heads with biases, masks or rotary embeddings, whose ``log Z`` is not that of ``A``."""
        heads = self.heads_at(t)
        if not heads.plain:
            return self(t, x), None
        self.passes += 1
        if heads.V is None:  # V = A: the field's own pass is the diagnostics' pass
            v_st = a_st = field_stats(x, heads, self.a, self.w, options=self.options)
        else:  # one pass with identity values gives both (values are linear for plain heads)
            means = field_stats(x, identity_values(heads), self.a, self.w, options=self.options)
            v_st, a_st = split_means(means, heads)
        return project_tangent(x, v_st.mixed_output(self.model)), a_st


@dataclass
class _Run:
    """What the parts of one solve share (the loop's closures read and write it)."""

    k0: int = 0
    wall0: float = 0.0
    t: float = 0.0
    evaluations: int = 0
    stats: AdaptiveStats = field(default_factory=AdaptiveStats)


def solve(
    problem: Problem,
    method: Stepper,
    controller: ConstantStep | PIController,
    saveat: SaveAt,
    *,
    record_steps: bool | None = None,
    checkpoint: Checkpointer | None = None,
    resume: Checkpoint | str | None = None,
    progress: Callable[[int, int], None] | None = None,
    observers: Sequence[Observer] = (),
    config: dict[str, Any] | None = None,
    spec: RunSpec | None = None,
) -> Trajectory:
    """Integrate ``problem`` with ``method`` under ``controller``, saving what ``saveat`` says.

    ``ConstantStep(dt)`` takes ``t_end - t0`` in whole steps, saved every ``saveat.every`` steps
    (and at the end). ``PIController`` needs an embedded pair and ``SaveAt(every=k)`` means the
    times ``t0 + j k dt0`` (hit exactly) and ``t_end``; steps also stop where ``Layers`` jump, and OU
    weights are drawn on the grid ``j dt0`` (exact transitions, linear in between: a function of the
    seed and ``t`` only, so rejected steps do not change the path). ``record_steps`` (default: on for
    model ``gf``) records the per-step EDI series. ``checkpoint`` / ``resume``: write and continue
    from :class:`~attnflow.io.checkpoint.Checkpoint` files bit for bit. ``progress(done, total)``:
    the run is ``done / total`` complete (steps of ``n`` for fixed steps, permille of ``[t0, t_end]``
    for adaptive ones). ``observers`` see every accepted state after the built-in ones.

    Raises :class:`~attnflow.solve.guards.NumericalInstability` (carrying the last good state) when
    a state fails the guard; :class:`~attnflow.core.errors.InputError` for a controller that does
    not fit the stepper.
    """
    if isinstance(controller, PIController) and not isinstance(method, EmbeddedPair):
        raise InputError(
            f"method {method.name!r} has no error estimate: adaptive steps (rtol, atol, dt_min, dt_max) need an "
            f"embedded pair, one of {', '.join(ADAPTIVE)}",
            hint=Hint("method"),
        )
    choice = problem.thread_choice()
    _log.info("threads: %s", choice.reason)
    policy = ThreadPolicy(choice.threads)

    def deferred(make: Callable[[], dict[str, np.ndarray]]) -> DeferredDiagnostics:
        # Made later, with the run's thread count (the same reductions, the same bits).
        def under_the_runs_threads() -> dict[str, np.ndarray]:
            with policy.applied(problem.pairs):
                return make()

        return DeferredDiagnostics(under_the_runs_threads)

    with policy.applied(problem.pairs):
        traj = _solve(
            problem, method, controller, saveat, record_steps, checkpoint, resume, progress, observers, config, spec,
            deferred,
        )  # fmt: skip
    traj.provenance["threads"] = choice.as_dict()
    return traj


@dataclass
class _Schedule:
    """How one run steps and saves: the stepper, the controller's state, the save times, the weights' sampler."""

    adaptive: bool
    #: The embedded pair (``None`` for a fixed-step scheme) and the fixed-step view of the method.
    pair: EmbeddedPair | None
    integrator: Integrator
    name: str
    dt: float
    every: int | None
    control: Any
    save_at: SaveAt
    sampler: WeightSampler
    n_steps: int
    #: Saves through the pair's dense output (dop853, see :func:`_schedule`).
    dense: bool
    #: ``(dt_min, dt_max)`` of an adaptive run, else ``None``.
    bounds: tuple[float, float] | None


def _schedule(
    p: Problem, method: Stepper, controller: ConstantStep | PIController, saveat: SaveAt, recording: bool
) -> _Schedule:
    """The run's schedule. Fixed steps: ``t_end - t0`` in whole steps of ``dt``, saved every ``every``.
    Adaptive: the save times ``t0 + j k dt0`` and ``t_end``, the step bounds, the OU grid sampler."""
    pair = method if isinstance(method, EmbeddedPair) else None
    integrator = method.integrator() if isinstance(method, EmbeddedPair) else method
    every = saveat.every
    x = p.x0
    if not isinstance(controller, PIController):
        if every is None:
            raise InputError("fixed steps save every k steps: use SaveAt(every=k)", hint=Hint("save_every"))
        control: Any = controller.start(p.t0, p.t_end)
        return _Schedule(
            False, pair, integrator, method.name, controller.dt, every, control, saveat, p.process.sampler(p.seed),
            control.total, False, None,
        )  # fmt: skip
    assert pair is not None
    dt = float(controller.dt0)
    # Saves through the pair's dense output where it has one (dop853): steps no longer stop at save
    # times, nor are they bounded by the save spacing (the default dt_max is then t_end - t0). Not with
    # the EDI step recorder (its rows are the steps') nor in float32 (the float32 check runs at saves).
    dense = _saveat.DENSE_SAVES and pair.dense_arrays() is not None and not recording and x.dtype == torch.float64
    # SaveAt(every=k) of an adaptive run: the times t0 + j k dt0 (hit exactly, or interpolated
    # with dense saves) and t_end.
    span = p.t_end - p.t0
    spacing = dt * every if every is not None else span
    bounds = controller.bounds(span if dense else spacing)
    control = controller.start(p.t_end, min(pair.order, pair.embedded_order), span if dense else spacing)
    times = save_grid(p.t0, p.t_end, spacing) if saveat.times is None else [*saveat.times, float(p.t_end)]
    save_at = SaveAt(times=tuple(sorted(set(times))))
    return _Schedule(
        True, pair, integrator, method.name, dt, every, control, save_at, p.process.adaptive_sampler(p.seed, dt), 0,
        dense, bounds,
    )  # fmt: skip


def _compiled_path(p: Problem, method: Stepper, s: _Schedule, recording: bool) -> _CompiledStep | None:
    """The compiled small-cloud step's inputs when it serves this run (adaptive: :func:`_compiled_step`;
    fixed: :func:`_compiled_fixed`), else ``None``."""
    if s.adaptive:
        assert s.pair is not None
        return _compiled_step(s.pair, p.process, p.x0, p.a, p.w, p.options, recording)
    return _compiled_fixed(method, p, p.x0, p.a, p.w, recording)


def _step_recorder(
    p: Problem, f: TimeField, s: _Schedule, run: _Run, recording: bool
) -> tuple[StepRecorder | None, list[torch.Tensor]]:
    """The EDI step recorder (when ``recording``) and the box where its adaptive steps leave the
    error estimate of the step they made (:func:`_adaptive_attempt` reads it)."""
    err_box: list[torch.Tensor] = []
    if not recording:
        return None, err_box
    pair = s.pair

    def pair_step(g: Any, t: float, y: torch.Tensor, h: float, k1: torch.Tensor | None = None) -> torch.Tensor:
        assert pair is not None
        y1, e, _ = pair.attempt(_counted(g, run), t, y, h, k1=k1)
        if k1 is not None:
            run.evaluations += 1  # the first stage, from the recorder's start pass
        err_box[:] = [e]
        return y1

    inner = Integrator(pair.name, pair.order, pair_step, pair.b) if s.adaptive and pair is not None else s.integrator
    return StepRecorder(f, p.process.derivative, inner, p.process.derivative_source), err_box


def _saver(p: Problem, f: TimeField, recording: bool) -> Saver:
    """The saver of the states and their diagnostics; in bulk at the end where :func:`_deferred_saves` allows."""
    model, heads_at = p.model, f.heads_at

    def reuse(t: float, known: Evaluation) -> bool:
        # The recorder's end-of-step pass holds the A-only statistics for model gf with plain heads.
        return known.stats is not None and model == "gf" and heads_at(t).plain

    return Saver(
        f.evaluate, heads_at, p.a, p.w, p.cluster_eps, check_gf=model == "gf", options=p.options, reuse=reuse,
        deferred=model if _deferred_saves(p, recording) else None,
    )  # fmt: skip


def _precision_check(
    p: Problem, s: _Schedule, heads_at: Callable[[float], Heads]
) -> tuple[_guards.Float32Monitor | None, PrecisionCheck | None]:
    """The float32 monitor and its check at the saves (``None, None`` in float64)."""
    if p.x0.dtype != torch.float32:
        return None, None
    monitor = _guards.Float32Monitor()
    weights = s.integrator.weights
    return monitor, PrecisionCheck(
        monitor, s.integrator.step, p.model, heads_at, p.a, p.w, None if s.adaptive else s.every, p.options,
        one_stage=weights is not None and len(weights) == 1,
    )  # fmt: skip


def _run_fingerprint(
    p: Problem, s: _Schedule, controller: ConstantStep | PIController, heads0: Heads, wanted: bool
) -> str:
    """The fingerprint a checkpoint carries (``""`` when no checkpoint is written or read): every
    input that decides the run, so that a checkpoint resumes only the run that wrote it."""
    if not wanted:
        return ""
    ident: dict[str, Any] = dict(
        x0=to_numpy(p.x0), a=to_numpy(p.a), w=to_numpy(p.w), model=p.model, method=s.name, dt=float(s.dt),
        t0=float(p.t0), save_every=int(s.every or 0), seed=p.seed, cluster_eps=p.cluster_eps,
        process=p.process.describe(), heads0=to_numpy(heads0.values), backend=p.options.backend,
        fast_tol=p.options.tol,
    )  # fmt: skip
    if isinstance(controller, PIController):
        assert s.bounds is not None
        ident.update(t_end=float(p.t_end), tolerances=[float(controller.rtol), float(controller.atol), *s.bounds])
    else:
        ident.update(n_steps=s.n_steps)
    return _fingerprint(**ident)


@dataclass
class _Snapshots:
    """``snapshot(k, y, stopped=None)``: the :class:`Checkpoint` of the run at step ``k`` in state ``y``
    (loop state, sampler, saved trajectory, float32 check, EDI rows)."""

    s: _Schedule
    run: _Run
    saver: Saver
    recorder: StepRecorder | None
    monitor: _guards.Float32Monitor | None
    precision: PrecisionCheck | None
    run_id: str
    start: float

    def __call__(self, k: int, y: torch.Tensor, stopped: str | None = None) -> Checkpoint:
        s, run = self.s, self.run
        extra: dict[str, Any] = {}
        if s.adaptive:
            extra["adaptive"] = {
                "t": run.t, "controller": s.control.state(), "stats": run.stats.as_dict(), "evaluations": run.evaluations,
            }  # fmt: skip
        if self.monitor is not None:
            extra["float32"] = {
                **self.monitor.summary(),
                **({"last_check_step": self.precision.last_k} if s.adaptive and self.precision else {}),
            }
        if self.recorder is not None:
            # The EDI rows so far (JSON floats round-trip exactly), so a resumed run has the whole budget.
            rows = self.recorder.rows if s.adaptive else self.recorder.rows[:k]
            extra["edi_rows"] = [list(r) for r in rows]
        return Checkpoint(
            step=k, n_steps=s.n_steps, x=to_numpy(y).copy(), sampler_state=s.sampler.get_state(),
            **self.saver.checkpoint_fields(),
            wall_time_s=run.wall0 + _time.perf_counter() - self.start, fingerprint=self.run_id, stopped=stopped,
            extra=extra,
        )  # fmt: skip


def _attempt(
    s: _Schedule, compiled: _CompiledStep | None, f: TimeField, recorder: StepRecorder | None, run: _Run,
    err_box: list[torch.Tensor], model: str, constant: bool = False,
) -> Any:  # fmt: skip
    """The loop's ``attempt(t, y, h, first) -> Trial``: compiled or torch, adaptive or fixed; ``constant``:
    the weights are :class:`~attnflow.weights.processes.Constant` (the same heads at every time)."""
    if s.adaptive:
        assert s.pair is not None
        if compiled is not None:
            return _compiled_attempt(s.pair, compiled, f.heads_at, model, s.control, run, s.dense, constant)
        return _adaptive_attempt(s.pair, f, recorder, s.control, run, err_box, s.dense)
    if compiled is not None:
        return _compiled_fixed_attempt(compiled, f.heads_at, model)
    return _fixed_attempt(s.integrator, f, recorder)


def _breaks(
    s: _Schedule, recorder: StepRecorder | None, run: _Run, heads_at: Callable[[float], Heads]
) -> tuple[Callable[[float], Callable[[], None]] | None, Callable[[float, float, bool], bool] | None]:
    """The loop's ``rollback(t) -> undo`` (a rejected trial leaves the sampler and the EDI rows as
    they were; ``None`` when there is nothing to undo) and, for adaptive runs, ``on_accept(t, h,
    hit_break)`` (True where the weights jumped)."""
    sampler = s.sampler

    def rollback(t: float) -> Callable[[], None]:
        if s.adaptive:
            sampler.forget_before(t)
        before = sampler.get_state()
        mark = recorder.mark() if recorder is not None and s.adaptive else None

        def undo() -> None:
            sampler.set_state(before)
            if recorder is not None and mark is not None:
                recorder.restore(mark)

        return undo

    def on_accept(t: float, h: float, hit_break: bool) -> bool:
        run.t = t
        if hit_break and sampler.left(t) is not sampler(t):  # the weights jumped at t
            if recorder is not None:
                recorder.weights_jump(heads_at(t))
            return True
        return False

    # A sampler with no state (constant and layer weights: WeightSampler's own no-op state methods) and
    # no EDI recorder leave a rejected trial nothing to undo: no rollback made per trial.
    stateless = recorder is None and all(
        getattr(type(sampler), name) is getattr(WeightSampler, name)
        for name in ("get_state", "set_state", "forget_before")
    )
    return (None if stateless else rollback), on_accept if s.adaptive else None


def _observers(
    p: Problem, s: _Schedule, run: _Run, precision: PrecisionCheck | None, checkpoint: Checkpointer | None,
    snapshot: _Snapshots, progress: Callable[[int, int], None] | None, extra: Sequence[Observer],
) -> list[Observer]:  # fmt: skip
    """What sees every accepted state: the float32 check, the checkpoint writer, progress (permille
    of ``[t0, t_end]`` for adaptive runs), then the caller's observers."""
    observers: list[Observer] = [] if precision is None else [precision]
    if checkpoint is not None:
        observers.append(CheckpointWriter(checkpoint, snapshot))
    if progress is not None:
        if s.adaptive:
            t0, span, report = p.t0, float(p.t_end) - float(p.t0), progress
            observers.append(ProgressReport(lambda k, n: report(int(1000 * (run.t - t0) / span), 1000)))
        else:
            observers.append(ProgressReport(progress))
    observers.extend(extra)
    return observers


def _provenance(
    s: _Schedule, controller: ConstantStep | PIController, run: _Run, x: torch.Tensor, costs: Costs, wall: float,
    compiled: _CompiledStep | None, saver: Saver, resumed: bool, monitor: _guards.Float32Monitor | None,
    spec: RunSpec | None,
) -> dict[str, Any]:  # fmt: skip
    """What the run records about itself: wall time, steps, dtype, costs, the paths it took, the
    adaptive controller's statistics, the float32 check and the typed spec."""
    provenance: dict[str, Any] = {
        "wall_time_s": wall,
        "steps": run.stats.accepted if s.adaptive else s.n_steps,
        "dtype": str(x.dtype).replace("torch.", ""),
        "seconds": costs.rounded(),
        "compiled_steps": compiled is not None,
        "deferred_diagnostics": saver.deferred is not None,
    }
    if isinstance(controller, PIController):
        assert s.bounds is not None
        lo, hi = s.bounds
        provenance["adaptive"] = {
            **run.stats.as_dict(), "field_evaluations": run.evaluations, "rtol": float(controller.rtol),
            "atol": float(controller.atol), "dt_min": lo, "dt_max": hi, "dt_next": s.control.dt,
            "compiled": compiled is not None, "dense_saves": s.dense,
        }  # fmt: skip
    if resumed:
        provenance["resumed_from_step"] = run.k0
    if monitor is not None:
        provenance["float32_check"] = monitor.summary()
    if spec is not None:
        provenance["spec"] = spec.as_dict()
    return provenance


def _solve(
    p: Problem,
    method: Stepper,
    controller: ConstantStep | PIController,
    saveat: SaveAt,
    record_steps: bool | None,
    checkpoint: Checkpointer | None,
    resume: Checkpoint | str | None,
    progress: Callable[[int, int], None] | None,
    extra_observers: Sequence[Observer],
    config: dict[str, Any] | None,
    spec: RunSpec | None,
    deferred: Callable[[Callable[[], dict[str, np.ndarray]]], DeferredDiagnostics] | None = None,
) -> Trajectory:
    """The run assembled from its named parts (schedule, field, recorders, saver, fingerprint,
    checkpoints, observers), integrated by the one loop, and recorded as a :class:`Trajectory`."""
    x, model = p.x0, p.model
    recording = bool(record_steps or (record_steps is None and model == "gf"))
    s = _schedule(p, method, controller, saveat, recording)
    compiled = _compiled_path(p, method, s, recording)
    run = _Run(t=p.t0)
    f = TimeField(model, s.sampler, p.a, p.w, x.dtype, x.device, p.options)
    heads_at = f.heads_at
    check_model(model, heads_at(p.t0))
    recorder, err_box = _step_recorder(p, f, s, run, recording)
    saver = _saver(p, f, recording)
    if compiled is not None or saver.deferred is not None:  # the first use may compile: say so (if asked)
        prepare("the small-cloud steps", _small.RUN_KERNELS, "small")
    monitor, precision = _precision_check(p, s, heads_at)

    start = _time.perf_counter()
    costs = Costs({})  # wall time by part (the initial state's diagnostics count as diagnostics)
    run_id = _run_fingerprint(p, s, controller, heads_at(p.t0), checkpoint is not None or resume is not None)
    snapshot = _Snapshots(s, run, saver, recorder, monitor, precision, run_id, start)

    first: Evaluation | None = None
    if resume is None:
        if not s.adaptive and (msg := _guards.step_warning(s.dt, s.name, heads_at(p.t0), model, p.t_end - p.t0)):
            _guards.warn(msg, _guards.StabilityWarning)
        tic = _time.perf_counter()
        first = saver.record(float(p.t0), x)
        costs.add(saver.name, _time.perf_counter() - tic)
        # Deferred diagnostics (mha, gf) are finite at every finite state on the sphere: the tokens decide.
        if (why := _guards.state_problem(x, None if saver.deferred else saver.rows[0])) is not None:
            raise InputError(f"the initial state cannot be simulated: {why}", hint=Hint("x0"))
        if checkpoint is not None:
            checkpoint.write(snapshot(0, x))
    else:
        x = _restore(
            resume, run, x, s.n_steps, run_id, s.adaptive, s.control, s.sampler, saver, monitor, precision, recorder
        )

    rollback, on_accept = _breaks(s, recorder, run, heads_at)
    observers = _observers(p, s, run, precision, checkpoint, snapshot, progress, extra_observers)
    t_start = run.t if s.adaptive else p.t0 + run.k0 * s.dt
    try:
        x = integrate(
            _attempt(s, compiled, f, recorder, run, err_box, model, isinstance(p.process, Constant)), x, t=t_start,
            control=s.control,
            saves=s.save_at.start(t_start), k0=run.k0, first=first,
            next_break=s.sampler.next_break if s.adaptive else (lambda t: float("inf")), recorders=[saver],
            observers=observers, rollback=rollback, on_accept=on_accept, costs=costs, stats=run.stats,
            dense_saves=s.dense,
        )  # fmt: skip
    except StepFailed as e:
        raise _instability(
            e, saver, snapshot, recorder, p, s.name, s.dt, s.n_steps, s.adaptive, s.control, config, spec
        ) from None
    if monitor is not None and monitor.flagged:
        _guards.warn(monitor.message(), _guards.PrecisionWarning)
    wall = run.wall0 + _time.perf_counter() - start
    return Trajectory(
        **saver.arrays(lazy=deferred),  # a deferred table is made when the trajectory's diagnostics are read
        token_weights=to_numpy(p.a).astype(np.float64),
        head_weights=to_numpy(p.w).astype(np.float64),
        model=model,
        method=s.name,
        dt=float(s.dt),
        seed=p.seed,
        config=config,
        provenance=_provenance(s, controller, run, x, costs, wall, compiled, saver, resume is not None, monitor, spec),
        steps={} if recorder is None else recorder.series(),
        steps_info={} if recorder is None else recorder.info(),
    )


def _counted(
    g: Callable[[float, torch.Tensor], torch.Tensor], run: _Run
) -> Callable[[float, torch.Tensor], torch.Tensor]:
    def call(t: float, y: torch.Tensor) -> torch.Tensor:
        run.evaluations += 1
        return g(t, y)

    return call


def _fixed_attempt(integrator: Integrator, f: TimeField, recorder: StepRecorder | None) -> Any:
    """One fixed step (always accepted): the stepper from the known first stage, or the EDI recorder's step."""

    def attempt(t: float, y: torch.Tensor, h: float, first: Evaluation | None) -> Trial:
        if recorder is None:
            return Trial(integrator.step(f, t, y, h, k1=None if first is None else first.v), 0.0)
        y1 = recorder.step(t, y, h, start=None if first is None else first.extra)
        return Trial(y1, 0.0, end=_recorder_end(recorder))

    return attempt


def _recorder_end(recorder: StepRecorder) -> Evaluation | None:
    if recorder.end is None:
        return None
    t1, end, stats = recorder.end
    return Evaluation(t1, end[0], stats, extra=end)


def _adaptive_attempt(
    pair: EmbeddedPair, f: TimeField, recorder: StepRecorder | None, control: Any, run: _Run, err_box: list,
    dense: bool = False,
) -> Any:  # fmt: skip
    """One trial step of the embedded pair with its error norm; the first stage is the known evaluation
    (the last step's FSAL stage, a retry's start, a saved state's pass), the last one is kept for the next.
    ``dense``: each trial carries its dense output (:class:`~attnflow.schemes.integrators.DOP853Pair`)."""

    def attempt(t: float, y: torch.Tensor, h: float, first: Evaluation | None) -> Trial:
        f.left_after = t
        try:
            if recorder is not None:
                y1 = recorder.step(t, y, h, start=None if first is None or first.extra is None else first.extra)
                start = first if first is not None and first.extra is not None else None
                return Trial(y1, control.norm(y, y1, err_box[0]), start=start, end=_recorder_end(recorder))
            if first is None:
                k1 = _counted(f, run)(t, y)
            else:
                k1 = first.v
                if first.fresh:  # a saved state's diagnostics pass serves as the step's first evaluation
                    run.evaluations += 1
            if dense:
                assert isinstance(pair, DOP853Pair)
                y1, ks = pair.stages_of(_counted(f, run), t, y, h, k1=k1)
                e, k_last = pair.error(h, ks), ks[-1]
            else:
                y1, e, k_last = pair.attempt(_counted(f, run), t, y, h, k1=k1)
            return Trial(
                y1,
                control.norm(y, y1, e),
                start=Evaluation(t, k1),
                end=Evaluation(t + h, k_last) if pair.fsal else None,
                dense=_torch_dense_output(pair, f, run, t, h, y, y1, ks) if dense else None,
            )
        finally:
            f.left_after = None

    return attempt


def _torch_dense_output(
    pair: Any, f: TimeField, run: _Run, t: float, h: float, x: torch.Tensor, y: torch.Tensor, ks: list[torch.Tensor]
) -> Callable[[float], torch.Tensor]:
    """``s -> retract(interpolant(s))`` on ``[t, t + h]`` (the torch field; coefficients at the first call)."""
    coef: list[list[torch.Tensor]] = []

    def at(s: float) -> torch.Tensor:
        if not coef:
            f.left_after = t  # the extra stages lie inside the step: the weights of its start
            try:
                coef.append(pair.dense_coefficients(_counted(f, run), t, x, y, ks, h))
            finally:
                f.left_after = None
        return retract(pair.dense_value(x, coef[0], (s - t) / h))

    return at


@dataclass
class _CompiledStep:
    """What :mod:`attnflow.kernels.small` needs besides the state: the tableau (and the dense output's
    arrays, ``None`` for pairs without one), masses, and the compiled step of the last heads."""

    tableau: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, bool]
    a: np.ndarray
    w: np.ndarray
    dense: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
    _last: tuple[Heads, _small.SmallStep] | None = None

    def step(self, heads: Heads, model: str, rtol: float, atol: float) -> _small.SmallStep:
        """The compiled step of ``heads``, made once per distinct heads object."""
        if self._last is None or self._last[0] is not heads:
            A, V = heads.A.double().numpy(), heads.values.double().numpy()
            self._last = (heads, _small.SmallStep(A, V, self.w, self.a, model, self.tableau, rtol, atol, self.dense))
        return self._last[1]


#: Up to this many kernel values per evaluation (``H N^2``), in dimension ``d <= COMPILED_MAX_D``, an
#: adaptive run steps through the compiled small-cloud path. Measured one field evaluation against the
#: torch kernel on one thread (d = 3, one head): 9.4x faster at N = 64, 4.4x at 256, 1.1-1.2x at
#: 512-1024, 0.7x at 2048 (docs/performance.md "Small clouds").
COMPILED_MAX_PAIRS = 1024 * 1024
#: The compiled loops sum over ``d`` serially; BLAS products win for wide tokens.
COMPILED_MAX_D = 16


def _compiled_step(
    pair: EmbeddedPair, process: Any, x: torch.Tensor, a: torch.Tensor, w: torch.Tensor, options: KernelOptions,
    recording: bool,
) -> _CompiledStep | None:  # fmt: skip
    """The compiled step's inputs when it serves this run, else ``None``: constant or layer weights,
    plain heads, float64 on the CPU, the automatic backend, no EDI step recorder, a small cloud."""
    if not _small.AVAILABLE or recording or options.backend != "auto" or x.dtype != torch.float64:
        return None
    if x.device.type != "cpu" or x.shape[0] ** 2 * process.H > COMPILED_MAX_PAIRS or x.shape[1] > COMPILED_MAX_D:
        return None
    # The heads' selection is _plain_constant_heads' (which also asks h.plain: for Heads that is what
    # _small.supported asks, tests/solve/test_compiled_selection.py; merging changed no run's path).
    if _plain_constant_heads(process, x) is None:
        return None
    return _CompiledStep(
        pair.arrays(), to_numpy(a).astype(np.float64), to_numpy(w).astype(np.float64), pair.dense_arrays()
    )


def _compiled_attempt(
    pair: EmbeddedPair, compiled: _CompiledStep, heads_at: Callable[[float], Heads], model: str, control: Any,
    run: _Run, dense: bool = False, constant: bool = False,
) -> Any:  # fmt: skip
    """:func:`_adaptive_attempt` as one compiled call (:class:`attnflow.kernels.small.SmallStep`); the
    heads are those of the step's start (constant or layer weights, whose breaks the loop steps onto;
    ``constant``: the same heads at every time). ``dense``: each trial carries its dense output (three
    more evaluations, made only when a save time falls inside the step), retracted onto the sphere."""

    # Read once: constant for the run (a resumed controller sets only its step state).
    stages, fsal, rtol, atol = pair.stages, pair.fsal, control.rtol, control.atol
    # The last trial's new state as (tensor, its array): the loop hands it back as the next start, whose
    # array is then not asked of torch again (the same memory: the tensor was made from the array).
    last: list[Any] = [None, None]
    # Constant weights: one compiled step for the whole run, not looked up per trial.
    fixed = compiled.step(heads_at(0.0), model, rtol, atol) if constant else None

    def attempt(t: float, y: torch.Tensor, h: float, first: Evaluation | None) -> Trial:
        small_step = fixed if fixed is not None else compiled.step(heads_at(t), model, rtol, atol)
        x_np = last[1] if y is last[0] else y.numpy()
        # This attempt's own evaluations carry their array as ``extra`` (the same memory as ``v``).
        k1 = None if first is None else first.extra if type(first.extra) is np.ndarray else first.v.numpy()
        y_np, err, ks, ok = small_step.attempt(x_np, h, k1)
        # The stages the call made (a saved state's fresh pass serves as the first, as in _adaptive_attempt).
        run.evaluations += stages - (1 if first is not None and not first.fresh else 0)
        # ks is this trial's own fresh array, never written again: its stages are shared, not copied. A
        # known first stage that is not a fresh pass serves as the start as it is (a retry reads its t, v).
        if first is None:
            start = Evaluation(t, torch.from_numpy(ks[0]), extra=ks[0])
        else:
            start = first if not first.fresh else Evaluation(t, first.v, extra=k1)
        out = _DenseOutput(small_step, t, h, x_np, y_np, ks, run) if dense else None
        y_t = torch.from_numpy(y_np)
        last[0], last[1] = y_t, y_np
        return Trial(
            y_t, err if ok else float("inf"), start=start,
            end=Evaluation(t + h, torch.from_numpy(ks[-1]), extra=ks[-1]) if fsal else None,
            dense=None if out is None else out.at, dense_many=None if out is None else out.many,
            on_sphere=ok and _guards.unit_rows(y_np),
        )  # fmt: skip

    return attempt


@dataclass
class _DenseOutput:
    """``s -> retract(interpolant(s))`` on ``[t, t + h]`` of one compiled step (:meth:`at`; :meth:`many`
    for several times in one compiled call, the same bits); the coefficients are made at the first call."""

    small_step: _small.SmallStep
    t: float
    h: float
    x: np.ndarray
    y: np.ndarray
    ks: np.ndarray
    run: _Run
    coef: np.ndarray | None = None

    def _coefficients(self) -> np.ndarray:
        if self.coef is None:
            F, ok = self.small_step.dense(self.x, self.y, self.ks, self.h)
            self.run.evaluations += 3
            if not ok:
                raise FloatRangeError(
                    "the unnormalised ('usa') field overflows: lower beta or use model 'gf' or 'mha'."
                )
            self.coef = F
        return self.coef

    def at(self, s: float) -> torch.Tensor:
        return torch.from_numpy(_small.dense_point(self.x, self._coefficients(), (s - self.t) / self.h))

    def many(self, ss: list[float]) -> np.ndarray:
        """``(m, N, d)``: the states at the times ``ss`` (with the coefficients in the same compiled call
        when they are not made yet)."""
        t, h = self.t, self.h
        thetas = np.array([(s - t) / h for s in ss])  # (s - t) / h one by one, as at() (IEEE: numpy's bits too)
        if self.coef is not None:
            return _small.dense_points(self.x, self.coef, thetas)
        F, X, ok = self.small_step.dense_points(self.x, self.y, self.ks, self.h, thetas)
        self.run.evaluations += 3
        if not ok:
            raise FloatRangeError("the unnormalised ('usa') field overflows: lower beta or use model 'gf' or 'mha'.")
        self.coef = F
        return X


def _plain_constant_heads(process: Any, x: torch.Tensor) -> list[Heads] | None:
    """The heads of constant or layer weights when every one is plain and served by the compiled
    small-cloud path in ``x``'s dtype on its device, else ``None``."""
    if isinstance(process, Constant):
        all_heads = [process.heads]
    elif isinstance(process, Layers):
        all_heads = process.layers
    else:
        return None
    if not all(h.plain and _small.supported(h, x.device.type, x.dtype) for h in all_heads):
        return None
    return all_heads


def _deferred_saves(p: Problem, recording: bool) -> bool:
    """Whether the saved states' diagnostics are made in bulk at the end (:class:`Saver`'s ``deferred``):
    the normalised models (their diagnostics are finite at every finite state on the sphere), float64,
    the automatic backend (a named one keeps its kernel for the diagnostics too), no EDI step recorder, constant or layer weights with plain
    heads, and clouds small enough for the batched pass (``2 <= N``, ``H N^2 <= COMPILED_MAX_PAIRS``)."""
    x = p.x0
    if recording or p.model not in ("mha", "gf") or x.dtype != torch.float64 or p.options.backend != "auto":
        return False
    if not 2 <= x.shape[0] or x.shape[0] ** 2 * p.process.H > COMPILED_MAX_PAIRS:
        return False
    return _plain_constant_heads(p.process, x) is not None


#: The fixed-step explicit schemes' Butcher tableaux ``(c, a rows)`` (the torch steps of
#: :mod:`attnflow.schemes.integrators` written as data for the compiled step).
FIXED_TABLEAUX: dict[str, tuple[tuple[float, ...], tuple[tuple[float, ...], ...]]] = {
    "euler": ((0.0,), ((),)),
    "heun": ((0.0, 1.0), ((), (1.0,))),
    "rk4": ((0.0, 0.5, 0.5, 1.0), ((), (0.5,), (0.0, 0.5), (0.0, 0.0, 1.0))),
}


def fixed_tableau(method: Stepper) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, bool] | None:
    """A fixed-step method as the compiled step's tableau ``(c, A, b, e, e3, fsal)`` (zero error
    weights, no FSAL stage): the explicit schemes and the embedded pairs' order-``p`` solutions;
    ``None`` for the others (``jko``)."""
    if isinstance(method, EmbeddedPair):
        c_, A_, b_, _, _, fsal = method.arrays()
        n = method.stages - 1 if fsal else method.stages
        return c_[:n].copy(), np.ascontiguousarray(A_[:n, :n]), b_[:n].copy(), np.zeros(n), np.zeros(0), False
    if method.name not in FIXED_TABLEAUX or method.weights is None:
        return None
    c, rows = FIXED_TABLEAUX[method.name]
    S = len(c)
    A = np.zeros((S, S))
    for i, row in enumerate(rows):
        A[i, : len(row)] = row
    return np.array(c), A, np.array(method.weights), np.zeros(S), np.zeros(0), False


def _compiled_fixed(
    method: Stepper, p: Problem, x: torch.Tensor, a: torch.Tensor, w: torch.Tensor, recording: bool
) -> _CompiledStep | None:
    """The compiled fixed step's inputs when it serves this run, else ``None``: an explicit scheme,
    constant weights (a step's stages then all see the same heads), plain heads, models ``mha`` and
    ``gf``, float64 on the CPU, the automatic backend, no EDI step recorder, a small cloud."""
    if not _small.AVAILABLE or recording or p.options.backend != "auto" or x.dtype != torch.float64:
        return None
    if p.model not in ("mha", "gf") or not isinstance(p.process, Constant):
        return None
    if x.device.type != "cpu" or x.shape[0] ** 2 * p.process.H > COMPILED_MAX_PAIRS or x.shape[1] > COMPILED_MAX_D:
        return None
    tableau = fixed_tableau(method)
    if tableau is None or _plain_constant_heads(p.process, x) is None:
        return None
    return _CompiledStep(tableau, to_numpy(a).astype(np.float64), to_numpy(w).astype(np.float64))


def _compiled_fixed_attempt(compiled: _CompiledStep, heads_at: Callable[[float], Heads], model: str) -> Any:
    """One fixed step (always accepted) as one compiled call; ``first``'s field serves as the first stage."""

    # Constant weights only (_compiled_fixed): one compiled step for the whole run.
    small_step = compiled.step(heads_at(0.0), model, 0.0, 1.0)

    def attempt(t: float, y: torch.Tensor, h: float, first: Evaluation | None) -> Trial:
        y_np, _, _, ok = small_step.attempt(y.numpy(), h, None if first is None else first.v.numpy())
        # A non-finite state fails the loop's state guard (checked here already when it passes).
        return Trial(torch.from_numpy(y_np), 0.0, on_sphere=ok and _guards.unit_rows(y_np))

    return attempt


def _restore(
    resume: Checkpoint | str,
    run: _Run,
    x: torch.Tensor,
    n_steps: int,
    run_id: str,
    adaptive: bool,
    control: Any,
    sampler: WeightSampler,
    saver: Saver,
    monitor: _guards.Float32Monitor | None,
    precision: PrecisionCheck | None,
    recorder: StepRecorder | None,
) -> torch.Tensor:
    """Continue from a checkpoint of this same run: the loop state, the sampler, the saved trajectory."""
    ck = load_checkpoint(resume) if not isinstance(resume, Checkpoint) else resume
    run.k0, run.wall0 = ck.step, ck.wall_time_s
    if ck.fingerprint != run_id or (ck.n_steps != n_steps if not adaptive else "adaptive" not in ck.extra):
        what = "tolerances, t_end" if adaptive else "t_end"
        raise InputError(
            f"the checkpoint belongs to a different run (its inputs - tokens, weights, model, method, dt, {what}, "
            "seed or save_every - differ from these); resume it with the setup that wrote it",
            hint=Hint("resume"),
        )
    if adaptive:
        ad = ck.extra["adaptive"]
        run.t = float(ad["t"])
        control.set_state(ad["controller"])
        st = ad["stats"]
        run.stats.accepted, run.stats.rejected = int(st["accepted_steps"]), int(st["rejected_steps"])
        if st["dt_smallest"] is not None:
            run.stats.dt_smallest, run.stats.dt_largest = float(st["dt_smallest"]), float(st["dt_largest"])
        run.evaluations = int(ad["evaluations"])
    sampler.set_state(ck.sampler_state)
    x = torch.from_numpy(np.array(ck.x)).to(device=x.device)
    saver.restore(ck)
    if monitor is not None and "float32" in ck.extra:
        s32 = ck.extra["float32"]
        # "edi_budget" is the key checkpoints of earlier versions wrote for the step error.
        monitor.rounding, monitor.checks = s32["rounding_drift"], s32["checks"]
        monitor.budget = s32["step_error"] if "step_error" in s32 else s32["edi_budget"]
        if precision is not None:
            precision.last_k = int(s32.get("last_check_step", 0))
    if recorder is not None:
        recorder.rows = [tuple(r) for r in ck.extra.get("edi_rows", [])]
    return x


def _instability(
    e: StepFailed,
    saver: Saver,
    snapshot: Callable[..., Checkpoint],
    recorder: StepRecorder | None,
    p: Problem,
    method: str,
    dt: float,
    n_steps: int,
    adaptive: bool,
    control: Any,
    config: dict[str, Any] | None,
    spec: RunSpec | None,
) -> _guards.NumericalInstability:
    """The error of a failed step, carrying the last good state (saved if it was not) and the run so far."""
    k, t = e.k, e.t
    if saver.ts[-1] != t:
        saver.record(t, e.x)
    if adaptive:
        last = snapshot(k - 1, e.x, stopped=f"{e.why} at t={t:.6g} (step {k})")
        message = (
            f"{e.why} at t={t:.6g} (adaptive step {k}, dt={control.dt:.3g}); the last good state is t={t:.6g}. "
            "Loosen rtol/atol, lower dt_min, or for stiff cases use the implicit method='jko'."
        )
        t_fail = t
    else:
        if recorder is not None:
            del recorder.rows[k - 1 :]
        t_fail = p.t0 + k * dt
        last = snapshot(k - 1, e.x, stopped=f"{e.why} at t={t_fail:.6g} (step {k})")
        message = (
            f"{e.why} at t={t_fail:.6g} (step {k} of {n_steps}); the last good state is t={t:.6g} (step {k - 1}). "
            f"If the step dt={dt} is too large for these weights, lower it or use the implicit method='jko' for stiff "
            "cases."
        )
    return _guards.NumericalInstability(
        message, step=k, t=t_fail, checkpoint=last, trajectory=_partial(last, p, method, dt, config, spec)
    )


def _partial(
    ck: Checkpoint, p: Problem, method: str, dt: float, config: dict[str, Any] | None, spec: RunSpec | None
) -> Trajectory:
    """The trajectory recorded up to a checkpoint (what a stopped run leaves)."""
    return Trajectory(
        t=ck.saved_t, x=ck.saved_x, A=ck.saved_A, V=ck.saved_V if ck.any_V else None, diagnostics=ck.diagnostics,
        token_weights=to_numpy(p.a).astype(np.float64), head_weights=to_numpy(p.w).astype(np.float64), model=p.model,
        method=method, dt=float(dt), seed=p.seed, config=config,
        provenance={
            "wall_time_s": ck.wall_time_s, "steps": ck.step, "complete": False, "stopped": ck.stopped,
            **({} if spec is None else {"spec": spec.as_dict()}),
        },
    )  # fmt: skip
