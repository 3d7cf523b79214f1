"""``simulate``: integrate ``dx_i/dt = v_t(x_i)`` from ``t0`` to ``t_end`` and record a :class:`Trajectory`.

A thin wrapper with the keywords users know: it makes the pieces of
:func:`attnflow.solve.solver.solve` (a :class:`~attnflow.solve.problem.Problem`, the stepper named
``method``, a :class:`~attnflow.solve.controllers.ConstantStep` or
:class:`~attnflow.solve.controllers.PIController`, a :class:`~attnflow.solve.saveat.SaveAt`), each
of which checks its own inputs, and refuses options that do not apply to the chosen method.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from attnflow.config import defaults
from attnflow.config.spec import RunSpec
from attnflow.core.arrays import ArrayLike
from attnflow.core.errors import Hint, InputError
from attnflow.core.heads import Heads
from attnflow.core.trajectory import Trajectory
from attnflow.io.checkpoint import Checkpoint, Checkpointer
from attnflow.kernels.dispatch import KernelOptions
from attnflow.schemes.integrators import ADAPTIVE
from attnflow.solve.controllers import ConstantStep, PIController, positive, step_count
from attnflow.solve.problem import Problem, as_dtype
from attnflow.solve.saveat import SaveAt, default_save_every, save_grid, whole
from attnflow.solve.solver import TimeField, solve, stepper
from attnflow.weights.processes import WeightProcess

__all__ = ["simulate", "TimeField", "step_count", "save_grid"]

#: The keywords that apply to adaptive methods only (with their defaults there).
ADAPTIVE_OPTIONS: dict[str, float] = {"rtol": defaults.RTOL, "atol": defaults.ATOL}


def simulate(
    x0: ArrayLike,
    weights: WeightProcess | ArrayLike | Callable | Heads,
    *,
    model: str = defaults.MODEL,
    t_end: float,
    dt: float,
    method: str = defaults.METHOD,
    save_every: int | None = None,
    seed: int | None = None,
    token_weights: ArrayLike | None = None,
    head_weights: ArrayLike | None = None,
    t0: float = 0.0,
    cluster_eps: float = defaults.CLUSTER_EPS,
    dtype: Any = None,
    progress: Callable[[int, int], None] | None = None,
    config: dict[str, Any] | None = None,
    record_steps: bool | None = None,
    checkpoint: Checkpointer | None = None,
    resume: Checkpoint | str | None = None,
    backend: str = "auto",
    fast_tol: float | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    dt_min: float | None = None,
    dt_max: float | None = None,
    threads: int | None = None,
) -> Trajectory:
    """Integrate ``dx_i/dt = v_t(x_i)`` of ``model`` (``mha``, ``gf``, ``usa``) on ``[t0, t_end]``.

    ``weights``: a :class:`~attnflow.weights.WeightProcess`, a constant ``(H, d, d)`` array or
    :class:`Heads`, or a callable ``t -> A | (A, V)``. ``x0`` ``(N, d)``: rows off the unit sphere
    are projected onto it with a :class:`~attnflow.core.tokens.TokenWarning`. ``seed`` drives
    stochastic weights (it overrides the process's own seed). The state is saved every
    ``save_every`` steps (a whole number) and at the end; by default every step with fixed steps, and
    with adaptive ones every ``dt`` up to :data:`~attnflow.solve.saveat.DEFAULT_ADAPTIVE_SAVES` (1,000)
    save times, beyond that every ``k dt`` with the smallest ``k`` that keeps to it. ``record_steps`` (default: on for model
    ``gf``) records at every step the series that :func:`attnflow.edi_budget` needs
    (``Trajectory.steps``). ``cluster_eps``: the distance below which tokens count as one cluster in
    the diagnostics (recorded in ``Trajectory.spec``, kept by the run folder). ``dtype``:
    ``float32`` or ``float64`` as a name, a numpy or a torch dtype (default: that of ``x0``, float64
    for numpy input). ``threads``: torch threads for the run (default: one for small problems, the
    cores for large ones, :class:`~attnflow.core.threads.ThreadPolicy`, never more than torch's
    current setting); torch's setting is restored afterwards.

    ``checkpoint``: a :class:`~attnflow.io.checkpoint.Checkpointer` that writes the whole state as it
    goes; ``resume``: a :class:`~attnflow.io.checkpoint.Checkpoint` (or its path) of this same run to
    continue from, giving bit for bit the trajectory of an uninterrupted run. NaN/inf or tokens off
    the sphere raise :class:`~attnflow.solve.guards.NumericalInstability` carrying the last good
    state; a step too large for the weights gives a :class:`~attnflow.solve.guards.StabilityWarning`;
    float32 runs whose rounding exceeds the integrator's error give a
    :class:`~attnflow.solve.guards.PrecisionWarning` (fixed and adaptive steps alike). ``backend``
    picks the attention kernel (:data:`attnflow.kernels.dispatch.BACKENDS`) and ``fast_tol`` the fast
    summation's proved relative error: one :class:`~attnflow.kernels.dispatch.KernelOptions` built
    from them is the problem's, passed to every kernel call of the run.

    Adaptive methods (``method="bosh3"`` or ``"dopri5"``, :data:`attnflow.schemes.integrators.ADAPTIVE`)
    control the local error: ``rtol`` (default 1e-6), ``atol`` (1e-9) set the error norm, ``dt`` is
    the first step tried, ``dt_min`` / ``dt_max`` bound the step (``dt_max`` defaults to the save
    spacing). The state is saved exactly at ``t0 + k dt save_every`` and at ``t_end`` (which need
    not be a whole number of ``dt``). These four keywords are refused with the fixed-step methods.
    Accepted and rejected steps and field evaluations are in ``provenance["adaptive"]``.

    ``progress(done, total)``: the run is ``done / total`` complete (steps for fixed steps, permille
    of ``[t0, t_end]`` for adaptive ones). The run goes through :func:`attnflow.solve.solver.solve`;
    the wall time of each part is in ``provenance["seconds"]``.
    """
    stepper_ = stepper(method)
    adaptive = method in ADAPTIVE
    given = {"rtol": rtol, "atol": atol, "dt_min": dt_min, "dt_max": dt_max}
    if not adaptive:
        for name, value in given.items():
            if value is not None:
                raise InputError(
                    f"{name} applies to the adaptive methods ({', '.join(ADAPTIVE)}) only; method {method!r} takes "
                    f"fixed steps dt: drop {name} or choose an adaptive method",
                    hint=Hint(name, value),
                )
    dt_f = positive("dt", dt)
    if save_every is None:
        try:
            span = float(t_end) - float(t0)
        except (TypeError, ValueError):
            span = math.nan  # Problem.create names the bad time below
        save_every = default_save_every(adaptive, span, dt_f) if math.isfinite(span) and span > 0 else 1
    every = whole("save_every", save_every)
    torch_dtype = as_dtype(dtype)
    problem = Problem.create(
        x0, weights, model=model, t_end=t_end, t0=t0, seed=seed, token_weights=token_weights,
        head_weights=head_weights, dtype=torch_dtype, options=KernelOptions(backend, fast_tol), cluster_eps=cluster_eps,
        threads=threads,
    )  # fmt: skip
    controller: ConstantStep | PIController
    if adaptive:
        controller = PIController(
            ADAPTIVE_OPTIONS["rtol"] if rtol is None else rtol, ADAPTIVE_OPTIONS["atol"] if atol is None else atol,
            dt0=dt, dt_min=dt_min, dt_max=dt_max,
        )  # fmt: skip
    else:
        controller = ConstantStep(dt)
    spec = RunSpec(
        model=problem.model, method=stepper_.name, t0=problem.t0, t_end=problem.t_end, dt=float(dt), save_every=every,
        seed=problem.seed, cluster_eps=problem.cluster_eps, backend=problem.options.backend,
        fast_tol=problem.options.tol, dtype=str(problem.x0.dtype).replace("torch.", ""), threads=threads,
        record_steps=bool(record_steps or (record_steps is None and problem.model == "gf")),
        **({k: (None if v is None else float(v)) for k, v in vars_of(controller).items()} if adaptive else {}),
    )  # fmt: skip
    return solve(
        problem, stepper_, controller, SaveAt(every=every), record_steps=record_steps, checkpoint=checkpoint,
        resume=resume, progress=progress, config=config, spec=spec,
    )  # fmt: skip


def vars_of(controller: ConstantStep | PIController) -> dict[str, float | None]:
    """The adaptive controller's parameters as the spec names them."""
    assert isinstance(controller, PIController)
    return {"rtol": controller.rtol, "atol": controller.atol, "dt_min": controller.dt_min, "dt_max": controller.dt_max}
