"""The problem a solve integrates, checked at the library's entry point.

:class:`Problem` holds what defines the flow ``dx_i/dt = v_t(x_i)``: the initial tokens on the
sphere, the weight process, the model, the token and head masses, the time span, the noise seed,
the kernel options (the one way backend and tolerance reach the kernels of a run), the thread
policy and the cluster threshold of the diagnostics. :meth:`Problem.create` validates every input
with one sentence naming the parameter (:class:`~attnflow.core.errors.InputError`): tensors with
``requires_grad``, on the ``meta`` device, of an integer or complex dtype; no heads; an infinite
``t_end``; ``cluster_eps`` that is not a positive number; tokens off the unit sphere are projected
onto it with one :class:`~attnflow.core.tokens.TokenWarning` (as the token-file loader does).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from attnflow.config import defaults
from attnflow.core.arrays import ArrayLike, to_tensor
from attnflow.core.caller import caller_stacklevel
from attnflow.core.errors import Hint, InputError
from attnflow.core.heads import Heads
from attnflow.core.threads import ThreadChoice, ThreadPolicy
from attnflow.core.tokens import TokenWarning, looks_transposed, transposed_message
from attnflow.dynamics.fields import MODELS, masses
from attnflow.kernels.dispatch import KernelOptions
from attnflow.weights.processes import WeightProcess, as_process

__all__ = ["Problem", "as_dtype", "check_array", "check_cluster_eps", "thread_policy", "thread_choice"]

_DTYPES = {"float32": torch.float32, "float64": torch.float64}


def as_dtype(dtype: Any) -> torch.dtype | None:
    """``dtype`` as a torch floating dtype: ``"float32"``, ``numpy.float32``, ``torch.float32`` (or 64); ``None`` stays."""
    if dtype is None or isinstance(dtype, torch.dtype) and dtype in _DTYPES.values():
        return dtype
    name = dtype if isinstance(dtype, str) else getattr(np.dtype(dtype), "name", None) if _numpy_like(dtype) else None
    if name in _DTYPES:
        return _DTYPES[name]
    raise InputError(
        f"dtype must be float32 or float64 (a name, a numpy or a torch dtype); got {dtype!r}", hint=Hint("dtype")
    )


def _numpy_like(dtype: Any) -> bool:
    try:
        np.dtype(dtype)
    except TypeError:
        return False
    return not isinstance(dtype, str)


def check_array(name: str, value: Any) -> None:
    """Refuse, with one sentence, an array the flow cannot take: a tensor that carries gradients or lives
    on the ``meta`` device, an integer (torch) or complex dtype."""
    if isinstance(value, torch.Tensor):
        if value.requires_grad:
            raise InputError(
                f"{name} requires grad: simulate integrates without autograd; pass {name}.detach()", hint=Hint(name)
            )
        if value.device.type == "meta":
            raise InputError(f"{name} is on the meta device (no data); pass a tensor with values", hint=Hint(name))
        if value.is_complex() or not (value.is_floating_point() or value.numel() == 0):
            raise InputError(f"{name} must be a real floating-point tensor; got dtype {value.dtype}", hint=Hint(name))
    elif isinstance(value, np.ndarray) and np.iscomplexobj(value):
        raise InputError(f"{name} must be real; got dtype {value.dtype}", hint=Hint(name))


def check_cluster_eps(value: Any) -> float:
    """``cluster_eps`` as a float in ``(0, 2]`` (the chordal distance below which tokens share a cluster)."""
    try:
        eps = float(value)
    except (TypeError, ValueError):
        eps = math.nan
    if not (0 < eps <= 2):
        raise InputError(
            f"cluster_eps must be a distance in (0, 2] (tokens closer than it share a cluster); got {value!r}",
            hint=Hint("cluster_eps"),
        )
    return eps


def initial_tokens(x0: ArrayLike, dtype: torch.dtype | None, *, batched: bool = False) -> torch.Tensor:
    """``x0`` checked (shape ``(N, d)``, or ``(B, N, d)`` when ``batched``; finite) and put on the sphere."""
    check_array("x0", x0)
    x = to_tensor(x0, dtype=dtype)
    shape = "(B, N, d) or (N, d)" if batched else "(N, d)"
    if x.ndim not in ((2, 3) if batched else (2,)) or x.shape[-2] < 1 or x.shape[-1] < 2:
        raise InputError(f"x0 must have shape {shape} with N >= 1 and d >= 2; got {tuple(x.shape)}", hint=Hint("x0"))
    if not bool(torch.isfinite(x).all()):
        raise InputError("x0 contains NaN or inf", hint=Hint("x0"))
    norms = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
    if bool((norms == 0).any()):
        raise InputError("x0 has a zero row, which has no direction on the sphere", hint=Hint("x0"))
    tol = 1e-6 if x.dtype == torch.float64 else 1e-4
    dev = float((norms.to(torch.float64) - 1.0).abs().max())
    if dev > tol and looks_transposed(x.detach().cpu().numpy(), tol):  # before any projection (issue 43)
        raise InputError(transposed_message("x0", tuple(x.shape)), hint=Hint("x0"))
    if dev > tol:
        warnings.warn(
            f"x0: tokens projected onto the unit sphere (max | |x| - 1 | was {dev:.3g})",
            TokenWarning,
            stacklevel=caller_stacklevel(),
        )
    return x / norms


def check_model(model: Any) -> str:
    if model not in MODELS:
        raise InputError(f"unknown model {model!r}; choose one of {MODELS}", hint=Hint("model"))
    return str(model)


@dataclass(frozen=True)
class Problem:
    """What one solve integrates (see the module docstring); make it with :meth:`create`.

    ``x0`` ``(N, d)`` on the sphere in the run's dtype; ``a`` ``(N,)`` and ``w`` ``(H,)`` the masses;
    ``seed`` drives stochastic weights; ``threads``: the torch threads of the run (``None``: chosen by
    :class:`~attnflow.core.threads.ThreadPolicy` from the problem size).
    """

    x0: torch.Tensor
    process: WeightProcess
    model: str
    a: torch.Tensor
    w: torch.Tensor
    t0: float
    t_end: float
    seed: int | None
    options: KernelOptions
    cluster_eps: float = defaults.CLUSTER_EPS
    threads: int | None = None

    @classmethod
    def create(
        cls,
        x0: ArrayLike,
        weights: WeightProcess | ArrayLike | Callable | Heads,
        *,
        model: str = defaults.MODEL,
        t_end: float,
        t0: float = 0.0,
        seed: int | None = None,
        token_weights: ArrayLike | None = None,
        head_weights: ArrayLike | None = None,
        dtype: Any = None,
        options: KernelOptions | None = None,
        cluster_eps: float = defaults.CLUSTER_EPS,
        threads: int | None = None,
    ) -> Problem:
        """Validate the inputs (one sentence each) and build the problem."""
        model = check_model(model)
        x = initial_tokens(x0, as_dtype(dtype))
        for name, value in (("token_weights", token_weights), ("head_weights", head_weights), ("weights", weights)):
            check_array(name, value)
        t0, t_end = _time("t0", t0), _time("t_end", t_end)
        if not t_end > t0:
            raise InputError(f"t_end must be larger than t0={t0}; got {t_end}", hint=Hint("t_end"))
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer))):
            raise InputError(f"seed must be a whole number or None; got {seed!r}", hint=Hint("seed"))
        ThreadPolicy(threads)  # checks the count
        process = as_process(weights)
        if process.H < 1:
            raise InputError("the weights have zero heads; give at least one head (H >= 1)", hint=Hint("weights"))
        if process.d != x.shape[1]:
            raise InputError(
                f"tokens have dimension d={x.shape[1]} but the weights act on d={process.d}", hint=Hint("weights")
            )
        a = masses(token_weights, x.shape[0], "token_weights", x)
        w = masses(head_weights, process.H, "head_weights", x)
        return cls(
            x0=x, process=process, model=model, a=a, w=w, t0=t0, t_end=t_end, seed=None if seed is None else int(seed),
            options=KernelOptions() if options is None else options, cluster_eps=check_cluster_eps(cluster_eps),
            threads=threads,
        )  # fmt: skip

    @property
    def pairs(self) -> float:
        """Kernel evaluations of one field pass (``N^2 H``): the work size the thread policy reads."""
        return float(self.x0.shape[0]) ** 2 * self.process.H

    def thread_policy(self) -> ThreadPolicy:
        """The threads of the run: ``threads`` when given, else chosen from :attr:`pairs` (see :func:`thread_policy`)."""
        return thread_policy(self.threads, self.pairs)

    def thread_choice(self) -> ThreadChoice:
        """:meth:`thread_policy`'s count with the sentence saying why (:func:`thread_choice`)."""
        return thread_choice(self.threads, self.pairs)


def thread_choice(threads: int | None, pairs: float) -> ThreadChoice:
    """``threads`` when given; else what :meth:`ThreadPolicy.choose` picks for ``pairs`` (size and
    load average), never more than torch's current setting (a process that asked for fewer threads,
    with ``OMP_NUM_THREADS`` or ``torch.set_num_threads``, keeps them)."""
    choice = ThreadPolicy(threads).choose(pairs)
    cap = torch.get_num_threads()
    if threads is None and choice.threads > cap:
        return replace(choice, threads=cap, reason=f"{choice.reason}, capped at torch's setting of {cap}")
    return choice


def thread_policy(threads: int | None, pairs: float) -> ThreadPolicy:
    """``ThreadPolicy(threads)`` when ``threads`` is given; else the fixed count of :func:`thread_choice`."""
    if threads is not None:
        return ThreadPolicy(threads)
    return ThreadPolicy(thread_choice(None, pairs).threads)


def _time(name: str, value: Any) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        v = math.nan
    if not math.isfinite(v):
        raise InputError(f"{name} must be a finite number; got {value!r}", hint=Hint(name))
    return v
