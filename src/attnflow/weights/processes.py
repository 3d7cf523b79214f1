"""Weight processes ``Theta_t``: how the heads ``(A_h(t), V_h(t))`` change with depth ``t``.

A :class:`WeightProcess` is a description; :meth:`WeightProcess.sampler` gives a
:class:`WeightSampler`, a callable ``t -> Heads`` that the integrator queries at its stage times
in increasing order. Deterministic processes evaluate a formula; the Ornstein-Uhlenbeck process
draws its exact Gaussian transition from the previous query time, so an OU path is sampled on
exactly the grid the integrator uses.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from attnflow.core.arrays import to_numpy, to_tensor
from attnflow.core.errors import InputError
from attnflow.core.heads import Heads, as_heads

ValueRule = str  # "A" (V = A), "-A" (V = -A) or "identity"


def _stack(A: Any, name: str = "A") -> np.ndarray:
    arr = np.asarray(to_numpy(A), dtype=np.float64)
    if arr.ndim == 2:
        arr = arr[None]
    if arr.ndim != 3 or arr.shape[1] != arr.shape[2]:
        raise InputError(f"{name} must have shape (H, d, d); got {arr.shape}")
    if not np.isfinite(arr).all():
        raise InputError(f"{name} contains NaN or inf")
    return arr


def _per_head(val: Any, H: int, name: str) -> np.ndarray:
    arr = np.asarray(val, dtype=np.float64)
    if arr.ndim == 0:
        return np.full(H, float(arr))
    if arr.shape != (H,):
        raise InputError(f"{name} must be a number or have shape ({H},); got {arr.shape}")
    return arr


def _heads(A: np.ndarray, value: ValueRule | np.ndarray | None) -> Heads:
    At = torch.from_numpy(np.ascontiguousarray(A))
    if value is None or (isinstance(value, str) and value == "A"):
        return Heads(K=At)
    if isinstance(value, str):
        if value == "-A":
            return Heads(K=At, V=-At)
        if value == "identity":
            return Heads(K=At, V=torch.eye(A.shape[-1], dtype=At.dtype).expand_as(At))
        raise InputError(f"unknown value rule {value!r}; choose 'A', '-A' or 'identity'")
    return Heads(K=At, V=torch.from_numpy(np.ascontiguousarray(value)))


def _is_symmetric(A: np.ndarray) -> bool:
    return bool(np.allclose(A, A.transpose(0, 2, 1), atol=1e-12 * max(1.0, np.abs(A).max())))


class WeightSampler:
    """Callable ``t -> Heads`` for one realisation of a process (deterministic ones ignore state)."""

    def __init__(self, fn: Callable[[float], Heads]):
        self._fn = fn

    def __call__(self, t: float) -> Heads:
        return self._fn(float(t))

    def get_state(self) -> dict:
        return {}

    def set_state(self, state: dict) -> None:
        pass

    def left(self, t: float) -> Heads:
        """The left limit ``Theta_{t-}`` (differs from ``self(t)`` only at a jump)."""
        return self(t)

    def next_break(self, t: float) -> float:
        """The first time after ``t`` where the weights jump or stop being smooth (``inf``: none)."""
        return math.inf

    def forget_before(self, t: float) -> None:
        """No query will come before ``t`` any more (a path sampler may drop what it kept)."""


class LayersSampler(WeightSampler):
    """``t -> `` the block of :class:`Layers` at ``t`` (right-continuous), with left limits and jump times."""

    def __init__(self, process: Layers):
        super().__init__(lambda t: process.layers[process.layer_index(t)])
        self.process = process

    def left(self, t: float) -> Heads:
        P = self.process
        return P.layers[min(max(math.ceil(float(t) * P.L / P.t_end - 1e-9) - 1, 0), P.L - 1)]

    def next_break(self, t: float) -> float:
        P = self.process
        nxt = P.layer_index(t) + 1
        return nxt * P.t_end / P.L if nxt < P.L else math.inf


class WeightProcess(ABC):
    """``Theta_t = sum_h w_h delta_{theta_h(t)}``: a time-dependent family of ``H`` heads on ``R^d``."""

    H: int
    d: int

    @abstractmethod
    def sampler(self, seed: int | None = None) -> WeightSampler:
        """A fresh realisation, queried at non-decreasing times."""

    @property
    def gradient_flow(self) -> bool:
        """True when every ``A_h(t)`` is symmetric and ``V_h(t) = A_h(t)`` (model ``gf`` allowed)."""
        return False

    def derivative(self, t: float) -> torch.Tensor | None:
        """``dA/dt`` ``(H, d, d)`` for smooth processes; ``None`` where only increments exist."""
        return None

    @property
    def derivative_source(self) -> str:
        """Where :meth:`derivative` comes from: ``"closed form"``, ``"given"`` (by the user),
        ``"finite difference"`` (of a callable path) or ``"none"`` (only increments exist)."""
        return "none"

    def adaptive_sampler(self, seed: int | None, grid: float) -> WeightSampler:
        """A realisation for adaptive steps: a function of ``(seed, t)`` only, whatever the query
        order (a rejected step queries times it then abandons). ``grid``: the spacing on which a
        rough (stochastic) path is drawn. Deterministic processes: :meth:`sampler`."""
        return self.sampler(seed)

    def describe(self) -> dict:
        return {"process": type(self).__name__, "H": self.H, "d": self.d}


class Constant(WeightProcess):
    """The autonomous case: ``A_h(t) = A_h``, ``V_h(t) = V_h`` (``V=None`` means ``V = A``)."""

    def __init__(self, A: Any, V: Any = None):
        self.heads = as_heads(A, V).to(dtype=torch.float64)
        self.H, self.d = self.heads.H, self.heads.d

    def sampler(self, seed: int | None = None) -> WeightSampler:
        return WeightSampler(lambda t: self.heads)

    @property
    def gradient_flow(self) -> bool:
        try:
            self.heads.check_gradient_flow()
        except ValueError:
            return False
        return True

    def derivative(self, t: float) -> torch.Tensor:
        return torch.zeros(self.H, self.d, self.d, dtype=torch.float64)

    @property
    def derivative_source(self) -> str:
        return "closed form"


class Layers(WeightProcess):
    """``L`` blocks, piecewise constant on ``[l T/L, (l+1) T/L)``: the depth of a real network.

    ``As`` is a list of ``(H, d, d)`` arrays (or :class:`Heads`), ``V`` an optional matching list.
    """

    def __init__(self, As: Sequence[Any], t_end: float, V: Sequence[Any] | None = None):
        if len(As) == 0:
            raise InputError("Layers needs at least one layer")
        if not t_end > 0:
            raise InputError(f"t_end must be positive; got {t_end}")
        if V is not None and len(V) != len(As):
            raise InputError(f"got {len(As)} layers of A but {len(V)} of V")
        self.layers = [as_heads(A, None if V is None else V[i]).to(dtype=torch.float64) for i, A in enumerate(As)]
        shapes = {(h.H, h.d) for h in self.layers}
        if len(shapes) != 1:
            raise InputError(f"all layers must have the same (H, d); got {sorted(shapes)}")
        self.H, self.d = shapes.pop()
        self.t_end = float(t_end)

    @property
    def L(self) -> int:
        return len(self.layers)

    def layer_index(self, t: float) -> int:
        # The tolerance keeps grid times like 3 * (T/3) computed in floating point in block 3.
        return min(max(int(math.floor(t * self.L / self.t_end + 1e-9)), 0), self.L - 1)

    def sampler(self, seed: int | None = None) -> WeightSampler:
        return LayersSampler(self)

    @property
    def gradient_flow(self) -> bool:
        return all(Constant(h).gradient_flow for h in self.layers)

    def describe(self) -> dict:
        return {**super().describe(), "L": self.L, "t_end": self.t_end}


class Oscillating(WeightProcess):
    """``A_h(t) = Abar_h + C_h sin(omega_h t + phi_h)``: non-integrable, ``|Theta'_t|`` never decays."""

    def __init__(self, A_bar: Any, C: Any, omega: Any, phase: Any = 0.0, *, value: ValueRule = "A"):
        self.A_bar = _stack(A_bar, "A_bar")
        self.H, self.d = self.A_bar.shape[0], self.A_bar.shape[1]
        C_arr = np.asarray(to_numpy(C), dtype=np.float64)
        self.C = np.broadcast_to(C_arr if C_arr.ndim != 0 else C_arr * np.eye(self.d), self.A_bar.shape).copy()
        self.omega = _per_head(omega, self.H, "omega")
        self.phase = _per_head(phase, self.H, "phase")
        self.value = value

    def A_at(self, t: float) -> np.ndarray:
        return self.A_bar + self.C * np.sin(self.omega * t + self.phase)[:, None, None]

    def sampler(self, seed: int | None = None) -> WeightSampler:
        return WeightSampler(lambda t: _heads(self.A_at(t), self.value))

    @property
    def gradient_flow(self) -> bool:
        return self.value == "A" and _is_symmetric(self.A_bar) and _is_symmetric(self.C)

    def derivative(self, t: float) -> torch.Tensor:
        dA = self.C * (self.omega * np.cos(self.omega * t + self.phase))[:, None, None]
        return torch.from_numpy(dA)

    @property
    def derivative_source(self) -> str:
        return "closed form"

    def describe(self) -> dict:
        return {**super().describe(), "omega": self.omega.tolist(), "phase": self.phase.tolist()}


def plane_rotation(u: np.ndarray, v: np.ndarray, angle: float) -> np.ndarray:
    """``R = exp(angle J)``, ``J = v u^T - u v^T``: the rotation by ``angle`` in the plane of the orthonormal ``u, v``
    (``u`` towards ``v``), the identity on its complement: ``R = I + sin(angle) J - (1 - cos(angle)) (u u^T + v v^T)``."""
    J = np.outer(v, u) - np.outer(u, v)
    P = np.outer(u, u) + np.outer(v, v)
    return np.eye(len(u)) + math.sin(angle) * J - (1.0 - math.cos(angle)) * P


class Rotated(WeightProcess):
    """``A_h(t) = R_t Atilde_h(t) R_t^T`` (and ``V_h`` alike), ``R_t`` the rotation by ``rate (t0 + t)`` in the plane
    of the orthonormal ``u, v`` (:func:`plane_rotation`): the process ``inner`` seen in a frame that turns at
    ``rate``. The ``gf`` field is equivariant (``v(R x; R A R^T) = R v(x; A)``), so a cloud of this law is a cloud
    of ``inner`` carried by the turn: its stationary points turn rigidly at ``rate``, a path of infinite length
    however ``inner`` converges. Dense heads only."""

    def __init__(self, inner: WeightProcess, u: Any, v: Any, rate: float, t0: float = 0.0):
        uu, vv = np.asarray(u, dtype=np.float64), np.asarray(v, dtype=np.float64)
        if uu.shape != (inner.d,) or vv.shape != (inner.d,):
            raise InputError(f"u and v must be vectors of length d = {inner.d}; got {uu.shape} and {vv.shape}")
        if not np.allclose([uu @ uu, vv @ vv, uu @ vv], [1.0, 1.0, 0.0], atol=1e-9):
            raise InputError("u and v must be orthonormal")
        if not math.isfinite(rate) or not math.isfinite(t0):
            raise InputError(f"rate and t0 must be finite; got rate={rate}, t0={t0}")
        self.inner, self.u, self.v, self.rate, self.t0 = inner, uu, vv, float(rate), float(t0)
        self.H, self.d = inner.H, inner.d

    def rotation(self, t: float) -> np.ndarray:
        """``R_t``."""
        return plane_rotation(self.u, self.v, self.rate * (self.t0 + float(t)))

    def sampler(self, seed: int | None = None) -> WeightSampler:
        return RotatedSampler(self, self.inner.sampler(seed))

    @property
    def gradient_flow(self) -> bool:
        return self.inner.gradient_flow

    def describe(self) -> dict:
        return {**super().describe(), "inner": self.inner.describe(), "rate": self.rate, "t0": self.t0}


class RotatedSampler(WeightSampler):
    """:class:`Rotated`'s realisation: ``inner``'s heads at ``t``, turned by ``R_t``; state and breaks are inner's."""

    def __init__(self, process: Rotated, inner: WeightSampler):
        self.process, self.inner = process, inner

    def _turn(self, h: Heads, t: float) -> Heads:
        if (
            h.Q is not None
            or h.bias_q is not None
            or h.bias_k is not None
            or h.bias_v is not None
            or h.rope is not None
        ):
            raise InputError("Rotated takes dense heads (A_h, V_h) without biases or rotary embeddings")
        R = torch.from_numpy(self.process.rotation(t)).to(h.K.dtype)
        turn = lambda M: R @ M @ R.T
        return Heads(K=turn(h.K), V=None if h.V is None else turn(h.V))

    def __call__(self, t: float) -> Heads:
        return self._turn(self.inner(float(t)), float(t))

    def left(self, t: float) -> Heads:
        return self._turn(self.inner.left(float(t)), float(t))

    def next_break(self, t: float) -> float:
        return self.inner.next_break(t)

    def forget_before(self, t: float) -> None:
        self.inner.forget_before(t)

    def get_state(self) -> dict:
        return self.inner.get_state()

    def set_state(self, state: dict) -> None:
        self.inner.set_state(state)


def ou_stationary_scale(sigma: float, rate: float) -> float:
    """``c = sigma / sqrt(2 rate)``: the scale of the OU law's stationary limit, ``A_h ~ Abar_h + c S_h``."""
    return sigma / math.sqrt(2.0 * rate)


class OrnsteinUhlenbeck(WeightProcess):
    """``dA_h = -rate (A_h - Abar_h) dt + sigma dS_h``, sampled with its exact Gaussian transition

    ``A(t+h) = Abar + e^{-rate h} (A(t) - Abar) + c_h S``, ``c_h = sigma sqrt((1 - e^{-2 rate h}) / (2 rate))``,
    with ``S = (G + G^T)/2`` (``symmetric=True``, keeps ``A`` symmetric for ``gf``) or ``S = G``,
    ``G`` i.i.d. standard normal. ``A0=None`` starts at ``Abar``.
    """

    def __init__(
        self,
        A_bar: Any,
        rate: float,
        sigma: float,
        A0: Any = None,
        symmetric: bool = True,
        seed: int | None = None,
        *,
        value: ValueRule = "A",
    ):
        self.A_bar = _stack(A_bar, "A_bar")
        self.H, self.d = self.A_bar.shape[0], self.A_bar.shape[1]
        self.A0 = self.A_bar.copy() if A0 is None else _stack(A0, "A0")
        if self.A0.shape != self.A_bar.shape:
            raise InputError(f"A0 must have the shape of A_bar {self.A_bar.shape}; got {self.A0.shape}")
        if rate < 0 or sigma < 0:
            raise InputError(f"rate and sigma must be non-negative; got rate={rate}, sigma={sigma}")
        self.rate, self.sigma = float(rate), float(sigma)
        self.symmetric, self.seed, self.value = bool(symmetric), seed, value

    @property
    def stationary_scale(self) -> float:
        """``c = sigma / sqrt(2 rate)`` (:func:`ou_stationary_scale`): the stationary law's scale."""
        return ou_stationary_scale(self.sigma, self.rate)

    def transition_scale(self, h: float) -> float:
        """``c_h``: the noise scale of the exact transition over a time ``h``."""
        if self.rate == 0.0:
            return self.sigma * math.sqrt(h)
        return self.sigma * math.sqrt(-math.expm1(-2.0 * self.rate * h) / (2.0 * self.rate))

    def noise(self, rng: np.random.Generator) -> np.ndarray:
        G = rng.standard_normal(self.A_bar.shape)
        return 0.5 * (G + G.transpose(0, 2, 1)) if self.symmetric else G

    def transition(self, A: np.ndarray, h: float, rng: np.random.Generator) -> np.ndarray:
        """One exact draw of ``A(t + h)`` given ``A(t) = A``."""
        return self.A_bar + math.exp(-self.rate * h) * (A - self.A_bar) + self.transition_scale(h) * self.noise(rng)

    def mean(self, t: float) -> np.ndarray:
        """``E A(t) = Abar + e^{-rate t} (A0 - Abar)``."""
        return self.A_bar + math.exp(-self.rate * t) * (self.A0 - self.A_bar)

    def sampler(self, seed: int | None = None) -> OUSampler:
        return OUSampler(self, self.seed if seed is None else seed)

    def adaptive_sampler(self, seed: int | None, grid: float) -> OUGridSampler:
        """The path on the grid ``t_j = j grid`` (exact transitions), linear in between: :class:`OUGridSampler`."""
        return OUGridSampler(self, self.seed if seed is None else seed, grid)

    def path(self, times: Sequence[float], seed: int | None = None) -> np.ndarray:
        """One realisation ``A(t_k)`` ``(K, H, d, d)`` at increasing ``times`` (from ``A0`` at ``t = 0``).

        Exact transitions between successive times, drawn like :class:`OUSampler` does. Used with
        :class:`Sampled` on a fine grid, it gives runs at several steps ``dt`` the *same* Brownian path
        (every coarser grid's stage times being nodes of the fine one).
        """
        ts = np.asarray(times, dtype=np.float64)
        if ts.ndim != 1 or len(ts) == 0 or ts[0] < 0 or np.any(np.diff(ts) < 0):
            raise InputError("times must be a non-empty, non-decreasing sequence of non-negative numbers")
        s = OUSampler(self, self.seed if seed is None else seed)
        out = np.empty((len(ts), *self.A_bar.shape))
        for k, t in enumerate(ts):
            s(float(t))
            out[k] = s.A
        return out

    @property
    def gradient_flow(self) -> bool:
        return self.symmetric and self.value == "A" and _is_symmetric(self.A_bar) and _is_symmetric(self.A0)

    def describe(self) -> dict:
        return {**super().describe(), "rate": self.rate, "sigma": self.sigma, "symmetric": self.symmetric}


class OUSampler(WeightSampler):
    """One OU path, extended forward on demand by exact transitions between query times."""

    def __init__(self, process: OrnsteinUhlenbeck, seed: int | None):
        self.process = process
        self.rng = np.random.default_rng(seed)
        self.t = 0.0
        self.A = process.A0.copy()
        self._heads = _heads(self.A, process.value)

    def __call__(self, t: float) -> Heads:
        t = float(t)
        if t < self.t - 1e-12:
            raise InputError(f"an OU path is sampled forward in time: asked for t={t} after t={self.t}")
        if t > self.t + 1e-15:
            self.A = self.process.transition(self.A, t - self.t, self.rng)
            self.t = t
            self._heads = _heads(self.A, self.process.value)
        return self._heads

    def get_state(self) -> dict:
        return {"t": self.t, "A": self.A.copy(), "rng": self.rng.bit_generator.state}

    def set_state(self, state: dict) -> None:
        self.t = float(state["t"])
        self.A = np.array(state["A"], dtype=np.float64)
        self.rng.bit_generator.state = state["rng"]
        self._heads = _heads(self.A, self.process.value)


class OUGridSampler(WeightSampler):
    """One OU path drawn on the fixed grid ``t_j = j h`` and linear in between: a function of ``(seed, t)``.

    ``A(t_{j+1}) = Abar + e^{-rate h} (A(t_j) - Abar) + c_h S_j`` with the noise ``S_j`` of interval
    ``j`` drawn from a generator keyed by ``(seed, j // BLOCK)``, so the value at any ``t`` does not
    depend on which times were asked before (an adaptive step that is rejected and retried sees the
    same path). The grid nodes are the path's breaks (:meth:`next_break`): adaptive steps stop there,
    so each step sees weights that are linear in ``t``.
    """

    BLOCK = 256

    def __init__(self, process: OrnsteinUhlenbeck, seed: int | None, h: float):
        if not (h > 0 and math.isfinite(h)):
            raise InputError(f"the OU grid spacing must be a positive number; got {h}")
        self.process, self.h = process, float(h)
        self.seed = int(np.random.default_rng().integers(2**63)) if seed is None else int(seed)
        self._nodes: dict[int, np.ndarray] = {0: process.A0.copy()}
        self._blocks: dict[int, np.ndarray] = {}
        self._last: tuple[float, Heads] | None = None

    def _noise(self, i: int) -> np.ndarray:
        b = i // self.BLOCK
        if b not in self._blocks:
            if len(self._blocks) > 2:
                self._blocks.pop(min(self._blocks))
            rng = np.random.default_rng(np.random.SeedSequence([self.seed, b]))
            G = rng.standard_normal((self.BLOCK, *self.process.A_bar.shape))
            self._blocks[b] = 0.5 * (G + G.transpose(0, 1, 3, 2)) if self.process.symmetric else G
        return self._blocks[b][i % self.BLOCK]

    def node(self, j: int) -> np.ndarray:
        """``A(t_j)``."""
        if j in self._nodes:
            return self._nodes[j]
        below = [i for i in self._nodes if i < j]
        i = max(below) if below else 0
        A = self._nodes[i] if below else self.process.A0.copy()
        P = self.process
        decay, scale = math.exp(-P.rate * self.h), P.transition_scale(self.h)
        while i < j:
            A = P.A_bar + decay * (A - P.A_bar) + scale * self._noise(i)
            i += 1
        self._nodes[j] = A
        return A

    def __call__(self, t: float) -> Heads:
        t = float(t)
        if self._last is not None and self._last[0] == t:
            return self._last[1]
        u = max(t, 0.0) / self.h
        j = math.floor(u)
        s = u - j
        A = self.node(j) if s == 0.0 else (1.0 - s) * self.node(j) + s * self.node(j + 1)
        heads = _heads(A, self.process.value)
        self._last = (t, heads)
        return heads

    def next_break(self, t: float) -> float:
        return (math.floor(float(t) / self.h + 1e-9) + 1) * self.h

    def forget_before(self, t: float) -> None:
        keep = math.floor(max(float(t), 0.0) / self.h)
        base = max((i for i in self._nodes if i <= keep), default=None)
        if base is not None:
            for i in [i for i in self._nodes if i < base]:
                del self._nodes[i]

    def get_state(self) -> dict:
        j = min(self._nodes)
        return {"seed": self.seed, "h": self.h, "j": j, "A": self._nodes[j].copy()}

    def set_state(self, state: dict) -> None:
        self.seed, self.h = int(state["seed"]), float(state["h"])
        self._nodes = {int(state["j"]): np.array(state["A"], dtype=np.float64)}
        self._blocks, self._last = {}, None


#: Finite-difference stencils ``(offsets, weights)``: ``dA/dt (t) ~ sum_k w_k A(t + o_k h) / h``, by order and
#: kind. Central: ``(A(t-2h) - 8 A(t-h) + 8 A(t+h) - A(t+2h)) / 12h``, truncation ``h^4/30 |A^(5)|``; forward (one
#: sided, same order, for ``t < 2h`` so that ``A`` is never asked before ``t = 0``): ``(-25 A(t) + 48 A(t+h) - 36
#: A(t+2h) + 16 A(t+3h) - 3 A(t+4h)) / 12h``, truncation ``h^4/5 |A^(5)|``. Order 2 (the stencils' control):
#: ``(A(t+h) - A(t-h)) / 2h`` and ``(-3 A(t) + 4 A(t+h) - A(t+2h)) / 2h``.
_STENCILS: dict[tuple[int, str], tuple[tuple[float, ...], tuple[float, ...]]] = {
    (4, "central"): ((-2.0, -1.0, 1.0, 2.0), (1 / 12, -8 / 12, 8 / 12, -1 / 12)),
    (4, "forward"): ((0.0, 1.0, 2.0, 3.0, 4.0), (-25 / 12, 48 / 12, -36 / 12, 16 / 12, -3 / 12)),
    (2, "central"): ((-1.0, 1.0), (-0.5, 0.5)),
    (2, "forward"): ((0.0, 1.0, 2.0), (-1.5, 2.0, -0.5)),
}

#: The finite-difference step in units of the path's time scale ``tau`` (``|A^(k)| ~ |A| / tau^k``): the central
#: stencil's truncation error ``(h/tau)^4 / 30`` and its rounding error ``1.5 eps tau / h`` (in units of ``|A| /
#: tau``; ``1.5 = (1 + 8 + 8 + 1) / 12``) balance at ``h = (45 eps / 4)^(1/5) tau = 1.2e-3 tau``, where the
#: derivative's relative error is about ``2 eps tau / h = 4e-13``.
FD_STEP = (45.0 * float(np.finfo(np.float64).eps) / 4.0) ** 0.2


def finite_difference_derivative(
    fn: Callable[[float], np.ndarray], t: float, h: float, *, order: int = 4, start: float = 0.0
) -> np.ndarray:
    """``dA/dt`` at ``t`` by a finite difference of ``fn`` with step ``h``, of order ``order`` (4 or 2).

    Central stencil, or the forward one of the same order where the central one would ask ``fn``
    before ``start`` (:data:`_STENCILS`). Right only where ``fn`` is smooth over the stencil's span
    ``[t - 2h, t + 4h]``: across a kink or a jump of ``fn`` the result is wrong (``O(1)``, ``O(jump / h)``).
    """
    if (order, "central") not in _STENCILS:
        raise InputError(f"order must be 2 or 4; got {order}")
    if not h > 0:
        raise InputError(f"the step h must be positive; got {h}")
    offsets, weights = _STENCILS[(order, "central")]
    if t + min(offsets) * h < start:
        offsets, weights = _STENCILS[(order, "forward")]
    total = np.zeros(())
    for o, w in zip(offsets, weights):
        total = total + w * np.asarray(fn(t + o * h), dtype=np.float64)
    return total / h


class FromCallable(WeightProcess):
    """User weights: ``fn(t)`` returns ``A`` ``(H, d, d)``, a pair ``(A, V)`` or a :class:`Heads`.

    ``derivative`` (``dA/dt``, what the EDI recorder integrates with the scheme's own stages, at the
    scheme's order; :mod:`attnflow.analysis.edi`):

    * ``None`` (default): a fourth-order finite difference of ``fn`` (:func:`finite_difference_derivative`,
      step ``h = FD_STEP * time_scale``, about ``1.2e-3 time_scale``; relative error about ``4e-13`` when
      ``A`` changes by ``O(|A|)`` over ``time_scale``, and ``(h / tau)^4 / 30`` for a faster path of time scale
      ``tau``). It costs four calls of ``fn`` per stage, and calls ``fn`` up to ``2h`` past the run's end
      (never before ``t = 0``). **Right only for a smooth ``fn``**: across a kink or a jump the finite difference
      is wrong, and so is the budget; pass ``derivative="increment"`` for such paths.
    * a callable ``t -> dA/dt``: used as given (a wrong derivative is the caller's).
    * ``"increment"``: no derivative; the EDI books each step's exact increment of ``F`` (right for any path,
      jumps included, but a first-order splitting: residual ``O(dt)`` whatever the scheme).

    ``time_scale``: the time over which ``A`` changes by about itself (default 1, the unit of depth
    ``t``; the step scales with it).
    """

    def __init__(
        self,
        fn: Callable[[float], Any],
        derivative: Callable[[float], Any] | str | None = None,
        *,
        time_scale: float = 1.0,
    ):
        if isinstance(derivative, str) and derivative != "increment":
            raise InputError(f"derivative must be a callable t -> dA/dt, None or 'increment'; got {derivative!r}")
        if derivative is not None and not isinstance(derivative, str) and not callable(derivative):
            raise InputError(
                f"derivative must be a callable t -> dA/dt, None or 'increment'; got a {type(derivative).__name__}"
            )
        if not (isinstance(time_scale, (int, float)) and math.isfinite(time_scale) and time_scale > 0):
            raise InputError(f"time_scale must be a positive number; got {time_scale!r}")
        self.fn, self._derivative = fn, derivative
        #: The finite-difference step ``h`` (used when ``derivative`` is ``None``).
        self.fd_step = FD_STEP * float(time_scale)
        h0 = self._call(0.0)
        self.H, self.d = h0.H, h0.d

    def _call(self, t: float) -> Heads:
        r = self.fn(t)
        if isinstance(r, tuple):
            return as_heads(*r).to(dtype=torch.float64)
        return as_heads(r).to(dtype=torch.float64)

    def _A(self, t: float) -> np.ndarray:
        return self._call(t).A.numpy()

    def sampler(self, seed: int | None = None) -> WeightSampler:
        return WeightSampler(self._call)

    def derivative(self, t: float) -> torch.Tensor | None:
        """``dA/dt`` ``(H, d, d)``: given, by finite difference (the default) or ``None`` (``"increment"``)."""
        if self._derivative is None:
            return torch.from_numpy(finite_difference_derivative(self._A, float(t), self.fd_step))
        if isinstance(self._derivative, str):
            return None
        return to_tensor(self._derivative(t), dtype=torch.float64)

    @property
    def derivative_source(self) -> str:
        if self._derivative is None:
            return "finite difference"
        return "none" if isinstance(self._derivative, str) else "given"


class Sampled(WeightProcess):
    """User arrays on a time grid: ``A`` ``(T, H, d, d)`` at ``times`` ``(T,)``, linear in between."""

    def __init__(self, times: Any, A: Any, V: Any = None):
        self.times = np.asarray(times, dtype=np.float64)
        self.A = np.asarray(to_numpy(A), dtype=np.float64)
        self.V = None if V is None else np.asarray(to_numpy(V), dtype=np.float64)
        if self.A.ndim != 4 or self.A.shape[0] != self.times.shape[0]:
            raise InputError(
                f"A must have shape (T, H, d, d) with T = len(times) = {len(self.times)}; got {self.A.shape}"
            )
        if self.V is not None and self.V.shape != self.A.shape:
            raise InputError(f"V must have the shape of A {self.A.shape}; got {self.V.shape}")
        if np.any(np.diff(self.times) <= 0):
            raise InputError("times must be strictly increasing")
        self.H, self.d = self.A.shape[1], self.A.shape[2]

    def _interp(self, M: np.ndarray, t: float) -> np.ndarray:
        k = (
            int(np.clip(np.searchsorted(self.times, t, side="right") - 1, 0, len(self.times) - 2))
            if len(self.times) > 1
            else 0
        )
        if len(self.times) == 1:
            return M[0]
        s = np.clip((t - self.times[k]) / (self.times[k + 1] - self.times[k]), 0.0, 1.0)
        return (1 - s) * M[k] + s * M[k + 1]

    def sampler(self, seed: int | None = None) -> WeightSampler:
        def at(t: float) -> Heads:
            A = torch.from_numpy(self._interp(self.A, t))
            return Heads(K=A, V=None if self.V is None else torch.from_numpy(self._interp(self.V, t)))

        return WeightSampler(at)


def as_process(weights: Any) -> WeightProcess:
    """Accept a process, a :class:`Heads`, an ``(H, d, d)`` array (constant) or a callable."""
    if isinstance(weights, WeightProcess):
        return weights
    if callable(weights) and not isinstance(weights, (np.ndarray, torch.Tensor, Heads)):
        return FromCallable(weights)
    return Constant(weights)
