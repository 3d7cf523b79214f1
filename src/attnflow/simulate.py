"""``simulate``: integrate ``dx_i/dt = v_t(x_i)`` from ``t0`` to ``t_end`` and record a :class:`Trajectory`.

Data flows one way: initial tokens + weight process -> integrator -> trajectory -> diagnostics.
"""

from __future__ import annotations

import math
import time as _time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ._arrays import ArrayLike, to_numpy, to_tensor
from .diagnostics import as_numpy_table, state_diagnostics
from .fields import MODELS, check_model, field_stats, masses
from .geometry import project_tangent
from .heads import Heads
from .integrators import get_integrator
from .weights import WeightProcess, WeightSampler, as_process


@dataclass
class Trajectory:
    """A simulated token flow at its save times.

    ``t`` ``(S,)``; ``x`` ``(S, N, d)``; ``A`` and ``V`` ``(S, H, d, d)`` the heads at those times
    (``V = None`` when ``V = A`` throughout); ``diagnostics[name]`` ``(S,)`` (see
    :data:`attnflow.diagnostics.DIAGNOSTICS`); masses ``token_weights`` ``(N,)``, ``head_weights`` ``(H,)``.
    """

    t: np.ndarray
    x: np.ndarray
    A: np.ndarray
    V: np.ndarray | None
    diagnostics: dict[str, np.ndarray]
    token_weights: np.ndarray
    head_weights: np.ndarray
    model: str
    method: str
    dt: float
    seed: int | None = None
    config: dict[str, Any] | None = None
    provenance: dict[str, Any] = field(default_factory=dict)

    @property
    def N(self) -> int:
        return int(self.x.shape[1])

    @property
    def d(self) -> int:
        return int(self.x.shape[2])

    @property
    def H(self) -> int:
        return int(self.A.shape[1])

    def heads_at(self, k: int) -> Heads:
        """The heads at save index ``k`` as a :class:`Heads`."""
        A = torch.from_numpy(self.A[k])
        return Heads(K=A, V=None if self.V is None else torch.from_numpy(self.V[k]))

    def to_xarray(self):
        """An ``xarray.Dataset`` with dims ``time, token, dim, head, row, col``."""
        from .io import trajectory_to_dataset

        return trajectory_to_dataset(self)

    def save(self, path, *, overwrite: bool = False, figures: bool = True) -> "Any":
        """Write the run folder (Zarr dataset, config YAML, provenance, figures) atomically."""
        from .io import save_run

        return save_run(self, path, overwrite=overwrite, figures=figures)


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
    backend: str = "auto",
) -> Trajectory:
    """Integrate ``dx_i/dt = v_t(x_i)`` of ``model`` (``mha``, ``gf``, ``usa``) on ``[t0, t_end]``.

    ``weights``: a :class:`~attnflow.weights.WeightProcess`, a constant ``(H, d, d)`` array or
    :class:`Heads`, or a callable ``t -> A | (A, V)``. ``seed`` drives stochastic weights (it
    overrides the process's own seed). The state is saved every ``save_every`` steps and at the end.
    ``backend`` picks the attention kernel (:data:`attnflow.backends.BACKENDS`; ``auto`` by default).
    """
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
    t = float(t0)
    record(t, x)
    for k in range(1, n_steps + 1):
        x = stepper.step(f, t, x, dt)
        t = t0 + k * dt
        if k % save_every == 0 or k == n_steps:
            if not bool(torch.isfinite(x).all()):
                raise FloatingPointError(
                    f"the tokens became NaN/inf at t={t:.6g} (step {k}); the step dt={dt} is too large for "
                    "these weights: lower dt"
                )
            record(t, x)
        if progress is not None:
            progress(k, n_steps)
    wall = _time.perf_counter() - start
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
        provenance={"wall_time_s": wall, "steps": n_steps, "dtype": str(x.dtype).replace("torch.", "")},
    )
