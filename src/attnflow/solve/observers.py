"""The observers :func:`attnflow.simulate` plugs into its stepping loop (:mod:`attnflow.solve.loop`).

* :class:`Saver` records the state, the heads and the diagnostics at the save times (a recorder:
  an overflow while it measures fails the step);
* :class:`PrecisionCheck` runs the float32 monitor at the save times;
* :class:`CheckpointWriter` writes a resumable checkpoint when the :class:`~attnflow.io.checkpoint.Checkpointer` says so;
* :class:`ProgressReport` calls a ``progress(k, n)`` callback.

The EDI recorder (:class:`attnflow.analysis.edi.StepRecorder`) wraps the step itself, because it
needs the integrator's stages.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from attnflow.analysis.diagnostics import (
    as_numpy_table,
    bulk_state_diagnostics,
    bulk_state_table,
    gram_buffer,
    state_diagnostics,
)
from attnflow.core.arrays import to_numpy
from attnflow.core.heads import Heads
from attnflow.dynamics.fields import FieldStats
from attnflow.io.checkpoint import Checkpoint, Checkpointer
from attnflow.kernels import small as _small
from attnflow.kernels.dispatch import KernelOptions
from attnflow.solve.guards import Float32Monitor, state_problem
from attnflow.solve.loop import Evaluation, StateRejected, StepState

#: Squared norms a saved float64 row may have and pass at once (half the state guard's tolerance 1e-6).
_LO2, _HI2 = (1.0 - 0.5e-6) ** 2, (1.0 + 0.5e-6) ** 2


@dataclass
class Saver:
    """The saved trajectory so far: times, tokens, heads and :data:`~attnflow.analysis.diagnostics.DIAGNOSTICS`.

    ``evaluate(t, x) -> (v_t(x), stats)`` makes a pass for the field and, when it can from the same
    kernel pass, the ``A``-only statistics the diagnostics need (``None``: they make their own pass);
    ``reuse(t, evaluation)`` says whether the step's own evaluation at the new state serves instead
    (the EDI recorder's end-of-step pass); ``heads_at(t)`` the run's weights; ``check_gf`` checks
    each saved head for the gradient-flow class (model ``gf``).

    ``deferred`` (a model name): the diagnostics are not computed at each save but in bulk when the
    rows are read (:meth:`flush`: :func:`~attnflow.analysis.diagnostics.bulk_state_diagnostics`, one
    batched pass for every pending state), so a save costs a copy of the state, not a kernel pass
    and a graph search. Only for runs whose diagnostics cannot fail at a finite state on the sphere
    (the normalised models ``mha`` and ``gf``, plain heads, float64; the solver decides): a save then
    checks the tokens alone, and :meth:`record` returns ``None`` (no pass to share with the step).
    """

    evaluate: Callable[[float, torch.Tensor], tuple[torch.Tensor, FieldStats | None]]
    heads_at: Callable[[float], Heads]
    a: torch.Tensor
    w: torch.Tensor
    cluster_eps: float
    check_gf: bool
    options: KernelOptions | None = None
    reuse: Callable[[float, Evaluation], bool] | None = None
    name: str = "diagnostics"
    rows: list[dict[str, float]] = field(default_factory=list)
    ts: list[float] = field(default_factory=list)
    xs: list[np.ndarray] = field(default_factory=list)
    As: list[np.ndarray] = field(default_factory=list)
    Vs: list[np.ndarray] = field(default_factory=list)
    any_V: bool = False
    #: The Gram matrix's buffer, reused at every save (see :func:`~attnflow.analysis.diagnostics.gram_diagnostics`).
    gram: torch.Tensor | None = None
    deferred: str | None = None
    #: Saved states whose diagnostics are still to be made (deferred mode): their row indices.
    pending: list[int] = field(default_factory=list)
    _checked: Heads | None = None
    _arrays: tuple[Heads, np.ndarray, np.ndarray] | None = None
    #: Deferred mode: the diagnostics of the first ``len(_columns[k])`` saved states as columns, made
    #: when every saved state was pending (their ``rows`` are filled only if something reads them).
    _columns: dict[str, np.ndarray] | None = None

    def record(self, t: float, y: torch.Tensor, known: Evaluation | None = None) -> Evaluation | None:
        """Save the state ``y`` at time ``t`` with its diagnostics; ``known``: the step's evaluation there.
        Returns the evaluation the diagnostics used (``fresh`` when this call made the pass; ``None``
        when they are deferred)."""
        heads = self.heads_at(t)
        if self.check_gf and heads is not self._checked:  # the same heads object: checked once
            heads.check_gradient_flow()
            self._checked = heads
        if self.deferred is not None:
            self.pending.append(len(self.rows))
            self.rows.append({})
            self._append(t, y, heads)
            return None
        if known is not None and known.t == t and self.reuse is not None and self.reuse(t, known):
            used = known
        else:
            v, stats = self.evaluate(t, y)
            used = Evaluation(t, v, stats, fresh=True)
        self.gram = gram_buffer(y, self.gram)
        self.rows.append(
            state_diagnostics(
                y, heads, self.a, self.w, used.v, cluster_eps=self.cluster_eps, options=self.options,
                stats=used.stats, gram_out=self.gram,
            )
        )  # fmt: skip
        self._append(t, y, heads)
        return used

    def _append(self, t: float, y: torch.Tensor, heads: Heads) -> None:
        self._append_array(
            t, y.numpy().copy() if y.dtype == torch.float64 and y.device.type == "cpu" else to_numpy(y).astype(np.float64),
            heads,
        )  # fmt: skip

    def _append_array(self, t: float, xn: np.ndarray, heads: Heads) -> None:
        """Keep ``xn`` (float64, owned by the saver from now on) as the state saved at ``t``."""
        self.ts.append(t)
        self.xs.append(xn)
        A, V = self._head_arrays(heads)
        self.As.append(A)  # shared, never written: np.stack copies them
        self.Vs.append(V)
        self.any_V = self.any_V or heads.V is not None

    def _head_arrays(self, heads: Heads) -> tuple[np.ndarray, np.ndarray]:
        """``heads.A`` and ``heads.values`` as float64 arrays, converted once per heads object (constant weights: once)."""
        if self._arrays is None or self._arrays[0] is not heads:
            self._arrays = (heads, to_numpy(heads.A).astype(np.float64), to_numpy(heads.values).astype(np.float64))
        return self._arrays[1], self._arrays[2]

    def _on_sphere(self) -> bool:
        """Whether the last saved copy's rows have norms within half the float64 guard's tolerance."""
        xn = self.xs[-1]
        if _small.AVAILABLE:
            return bool(_small.rows_within(xn, _LO2, _HI2))
        sq = np.einsum("ij,ij->i", xn, xn)
        return bool(sq.min() >= _LO2 and sq.max() <= _HI2)

    def flush(self, stacked: tuple[np.ndarray, np.ndarray, np.ndarray | None] | None = None) -> None:
        """Make the pending rows (deferred mode), all in one batched pass; ``stacked``: every saved
        ``x``, ``A``, ``V`` already stacked (what :meth:`arrays` returns), so they are not stacked twice."""
        if not self.pending:
            return
        self._fill_rows()
        idx = self.pending
        if stacked is not None:
            every = len(idx) == len(self.xs)  # the usual case: the stacks as they are
            X, A = (torch.from_numpy(a if every else a[idx]) for a in stacked[:2])
            V = None if stacked[2] is None else torch.from_numpy(stacked[2] if every else stacked[2][idx])
        else:
            X = torch.from_numpy(np.stack([self.xs[i] for i in idx]))
            A = torch.from_numpy(np.stack([self.As[i] for i in idx]))
            V = torch.from_numpy(np.stack([self.Vs[i] for i in idx])) if self.any_V else None
        a, w = self.a.to(torch.float64), self.w.to(torch.float64)
        assert self.deferred is not None
        if len(idx) == len(self.rows):  # every saved state: the columns as they come, no row dictionaries
            self._columns = bulk_state_table(X, A, V, a, w, self.deferred, cluster_eps=self.cluster_eps)
        else:
            rows = bulk_state_diagnostics(X, A, V, a, w, self.deferred, cluster_eps=self.cluster_eps)
            for i, row in zip(idx, rows):
                self.rows[i] = row
        self.pending = []

    def _fill_rows(self) -> None:
        """Write the rows that :attr:`_columns` holds into :attr:`rows`."""
        if self._columns is not None:
            cols = self._columns
            for i in range(len(next(iter(cols.values())))):
                self.rows[i] = {k: float(c[i]) for k, c in cols.items()}
            self._columns = None

    def table(self) -> dict[str, np.ndarray]:
        """The diagnostics of every saved state as columns (pending ones made first)."""
        self.flush()
        if self._columns is not None and len(next(iter(self._columns.values()))) == len(self.rows):
            return self._columns
        self._fill_rows()
        return as_numpy_table(self.rows)

    def on_saves(self, k: int, n_steps: int, ts: list[float], X: np.ndarray, dt: float) -> None:
        """The states ``X`` ``(m, N, d)`` (a fresh float64 array, kept as it is) saved at the times ``ts``
        inside step ``k``: as ``m`` calls of :meth:`on_step`, with one sphere check for the block and
        no copy, when the diagnostics are deferred and every row passes at once; state by state else."""
        if (
            self.deferred is None or not _small.AVAILABLE or X.dtype != np.float64 or not X.flags.c_contiguous
            or not _small.rows_within(X.reshape(-1, X.shape[-1]), _LO2, _HI2)
        ):  # fmt: skip
            for t, x in zip(ts, X):
                self.on_step(StepState(k=k, n_steps=n_steps, t=t, x=torch.from_numpy(x), save=True, dt=dt))
            return
        heads = self.heads_at(ts[0])
        m = len(ts)
        if m > 1 and heads is not self.heads_at(ts[-1]):  # weights that change inside the step: time by time
            for t, x in zip(ts, X):
                self._defer(t, x, self.heads_at(t))
            return
        # Deferred diagnostics serve constant and layer weights only (the solver decides): the same heads
        # at both ends of the interval are the heads throughout. The m states at once, as m _defer calls.
        if self.check_gf and heads is not self._checked:
            heads.check_gradient_flow()
            self._checked = heads
        n = len(self.rows)
        self.pending.extend(range(n, n + m))
        self.rows.extend([{} for _ in range(m)])
        self.ts.extend(ts)
        self.xs.extend(X)
        A, V = self._head_arrays(heads)
        self.As.extend([A] * m)
        self.Vs.extend([V] * m)
        self.any_V = self.any_V or heads.V is not None

    def _defer(self, t: float, xn: np.ndarray, heads: Heads) -> None:
        """Save ``xn`` at ``t`` with its diagnostics pending (deferred mode)."""
        if self.check_gf and heads is not self._checked:
            heads.check_gradient_flow()
            self._checked = heads
        self.pending.append(len(self.rows))
        self.rows.append({})
        self._append_array(t, xn, heads)

    def on_step(self, state: StepState) -> None:
        if state.save:
            state.saved = self.record(state.t, state.x, state.evaluation)
            if self.deferred is not None:  # the tokens alone (a finite copy on the sphere passes at once)
                why = None if self._on_sphere() else state_problem(state.x)
            else:
                why = state_problem(state.x, self.rows[-1])
            if why is not None:  # a degenerate state is not saved: the run stops at the last good one
                for saved in (self.rows, self.ts, self.xs, self.As, self.Vs):
                    saved.pop()
                if self.pending and self.pending[-1] == len(self.rows):
                    self.pending.pop()
                raise StateRejected(why)

    def restore(self, ck: Checkpoint) -> None:
        """Continue from what a checkpoint saved."""
        self.any_V = ck.any_V
        self.ts.extend(float(v) for v in ck.saved_t)
        self.xs.extend(ck.saved_x)
        self.As.extend(ck.saved_A)
        self.Vs.extend(ck.saved_V)
        self.rows.extend({k: float(ck.diagnostics[k][i]) for k in ck.diagnostics} for i in range(len(ck.saved_t)))

    def checkpoint_fields(self) -> dict[str, Any]:
        """What a :class:`~attnflow.io.checkpoint.Checkpoint` keeps of the saved trajectory so far."""
        return {
            "saved_t": np.array(self.ts),
            "saved_x": _stack(self.xs),
            "saved_A": _stack_shared(self.As),
            "saved_V": _stack_shared(self.Vs),
            "any_V": self.any_V,
            "diagnostics": self.table(),
        }

    def arrays(self, lazy: Callable[[Callable[[], Any]], Any] | None = None) -> dict[str, Any]:
        """``t``, ``x``, ``A``, ``V`` (``None`` when ``V = A`` throughout) and the diagnostics table.

        ``lazy``: when every saved state's diagnostics are still pending (deferred mode, not resumed),
        the table is ``lazy(make)`` instead, ``make()`` making it on first use (the same numbers)."""
        x, A = _stack(self.xs), _stack_shared(self.As)
        V = _stack_shared(self.Vs) if self.any_V else None
        out = {"t": np.array(self.ts), "x": x, "A": A, "V": V}
        if lazy is not None and self.deferred is not None and self.pending and len(self.pending) == len(self.rows):
            # What flush would do for every state, holding the stacks only (not the saver and its lists).
            Xt, At, Vt = torch.from_numpy(x), torch.from_numpy(A), None if V is None else torch.from_numpy(V)
            a, w, model, eps = self.a.to(torch.float64), self.w.to(torch.float64), self.deferred, self.cluster_eps
            return {**out, "diagnostics": lazy(lambda: bulk_state_table(Xt, At, Vt, a, w, model, cluster_eps=eps))}
        self.flush((x, A, V))
        return {**out, "diagnostics": self.table()}


def _stack(arrays: list[np.ndarray]) -> np.ndarray:
    """``np.stack(arrays)`` of equal-shaped arrays, through ``np.array`` (the same copy; 67 us against
    234 us for 301 states of ``(32, 3)``: ``np.stack`` checks and expands every entry in Python)."""
    out = np.array(arrays) if arrays else np.stack(arrays)
    return out if out.ndim == arrays[0].ndim + 1 else np.stack(arrays)


def _stack_shared(arrays: list[np.ndarray]) -> np.ndarray:
    """``np.stack(arrays)``; one copy repeated when every entry is the same array (constant weights)."""
    if arrays and all(a is arrays[0] for a in arrays):
        return np.repeat(arrays[0][None], len(arrays), axis=0)
    return _stack(arrays)


#: Steps between two float32 checks. An Euler check costs two float64 passes of ``m`` query tokens
#: (:data:`~attnflow.solve.guards.PRECISION_ROWS`) against all ``N`` keys (one at the state, giving
#: the field and the energy gradient, one at the half step): about one evaluation of the run at
#: ``N = 1024``, ``d = 16``, ``H = 4`` in float32 (3.1 ms against 3.0 ms, measured; the fused kernel
#: fills its blocks poorly with 64 rows, so a row pass costs more than ``m / N`` of a full one). A
#: method of ``s`` stages adds ``4 s - 3`` float32 passes (13 for rk4, 3.3 of its steps), so checking
#: every 200 steps keeps any run's check below 2% of it once it is 200 steps long.
PRECISION_CHECK_EVERY = 200


@dataclass
class PrecisionCheck:
    """The float32 monitor (:class:`~attnflow.solve.guards.Float32Monitor`), offered every accepted state.

    Fixed steps (``save_every`` given): it checks at the first save time and then at every save time
    that closes ``every_steps`` steps, each check standing for the steps up to the next one (its
    ``weight``), so the summed drift estimates the whole run at a bounded cost. The schedule depends
    on the step index only, so a resumed run checks where the uninterrupted one does. Adaptive steps
    (``save_every=None``): it checks at the first save time and then at the first save time
    ``every_steps`` accepted steps after the last check, each check standing for the steps since the
    previous one (``last_k`` travels in checkpoints). The check steps from the saved state with the
    step that led to it, starting from the saver's own field there (``state.saved``), so the check's
    float32 step is the run's. ``one_stage``: the method evaluates the field once per step (Euler).
    """

    monitor: Float32Monitor
    step: Callable[..., torch.Tensor]
    model: str
    heads_at: Callable[[float], Heads]
    a: torch.Tensor
    w: torch.Tensor
    save_every: int | None
    options: KernelOptions | None = None
    every_steps: int = PRECISION_CHECK_EVERY
    name: str = "float32 check"
    one_stage: bool = False
    #: The step of the last check (adaptive schedule).
    last_k: int = 0

    @property
    def stride(self) -> int:
        """Save times between two checks (fixed steps)."""
        return max(1, -(-self.every_steps // (self.save_every or 1)))

    def due(self, k: int, n_steps: int) -> bool:
        """Whether step ``k`` (a save step) is a check (a run shorter than ``save_every`` checks its end)."""
        if self.save_every is None:
            return self.monitor.checks == 0 or k - self.last_k >= self.every_steps
        if n_steps < self.save_every:
            return k == n_steps
        return k % self.save_every == 0 and (k // self.save_every - 1) % self.stride == 0

    def on_step(self, state: StepState) -> None:
        if state.save and self.due(state.k, state.n_steps):
            if self.save_every is None:
                weight, self.last_k = state.k - self.last_k, state.k
            else:
                weight = min(self.stride * self.save_every, state.n_steps - state.k + 1)
            v32 = None if state.saved is None else state.saved.v
            self.monitor.check(
                self.step, self.model, self.heads_at(state.t), self.a, self.w, state.t, state.x, state.dt,
                weight=weight, options=self.options, v32=v32, one_stage=self.one_stage, seed=state.k,
            )  # fmt: skip


@dataclass
class CheckpointWriter:
    """Writes ``snapshot(k, x)`` through ``checkpointer`` whenever it is due (never at the last step:
    the finished run is written instead)."""

    checkpointer: Checkpointer
    snapshot: Callable[[int, torch.Tensor], Checkpoint]
    name: str = "checkpoint"

    def on_step(self, state: StepState) -> None:
        if state.k < state.n_steps and self.checkpointer.due(state.k):
            self.checkpointer.write(self.snapshot(state.k, state.x))


@dataclass
class ProgressReport:
    """Calls ``progress(k, n_steps)`` after every step."""

    progress: Callable[[int, int], None]
    name: str = "progress"

    def on_step(self, state: StepState) -> None:
        self.progress(state.k, state.n_steps)
