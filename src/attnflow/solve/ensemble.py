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

from attnflow.config import defaults
from attnflow.core.arrays import ArrayLike, to_numpy
from attnflow.core.errors import Hint, InputError
from attnflow.core.geometry import project_tangent, retract
from attnflow.core.heads import Heads
from attnflow.core.threads import ThreadPolicy
from attnflow.dynamics.fields import FieldStats, check_model, masses
from attnflow.kernels import small as _small
from attnflow.kernels.announce import prepare
from attnflow.kernels.dense import attention_stats
from attnflow.kernels.dispatch import KernelOptions
from attnflow.schemes.integrators import ADAPTIVE, INTEGRATORS, MOVEMENTS, Field, Integrator, get_integrator
from attnflow.solve import saveat as _saveat
from attnflow.solve.controllers import ConstantStep, PIController
from attnflow.solve.guards import Float32Monitor, NumericalInstability, PrecisionWarning, warn
from attnflow.solve.loop import Costs, Evaluation, Observer, StepFailed, StepState, Trial, integrate
from attnflow.solve.observers import PrecisionCheck, ProgressReport
from attnflow.solve.problem import as_dtype, check_array, initial_tokens, thread_policy
from attnflow.solve.problem import check_model as check_model_name
from attnflow.solve.saveat import SaveAt, save_grid, whole
from attnflow.weights.processes import Constant, WeightProcess, WeightSampler, as_process

#: Per-member diagnostics recorded at every save time, shape ``(S, B)``.
ENSEMBLE_DIAGNOSTICS: dict[str, str] = {
    "order_parameter": "|sum_i a_i x_i|",
    "log_abs_energy": "log |F(mu, t)| with F = -1/2 sum_h w_h sum_ij a_i a_j exp(x_i^T beta A_h x_j)",
    "mean_inner": "mean_{i != j} <x_i, x_j> (unit masses' average, from |sum_i x_i|^2)",
    "log_slope": "log |dF|(mu, t), the metric slope: |dF|^2 = sum_i a_i S(x_i) |v_gf(x_i)|^2 (-inf at a critical point)",
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
            raise InputError(
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

    def stats(self, t: float, X: torch.Tensor, *, values: bool = True, of_A: bool = False) -> FieldStats:
        """One batched kernel pass at ``X`` ``(B, N, d)`` (``values=False``: ``log Z`` only). ``of_A``: the outputs
        average ``A_h x_j`` whatever the values ``V_h``, the gradient flow's field that the slope ``|dF|`` reads."""
        A, V = self.matrices(t)
        H = A.shape[1]
        q = X.unsqueeze(1).expand(-1, H, -1, -1)
        k = torch.einsum("bnd,bhed->bhne", X, A)
        v = torch.einsum("bnd,bhed->bhne", X, A if of_A else V) if values else None
        dense = self.options.backend if self.options.backend in ("flash", "stream") else "auto"
        out, logZ = attention_stats(q, k, v, torch.log(self.a), backend=dense)
        return FieldStats(out=out, logZ=logZ, log_w=torch.log(self.w))

    def __call__(self, t: float, X: torch.Tensor) -> torch.Tensor:
        return project_tangent(X, self.stats(t, X).mixed_output(self.model))


def _member_count(*lengths: int | None) -> int:
    given = {n for n in lengths if n is not None and n != 1}
    if len(given) > 1:
        raise InputError(
            f"x0, seeds, betas and weights give different ensemble sizes {sorted(given)}; make them agree",
            hint=Hint("x0"),
        )
    return given.pop() if given else 1


def simulate_ensemble(
    x0: ArrayLike,
    weights: WeightProcess | ArrayLike | Callable | Heads | Sequence[Any],
    *,
    model: str = defaults.MODEL,
    t_end: float,
    dt: float,
    method: str = defaults.METHOD,
    save_every: int = 1,
    seeds: Sequence[int | None] | None = None,
    betas: ArrayLike | None = None,
    token_weights: ArrayLike | None = None,
    head_weights: ArrayLike | None = None,
    t0: float = 0.0,
    dtype: Any = None,
    backend: str = "auto",
    progress: Callable[[int, int], None] | None = None,
    threads: int | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    dt_min: float | None = None,
    dt_max: float | None = None,
) -> Ensemble:
    """Integrate ``B`` independent systems at once (see the module docstring).

    ``x0``: ``(B, N, d)`` or one ``(N, d)`` cloud shared by all members. ``weights``: one process
    (member ``b`` samples it with ``seeds[b]``) or a list of ``B`` processes. ``betas`` ``(B,)``
    multiply every ``A_h`` (and ``V_h`` when ``V = A``; given values ``V_h`` are not scaled): ``beta``
    has one meaning in attnflow, a factor of ``A_h``. A config's ``heads.beta`` is that factor folded
    into the preset's matrices when they are built; ``betas[b]`` is a further factor on whatever
    ``A_h`` the member is given, so member ``b`` of weights built at ``heads.beta = 4`` with
    ``betas[b] = 0.5`` runs at ``A_h = 2 I`` (preset ``identity``). Member ``b`` equals
    ``simulate(x0[b], beta_b * weights, seed=seeds[b], ...)``. The steps run in the one loop of
    :func:`attnflow.simulate` (:func:`attnflow.solve.loop.integrate`, fixed steps): every state passes
    the state guard, float32 ensembles get the float32 check of each member; a failed state raises
    :class:`~attnflow.solve.guards.NumericalInstability`. ``progress(done, total)``: steps done of all.

    Adaptive methods (``bosh3``, ``dopri5``, ``dop853``; ``rtol``, ``atol``, ``dt_min``, ``dt_max`` as in
    :func:`attnflow.simulate`) give every member its own step control (one
    :class:`~attnflow.solve.controllers.PIState` each), all members' trial steps in one compiled call
    per round (:mod:`attnflow.kernels.small`): constant weights, plain heads, float64, small clouds.
    Member ``b`` then steps as its single run does (its states equal to 1e-12); with ``dop853`` the
    saves come from each step's dense output, as in a single run. ``threads``: the members are shared
    out to this many threads (``None``: :func:`ensemble_threads` decides from the work of a round).
    """
    options = KernelOptions(backend)
    model = check_model_name(model)
    X = initial_tokens(x0, as_dtype(dtype), batched=True)
    if X.ndim == 2:
        X = X.unsqueeze(0)
    procs = list(weights) if isinstance(weights, (list, tuple)) else None
    for name, value in (("token_weights", token_weights), ("head_weights", head_weights), ("betas", betas)):
        check_array(name, value)
    for proc in procs if procs is not None else [weights]:
        check_array("weights", proc)
    beta_arr = None if betas is None else np.atleast_1d(np.asarray(betas, dtype=np.float64))
    if beta_arr is not None and not np.isfinite(beta_arr).all():
        raise InputError("betas must be finite numbers", hint=Hint("betas"))
    B = _member_count(
        X.shape[0],
        None if seeds is None else len(seeds),
        None if beta_arr is None else len(beta_arr),
        None if procs is None else len(procs),
    )
    X = X.expand(B, -1, -1).clone()
    seed_list: list[int | None] = list(seeds) if seeds is not None else [None] * B
    seed_list = seed_list * B if len(seed_list) == 1 else seed_list
    beta_arr = np.ones(B) if beta_arr is None else np.broadcast_to(beta_arr, (B,)).copy()
    processes = [as_process(p) for p in procs] if procs is not None else [as_process(weights)] * B
    processes = processes * B if len(processes) == 1 else processes
    every = whole("save_every", save_every)
    d, H = X.shape[2], processes[0].H
    if H < 1:
        raise InputError("the weights have zero heads; give at least one head (H >= 1)", hint=Hint("weights"))
    if any(p.d != d or p.H != H for p in processes):
        raise InputError(f"every member's weights must act on d={d} with H={H} heads", hint=Hint("weights"))
    if method in ADAPTIVE:
        return _adaptive_ensemble(
            X, processes, beta_arr, seed_list, model=model, t0=float(t0), t_end=float(t_end), dt=float(dt),
            method=method, save_every=every, token_weights=token_weights, head_weights=head_weights,
            options=options, progress=progress, threads=threads,
            controller=PIController(
                defaults.RTOL if rtol is None else rtol, defaults.ATOL if atol is None else atol, dt, dt_min, dt_max
            ),
        )  # fmt: skip
    if any(v is not None for v in (rtol, atol, dt_min, dt_max)):
        name = next(
            n for n, v in (("rtol", rtol), ("atol", atol), ("dt_min", dt_min), ("dt_max", dt_max)) if v is not None
        )
        raise InputError(
            f"{name} applies to adaptive methods (bosh3, dopri5, dop853), not to the fixed-step method {method!r}",
            hint=Hint(name),
        )
    control = ConstantStep(dt).start(t0, t_end)
    n_steps = control.total
    if method in MOVEMENTS:
        raise InputError(
            f"method {method!r} is a minimising movement of one token cloud; ensembles step with an explicit "
            f"method: one of {', '.join(INTEGRATORS)}",
            hint=Hint("method"),
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
    observers: list[Observer] = []
    monitors: list[Float32Monitor] = []
    if X.dtype == torch.float32:
        monitors = [Float32Monitor() for _ in range(B)]
        observers.append(_MemberPrecision(monitors, stepper, f, model, a, w, every, options))
    if progress is not None:
        observers.append(ProgressReport(progress))
    costs = Costs({})
    pairs = float(B) * X.shape[1] ** 2 * H
    with thread_policy(threads, pairs).applied(pairs):
        saver.record(float(t0), X)

        def attempt(t: float, Y: torch.Tensor, h: float, first: Evaluation | None) -> Trial:
            return Trial(stepper.step(field, t, Y, h), 0.0)

        try:
            integrate(
                attempt, X, t=t0, control=control, saves=SaveAt(every=every).start(t0), recorders=[saver],
                observers=observers, costs=costs,
            )  # fmt: skip
        except StepFailed as e:
            raise NumericalInstability(
                f"{e.why} at t={t0 + e.k * dt:.6g} (step {e.k} of {n_steps}) in at least one member; the last good "
                f"state is t={e.t:.6g}. Lower dt, or the largest beta.",
                step=e.k,
                t=t0 + e.k * dt,
            ) from None
    flagged = [b for b, m in enumerate(monitors) if m.flagged]
    if flagged:
        warn(
            f"members {flagged}: " + monitors[flagged[0]].message(),
            PrecisionWarning,
        )
    provenance: dict[str, Any] = {
        "wall_time_s": _time.perf_counter() - start, "steps": n_steps, "seconds": costs.rounded(),
    }  # fmt: skip
    if monitors:
        provenance["float32_check"] = [m.summary() for m in monitors]
    return Ensemble(
        t=np.array(saver.ts),
        x=np.stack(saver.xs),
        betas=beta_arr,
        seeds=seed_list,
        diagnostics={k: np.stack([r[k] for r in saver.rows]) for k in ENSEMBLE_DIAGNOSTICS},
        model=model,
        method=method,
        dt=float(dt),
        provenance=provenance,
    )


@dataclass
class _MemberPrecision:
    """The float32 check of each member (:class:`~attnflow.solve.observers.PrecisionCheck`'s schedule),
    offered every accepted state of the ensemble."""

    monitors: list[Float32Monitor]
    stepper: Integrator
    f: EnsembleField
    model: str
    a: torch.Tensor
    w: torch.Tensor
    save_every: int
    options: KernelOptions
    name: str = "float32 check"

    def __post_init__(self) -> None:
        one = self.stepper.weights is not None and len(self.stepper.weights) == 1
        self.checks = [
            PrecisionCheck(m, self.stepper.step, self.model, self._member_heads(b), self.a, self.w, self.save_every,
                           self.options, one_stage=one)
            for b, m in enumerate(self.monitors)
        ]  # fmt: skip

    def _member_heads(self, b: int) -> Callable[[float], Heads]:
        return lambda t: self.f.heads_at(t)[b]

    def on_step(self, state: StepState) -> None:
        for b, check in enumerate(self.checks):
            check.on_step(replace(state, x=state.x[b], saved=None, evaluation=None))


class _EnsembleSaver:
    """Saves each member's state and :data:`ENSEMBLE_DIAGNOSTICS` at the save times."""

    name = "diagnostics"

    def __init__(self, f: EnsembleField, a: torch.Tensor) -> None:
        self.f, self.a = f, a
        self.rows: list[dict[str, np.ndarray]] = []
        self.ts: list[float] = []
        self.xs: list[np.ndarray] = []

    def record(self, t: float, Y: torch.Tensor) -> None:
        st = self.f.stats(t, Y, of_A=True)  # outputs of A_h x_j: the slope is the gradient flow's, whatever V_h
        log_F = st.log_abs_energy(self.a)
        m = (self.a[:, None] * Y).sum(-2)
        N = Y.shape[1]
        s2 = (Y.sum(-2) ** 2).sum(-1)
        self.rows.append(
            {
                "order_parameter": to_numpy(torch.linalg.vector_norm(m, dim=-1)).astype(np.float64),
                "log_abs_energy": to_numpy(log_F).astype(np.float64),
                "mean_inner": to_numpy((s2 - N) / max(1, N * (N - 1))).astype(np.float64),
                "log_slope": to_numpy(st.log_slope(Y, self.a)).astype(np.float64),
            }
        )
        self.ts.append(t)
        self.xs.append(to_numpy(Y).astype(np.float64))

    def on_step(self, state: StepState) -> None:
        if state.save:
            self.record(state.t, state.x)


def _dense_saves(
    step: _small.BatchedStep, m: int, x: np.ndarray, y: np.ndarray, t: float, h: float, t_new: float,
    saves: list[float], nxt: np.ndarray, out: np.ndarray, k: int,
) -> None:  # fmt: skip
    """Member ``m``'s save times inside its step ``t -> t_new`` from the step's dense output, retracted."""
    F, ok = step.dense(m, x, y, h)
    if not ok:
        raise NumericalInstability(
            f"member {m}: the field is not finite at t={t:.6g} (dense output); lower its beta", step=k, t=t
        )
    while saves[nxt[m]] < t_new:
        out[nxt[m], m] = retract(torch.from_numpy(_small.dense_value(x, F, (saves[nxt[m]] - t) / h))).numpy()
        nxt[m] += 1


def ensemble_threads(threads: int | None, B: int, N: int, H: int, stages: int) -> int:
    """Threads an adaptive ensemble of ``B`` members uses (at most ``B``): the
    :class:`~attnflow.core.threads.ThreadPolicy` of ``threads`` for the work of one round
    (``B stages H N^2`` kernel values). Every round ends when its slowest share does, so beside other
    work a second thread can lose (100 seeds of ``N = 32``: two threads took 2.0x the time of one at
    load 4.8 on two cores, 0.85x at load 3.4; docs/performance.md): small rounds stay on one thread."""
    return max(1, min(B, ThreadPolicy(threads).for_work(float(B) * stages * H * N * N)))


def _adaptive_ensemble(
    X: torch.Tensor, processes: list[WeightProcess], betas: np.ndarray, seeds: list[int | None], *, model: str,
    t0: float, t_end: float, dt: float, method: str, save_every: int, token_weights: ArrayLike | None,
    head_weights: ArrayLike | None, options: KernelOptions, controller: PIController,
    progress: Callable[[int, int], None] | None, threads: int | None = None,
) -> Ensemble:  # fmt: skip
    """Every member with its own PI step control, all members' trial steps in one compiled call per
    round; each member lands exactly on every save time, proposing its steps as a single run does
    (:meth:`~attnflow.solve.controllers.PIState.propose`). Members advance on their own clocks, so
    the rounds are this driver's own: :func:`~attnflow.solve.loop.integrate` steps one clock."""
    if not (math.isfinite(t_end) and t_end > t0):
        raise InputError(f"t_end must be a finite number larger than t0={t0}; got {t_end}", hint=Hint("t_end"))
    B, N, d = X.shape
    if not all(isinstance(p, Constant) for p in processes) or X.dtype != torch.float64 or X.device.type != "cpu":
        raise InputError(
            f"adaptive ensembles ({method!r}) run through the compiled small-cloud step: constant weights, "
            "float64 tokens on the CPU; use simulate for other runs, or a fixed-step method",
            hint=Hint("method"),
        )
    heads = [cast(Constant, p).heads for p in processes]
    if not _small.AVAILABLE or not all(_small.supported(h, "cpu", X.dtype) for h in heads):
        raise InputError(
            f"adaptive ensembles ({method!r}) need plain heads (no biases, mask or rotary) and numba",
            hint=Hint("weights"),
        )
    for hd in heads:
        check_model(model, hd)
    a = masses(token_weights, N, "token_weights", X)
    w = masses(head_weights, heads[0].H, "head_weights", X)
    A = np.stack([hd.A.double().numpy() * bt for hd, bt in zip(heads, betas)])
    V = np.stack([hd.values.double().numpy() * (bt if hd.V is None else 1.0) for hd, bt in zip(heads, betas)])
    pair = ADAPTIVE[method]
    tab = pair.arrays()
    spacing = dt * save_every
    dense_tab = pair.dense_arrays() if _saveat.DENSE_SAVES else None
    # With dense output (dop853) steps pass the save times and are not bounded by their spacing, as in
    # a single run (attnflow.solve.solver).
    bound = t_end - t0 if dense_tab is not None else spacing
    lo, hi = controller.bounds(bound)
    members = [controller.start(t_end, min(pair.order, pair.embedded_order), bound) for _ in range(B)]
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
    h = np.zeros(B)
    hit = np.zeros(B, dtype=np.bool_)
    a_np, w_np = to_numpy(a).astype(np.float64), to_numpy(w).astype(np.float64)
    n_threads = ensemble_threads(threads, B, N, heads[0].H, pair.stages)
    prepare("the small-cloud steps", _small.RUN_KERNELS, "small")  # compile in a child: same bits, cold or warm
    step = _small.BatchedStep(A, V, w_np, a_np, model, tab, controller.rtol, controller.atol, n_threads, dense_tab)
    start = _time.perf_counter()
    rounds = 0
    try:
        while True:
            active = nxt < len(saves)
            if not active.any():
                break
            for m in np.flatnonzero(active).tolist():
                stop = t_end if dense_tab is not None else saves[nxt[m]]
                h[m], _, hit[m] = members[m].propose(float(T[m]), int(accepted[m]), stop)
            Y, err, KL, ok = step(x, h, active, K1, have)
            evals[active] += pair.stages - have[active]
            for m in np.flatnonzero(active).tolist():
                e = float(err[m]) if ok[m] and np.isfinite(Y[m]).all() else math.inf
                if e <= 1.0:
                    members[m].accept(e, float(h[m]))
                    t_new = (t_end if dense_tab is not None else saves[nxt[m]]) if hit[m] else T[m] + h[m]
                    if dense_tab is not None and saves[nxt[m]] < t_new:
                        evals[m] += 3
                        _dense_saves(step, m, x[m], Y[m], float(T[m]), float(h[m]), t_new, saves, nxt, out,
                                     int(accepted[m]))  # fmt: skip
                    x[m], K1[m], have[m] = Y[m], KL[m], True
                    T[m] = t_new
                    if hit[m]:
                        out[nxt[m], m] = x[m]
                        nxt[m] += 1
                    accepted[m] += 1
                else:
                    rejected[m] += 1
                    if not members[m].reject(e, float(h[m]), float(T[m])):
                        why = "the field is not finite" if not ok[m] else "the tolerance cannot be met"
                        raise NumericalInstability(
                            f"member {m}: {why} at t={T[m]:.6g} with the smallest allowed step; loosen rtol/atol, "
                            "lower dt_min, or lower its beta",
                            step=int(accepted[m]), t=float(T[m]),
                        )  # fmt: skip
            rounds += 1
            if progress is not None and rounds % 64 == 0:
                progress(int(1000 * float(np.mean((T - t0) / (t_end - t0)))), 1000)
    finally:
        step.close()
    f = EnsembleField(
        model, [p.sampler(sd) for p, sd in zip(processes, seeds)], betas, a, w, X.dtype, X.device, options
    )
    saver = _EnsembleSaver(f, a)
    for j, t_s in enumerate(saves):
        saver.record(t_s, torch.from_numpy(out[j]))
    return Ensemble(
        t=np.array(saves), x=out, betas=betas, seeds=seeds,
        diagnostics={k: np.stack([r[k] for r in saver.rows]) for k in ENSEMBLE_DIAGNOSTICS},
        model=model, method=method, dt=float(dt),
        provenance={
            "wall_time_s": _time.perf_counter() - start, "rounds": rounds,
            "adaptive": {"accepted_steps": accepted.tolist(), "rejected_steps": rejected.tolist(),
                         "field_evaluations": evals.tolist(), "rtol": float(controller.rtol),
                         "atol": float(controller.atol), "dt_min": lo, "dt_max": hi, "compiled": True,
                         "threads": n_threads},
        },
    )  # fmt: skip
