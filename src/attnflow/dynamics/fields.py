"""The three dynamics of docs/model.md and the gradient-flow quantities, on top of the kernel.

With ``logZ_h(x_i)`` and ``out_h(x_i)`` from :func:`attnflow.kernels.head_stats`:

* ``mha``: ``v(x) = P_x sum_h w_h out_h(x)``;
* ``gf``:  ``v(x) = -b(x) g(x) = P_x sum_h [w_h Z_h(x) / sum_h' w_h' Z_h'(x)] out_h(x)`` (``V = A``);
* ``usa``: ``v(x) = P_x sum_h w_h Z_h(x) out_h(x)``;
* energy ``F(mu) = -1/2 sum_h w_h sum_i a_i Z_h(x_i)``;
* effective mobility ``b(x) = 1 / sum_h w_h Z_h(x)`` (harmonic mean of ``m_h = 1/Z_h``);
* slope ``|dF|(mu) = (sum_i a_i b(x_i) |g(x_i)|^2)^{1/2}``;
* metric speed ``||v||_mu = (sum_i a_i |v(x_i)|^2 / b(x_i))^{1/2}``.

Combining heads through ``logsumexp_h(log w_h + logZ_h)`` keeps ``gf`` finite at any ``beta``;
quantities that really leave float range have ``log_*`` variants and otherwise raise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Literal

import torch

from attnflow.core.arrays import ArrayLike, like, to_tensor
from attnflow.core.errors import FloatRangeError, InputError
from attnflow.core.geometry import project_tangent
from attnflow.core.heads import Heads, as_heads
from attnflow.kernels import fastsum
from attnflow.kernels.dispatch import KernelOptions, fast_plan_for, head_stats, resolve_options
from attnflow.kernels.fastsum import circle

Model = Literal["mha", "gf", "usa"]
MODELS: tuple[str, ...] = ("mha", "gf", "usa")


# ---------------------------------------------------------------------------------------------
# Argument handling shared by every public function.
# ---------------------------------------------------------------------------------------------


def masses(weights: ArrayLike | None, n: int, name: str, like_t: torch.Tensor) -> torch.Tensor:
    """Validated probability vector of length ``n`` (uniform ``1/n`` when ``weights`` is None)."""
    if weights is None:
        return torch.full((n,), 1.0 / n, dtype=like_t.dtype, device=like_t.device)
    w = to_tensor(weights, dtype=like_t.dtype, device=like_t.device)
    if w.shape != (n,):
        raise InputError(f"{name} must have shape ({n},); got {tuple(w.shape)}")
    if not bool(torch.isfinite(w).all()) or bool((w <= 0).any()):
        raise InputError(f"{name} must be finite and positive; smallest entry is {float(w.min()):.3g}")
    total = float(w.sum())
    if abs(total - 1.0) > 1e-6:
        raise InputError(f"{name} must sum to 1; they sum to {total:.6g}. Divide them by their sum.")
    return w


def prepare(
    x: ArrayLike,
    A: ArrayLike | Heads,
    V: ArrayLike | None = None,
    token_weights: ArrayLike | None = None,
    head_weights: ArrayLike | None = None,
    *,
    energy_only: bool = False,
) -> tuple[torch.Tensor, Heads, torch.Tensor, torch.Tensor]:
    """Convert the public arguments into ``(x, heads, a, w)`` torch objects of one dtype.

    ``energy_only`` drops any value matrices: ``F``, ``b`` and ``|dF|`` are defined by ``A`` alone.
    """
    xt = to_tensor(x)
    if xt.ndim != 2:
        raise InputError(f"x must have shape (N, d); got {tuple(xt.shape)}")
    heads = as_heads(A, V)
    if energy_only:
        heads = heads.without_values()
    if heads.d != xt.shape[1]:
        raise InputError(f"tokens have dimension d={xt.shape[1]} but the heads act on d={heads.d}")
    heads = heads.to(dtype=xt.dtype, device=xt.device)
    a = masses(token_weights, xt.shape[0], "token_weights", xt)
    w = masses(head_weights, heads.H, "head_weights", xt)
    return xt, heads, a, w


@dataclass(frozen=True)
class FieldStats:
    """One kernel pass at a state: ``out_h(x_i)`` ``(H, N, d)`` (or None) and ``logZ_h(x_i)`` ``(H, N)``.

    Leading batch dimensions (``(B, H, N, d)``, ``(B, H, N)``; ``log_w`` ``(H,)`` or ``(B, H)``) are
    allowed: every head reduction runs over the head axis ``-2`` of ``logZ``, every token sum over
    the last axis.

    Its methods are the one home of the gradient-flow formulas on top of the kernel: the fields
    (:meth:`velocity`), the energy ``F`` (:meth:`log_abs_energy`, :meth:`energy`), the mobility
    ``b`` (:meth:`log_mobility`, :meth:`mobility`, :meth:`inverse_mobility`), the slope ``|dF|``
    (:meth:`log_slope`), the metric speed (:meth:`speed_sq`) and ``dF/dt`` (:meth:`energy_rate`).
    All are torch operations, differentiable by autograd. Any kernel may produce the object: the
    finite heads (:func:`field_stats`), a batch of systems, or the infinite-head closed forms
    (:meth:`attnflow.dynamics.infinite.GaussianHeads.law_stats`, one "head" with ``log_w = 0``).
    """

    out: torch.Tensor | None
    logZ: torch.Tensor
    log_w: torch.Tensor  # (H,)
    #: ``(model, u)``: the heads' outputs already mixed for ``model`` (``u`` ``(N, d)``, before ``P_x``), as
    #: fast summation's compiled loop makes them (:func:`mixed_stats`); ``out`` is then ``None``, and
    #: :meth:`mixed_output` gives ``u`` for that model only.
    mixed: tuple[str, torch.Tensor] | None = None

    @cached_property  # energy, mobility, speed and slope all read it: one logsumexp per pass
    def log_S(self) -> torch.Tensor:
        """``log S(x_i) = log sum_h w_h Z_h(x_i)`` = ``-log b(x_i)``, shape ``(N,)``."""
        return torch.logsumexp(self.logZ + self.log_w[..., :, None], dim=-2)

    def head_mix(self, model: str) -> torch.Tensor:
        """Head coefficients ``c_h(x_i)`` with ``v = P_x sum_h c_h out_h``, shape ``(H, N)``."""
        if model == "mha":
            return self.log_w.exp()[..., :, None].expand_as(self.logZ)
        if model == "gf":
            return torch.softmax(self.logZ + self.log_w[..., :, None], dim=-2)
        if model == "usa":
            c = torch.exp(self.logZ + self.log_w[..., :, None])
            if not bool(torch.isfinite(c).all()):
                raise FloatRangeError(
                    "the unnormalised ('usa') field overflows: sum_j a_j exp(x^T A x_j) exceeds float range "
                    f"(max log Z = {float(self.logZ.max()):.1f}). Lower beta or use model 'gf' or 'mha'."
                )
            return c
        raise InputError(f"unknown model {model!r}; choose one of {MODELS}")

    def mixed_output(self, model: str) -> torch.Tensor:
        """``sum_h c_h(x_i) out_h(x_i)`` before the tangent projection, shape ``(N, d)``."""
        if self.mixed is not None and self.mixed[0] == model:
            return self.mixed[1]
        if self.out is None:
            if self.mixed is not None:
                raise InputError(f"these statistics hold the field of model {self.mixed[0]!r} only, not of {model!r}")
            raise InputError("these statistics were computed without values (values=False); the field needs them")
        out = self.out
        if model == "mha" and out.dim() == 3 and self.log_w.dim() == 1:
            # Constant head weights: one product w^T out over the heads, each entry read once.
            H, N, d = out.shape
            return (self.log_w.exp() @ out.reshape(H, N * d)).reshape(N, d)
        mix = self.head_mix(model).unsqueeze(-1)
        # Accumulated head by head: a broadcast product would first write an (H, N, d) temporary,
        # which measured 8x slower at N = 1e6 (page faults and memory traffic).
        u = mix[..., 0, :, :] * out[..., 0, :, :]
        for h in range(1, out.shape[-3]):
            u.addcmul_(mix[..., h, :, :], out[..., h, :, :])
        return u

    def velocity(self, x: torch.Tensor, model: str, *, project: bool = True) -> torch.Tensor:
        """The field ``v(x_i) = P_x sum_h c_h(x_i) out_h(x_i)`` of ``model`` (``project=False``: no ``P_x``)."""
        u = self.mixed_output(model)
        return project_tangent(x, u) if project else u

    def log_abs_energy(self, a: torch.Tensor) -> torch.Tensor:
        """``log |F(mu)| = log(1/2 sum_i a_i S(x_i))``: finite at any ``beta`` (``F`` itself is negative)."""
        return torch.logsumexp(self.log_S + torch.log(a), dim=-1) - math.log(2.0)

    def energy(self, a: torch.Tensor) -> torch.Tensor:
        """Energy ``F(mu) = -1/2 sum_h w_h sum_i a_i Z_h(x_i)`` (``-inf`` past the float range)."""
        return -torch.exp(self.log_abs_energy(a))

    def log_mobility(self) -> torch.Tensor:
        """``log b(x_i) = -log sum_h w_h Z_h(x_i)``, shape ``(N,)``."""
        return -self.log_S

    def mobility(self) -> torch.Tensor:
        """Effective mobility ``b(x_i) = 1 / sum_h w_h Z_h(x_i)``, shape ``(N,)``."""
        return torch.exp(self.log_mobility())

    def inverse_mobility(self) -> torch.Tensor:
        """``1 / b(x_i) = S(x_i) = sum_h w_h Z_h(x_i)``, shape ``(N,)``."""
        return torch.exp(self.log_S)

    def speed_sq(self, v: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        """Squared metric speed ``||v||_mu^2 = sum_i a_i |v(x_i)|^2 / b(x_i)`` of a field ``v`` ``(N, d)``."""
        return (a * self.inverse_mobility() * (v * v).sum(-1)).sum(-1)

    def log_slope(self, x: torch.Tensor, a: torch.Tensor, v_gf: torch.Tensor | None = None) -> torch.Tensor:
        """``log |dF|(mu)`` with ``|dF|^2 = sum_i a_i b(x_i) |g(x_i)|^2 = sum_i a_i S(x_i) |v_gf(x_i)|^2``.

        ``v_gf = -b g`` is the ``gf`` field (:meth:`velocity`; pass it when already computed). Finite at
        any ``beta``; ``-inf`` exactly at a critical point.
        """
        v = self.velocity(x, "gf") if v_gf is None else v_gf
        sq = (v * v).sum(-1)
        return 0.5 * torch.logsumexp(torch.log(a) + self.log_S + torch.log(sq), dim=-1)

    def energy_gradient(self, x: torch.Tensor) -> torch.Tensor:
        """``g(x_i) = -S(x_i) sum_h c_h out_h(x_i)`` (``gf`` mix), shape ``(N, d)``: the gradient of ``F`` in
        ``R^d`` per unit mass, ``dF/dx_i = a_i g(x_i)``, for symmetric ``A``. Its tangent part is
        ``-S v_gf`` (``v_gf = -b g``, as in :meth:`log_slope`); the normal part moves ``F`` when a token
        leaves the unit sphere (by rounding, say)."""
        return -self.inverse_mobility().unsqueeze(-1) * self.velocity(x, "gf", project=False)

    def energy_rate(self, x: torch.Tensor, a: torch.Tensor, dA_out: torch.Tensor) -> torch.Tensor:
        """``dF/dt = -1/2 sum_h w_h sum_ij a_i a_j (x_i^T dA_h/dt x_j) exp(x_i^T A_h x_j)`` at frozen tokens.

        ``dA_out`` ``(H, N, d)``: ``sum_j p_hij dA_h/dt x_j``, the kernel's averages of ``dA_h/dt``
        (``extra_values`` of :func:`attnflow.kernels.head_stats`).
        """
        c = self.head_mix("gf")  # w_h Z_h / S
        xAx = (dA_out * x.unsqueeze(-3)).sum(-1)  # x_i . (sum_j p_hij dA_h x_j)
        return -0.5 * (a * self.inverse_mobility() * (c * xAx).sum(-2)).sum(-1)


def field_stats(
    x: torch.Tensor,
    heads: Heads,
    a: torch.Tensor,
    w: torch.Tensor,
    *,
    values: bool = True,
    options: KernelOptions | None = None,
    backend: str | None = None,
) -> FieldStats:
    """Run the kernel once for every head (``values=False`` skips the outputs).

    ``options``: the run's :class:`~attnflow.kernels.dispatch.KernelOptions` (``None``: those of
    :func:`~attnflow.kernels.dispatch.kernel_options`, else the defaults); ``backend`` overrides its
    backend for this call.
    """
    out, logZ = head_stats(x, heads, a, values=values, options=options, backend=backend)
    return FieldStats(out=out, logZ=logZ, log_w=torch.log(w))


def mixed_stats(
    x: torch.Tensor, heads: Heads, a: torch.Tensor, w: torch.Tensor, model: str, *, options: KernelOptions | None = None
) -> FieldStats:
    """The kernel pass of a step of ``model``: :class:`FieldStats` whose :meth:`~FieldStats.mixed_output`
    for ``model`` is ``field_stats(...).mixed_output(model)``, with every statistic of ``log Z``.

    Where fast summation's compiled CPU loop runs (model ``mha``) the heads are mixed inside it as their
    sums are made, so no ``(H, N, d)`` outputs are written (at N = 1e6, 192 MB of fresh pages and a
    pass over them): the result holds ``mixed`` and no ``out``. For model ``gf`` (any device) the heads'
    sums are mixed before the products (:func:`attnflow.kernels.fastsum.fast_gf_field`): the result is
    one "head" ``S = sum_h w_h Z_h`` with ``log_w = 0``, which gives every gradient-flow quantity
    (energy, mobility, speed, slope) but not the heads' own ``Z_h``. Equal to the other path to
    rounding (tested).
    """
    options = resolve_options(options)
    fp, backend = fast_plan_for(x, heads, a, options=options)
    if fp is None:  # the dense kernel, named concretely: the choice is not made a second time
        return field_stats(x, heads, a, w, options=options, backend=backend)
    if circle.applies(x, heads):  # the circle's Fourier series (head_stats takes the same path)
        out, logZ = circle.circle_stats(x, heads, a)
        return FieldStats(out=out, logZ=logZ, log_w=torch.log(w))
    if model == "gf":
        # Linear in the heads' rows: summed before the products (fastsum.fast_gf_field); one "head",
        # S = sum_h w_h Z_h, is all that the energy, mobility, speed and slope read.
        res = fastsum.fast_gf_field(x, heads.A, heads.values, a, w, fast_plan=fp, evaluator=options.evaluator)
        assert res.mixed is not None
        return FieldStats(out=None, logZ=res.logZ, log_w=res.logZ.new_zeros(1), mixed=("gf", res.mixed))
    res = fastsum.fast_stats(x, heads.A, heads.values, a, fast_plan=fp, mix=(model, w), evaluator=options.evaluator)
    mixed = None if res.mixed is None else (model, res.mixed)
    return FieldStats(out=res.out, logZ=res.logZ, log_w=torch.log(w), mixed=mixed)


def mixed_field(
    x: torch.Tensor, heads: Heads, a: torch.Tensor, w: torch.Tensor, model: str, *, options: KernelOptions | None = None
) -> torch.Tensor:
    """``sum_h c_h(x_i) out_h(x_i)``, the field of ``model`` before ``P_x``: ``field_stats(...).mixed_output(model)``,
    from :func:`mixed_stats` (no ``(H, N, d)`` outputs where fast summation mixes the heads)."""
    return mixed_stats(x, heads, a, w, model, options=options).mixed_output(model)


def identity_values(heads: Heads) -> Heads:
    """``heads`` with ``V_h = I``: a kernel pass with them gives the attention means
    ``m_hi = sum_j p_hij x_j``, from which :func:`split_means` makes both outputs below."""
    eye = torch.eye(heads.d, dtype=heads.A.dtype, device=heads.A.device).expand(heads.H, -1, -1)
    return replace(heads, V=eye)


def split_means(means: FieldStats, heads: Heads) -> tuple[FieldStats, FieldStats]:
    """From the pass of :func:`identity_values` (plain heads: values are linear), the statistics with the
    heads' values (``out_h = V_h m_h``) and with ``A`` alone (``out_h = A_h m_h``, what ``F``, ``b`` and
    ``|dF|`` need): two ``(N, d) x (d, d)`` products per head instead of a second kernel pass."""
    assert means.out is not None
    a_out = means.out @ heads.A.transpose(-1, -2)
    v_out = a_out if heads.V is None else means.out @ heads.V.transpose(-1, -2)
    return replace(means, out=v_out), replace(means, out=a_out)


def check_model(model: str, heads: Heads) -> None:
    if model not in MODELS:
        raise InputError(f"unknown model {model!r}; choose one of {MODELS}")
    if model == "gf":
        heads.check_gradient_flow()


def _finite_or_raise(value: torch.Tensor, what: str, hint: str) -> torch.Tensor:
    if not bool(torch.isfinite(value).all()) or bool((value == 0).any()):
        raise FloatRangeError(f"{what} leaves the float range at these weights; use {hint} instead")
    return value


# ---------------------------------------------------------------------------------------------
# Public functional core.
# ---------------------------------------------------------------------------------------------


def velocity(
    x: ArrayLike,
    A: ArrayLike | Heads,
    V: ArrayLike | None = None,
    *,
    model: Model = "mha",
    token_weights: ArrayLike | None = None,
    head_weights: ArrayLike | None = None,
    project: bool = True,
) -> ArrayLike:
    """The field ``v(x_i)`` of model ``mha``, ``gf`` or ``usa`` (docs/model.md, "Three dynamics").

    ``x`` ``(N, d)``; ``A`` ``(H, d, d)`` or a :class:`Heads`; ``V`` ``(H, d, d)``, ``None`` meaning
    ``V = A``. ``project=False`` skips ``P_x`` (then one Euler step of size 1 of ``mha`` is a
    residual attention block). Returns ``(N, d)`` in the type of ``x``.
    """
    xt, heads, a, w = prepare(x, A, V, token_weights, head_weights)
    check_model(model, heads)
    return like(field_stats(xt, heads, a, w).velocity(xt, model, project=project), x)


def log_energy(
    x: ArrayLike, A: ArrayLike | Heads, *, token_weights: ArrayLike | None = None, head_weights: ArrayLike | None = None
) -> tuple[float, float]:
    """``(sign, log|F|)`` of the energy ``F(mu) = -1/2 sum_h w_h sum_{i,j} a_i a_j exp(x_i^T A_h x_j)``.

    Like ``numpy.linalg.slogdet``: finite at any ``beta``. The sign is -1 for positive masses.
    """
    xt, heads, a, w = prepare(x, A, None, token_weights, head_weights, energy_only=True)
    st = field_stats(xt, heads, a, w, values=False)
    return -1.0, float(st.log_abs_energy(a))


def state_energy(
    x: torch.Tensor, heads: Heads, a: torch.Tensor, w: torch.Tensor, *, options: KernelOptions | None = None
) -> float:
    """``F(mu)`` for torch tokens, heads (``A`` only) and masses already prepared: the integrators' form.

    Where fast summation serves the heads, ``F`` is a quadratic form in the key moments
    (:func:`attnflow.kernels.fastsum.fast_head_means`): no pass over the tokens. Its means
    ``T_h = sum_i a_i Z_h(x_i)`` are the statistics of one token of mass 1 with ``Z_h = T_h``, so ``F``
    still comes from :meth:`FieldStats.log_abs_energy`.
    """
    heads = heads.without_values()
    options = resolve_options(options)
    fp, backend = fast_plan_for(x, heads, a, options=options)
    if fp is not None:
        T = fastsum.fast_head_means(x, heads.A, a, fast_plan=fp, evaluator=options.evaluator)
        one = FieldStats(out=None, logZ=torch.log(T)[:, None], log_w=torch.log(w))
        return -math.exp(float(one.log_abs_energy(torch.ones(1, dtype=T.dtype, device=T.device))))
    st = field_stats(x, heads, a, w, values=False, options=options, backend=backend)
    return -math.exp(float(st.log_abs_energy(a)))


def energy(
    x: ArrayLike, A: ArrayLike | Heads, *, token_weights: ArrayLike | None = None, head_weights: ArrayLike | None = None
) -> ArrayLike:
    """Interaction energy ``F(mu) = -1/2 sum_h w_h sum_{i,j} a_i a_j exp(x_i^T A_h x_j)``.

    Raises ``OverflowError`` (pointing to :func:`log_energy`) when ``F`` leaves float range.
    """
    xt, heads, a, w = prepare(x, A, None, token_weights, head_weights, energy_only=True)
    st = field_stats(xt, heads, a, w, values=False)
    F = -_finite_or_raise(torch.exp(st.log_abs_energy(a)), "the energy", "log_energy()")
    return like(F, x)


def log_mobility(
    x: ArrayLike, A: ArrayLike | Heads, *, token_weights: ArrayLike | None = None, head_weights: ArrayLike | None = None
) -> ArrayLike:
    """``log b(x_i) = -log sum_h w_h Z_h(x_i)``, shape ``(N,)``; finite at any ``beta``."""
    xt, heads, a, w = prepare(x, A, None, token_weights, head_weights, energy_only=True)
    return like(field_stats(xt, heads, a, w, values=False).log_mobility(), x)


def mobility(
    x: ArrayLike, A: ArrayLike | Heads, *, token_weights: ArrayLike | None = None, head_weights: ArrayLike | None = None
) -> ArrayLike:
    """Effective mobility ``b(x_i) = (sum_h w_h / m_h(x_i))^{-1} = 1 / sum_h w_h Z_h(x_i)``, shape ``(N,)``.

    The ``w``-weighted harmonic mean of the per-head mobilities ``m_h = 1/Z_h``.
    """
    xt, heads, a, w = prepare(x, A, None, token_weights, head_weights, energy_only=True)
    b = field_stats(xt, heads, a, w, values=False).mobility()
    return like(_finite_or_raise(b, "the mobility", "log_mobility()"), x)


def log_slope(
    x: ArrayLike, A: ArrayLike | Heads, *, token_weights: ArrayLike | None = None, head_weights: ArrayLike | None = None
) -> float:
    """``log |dF|(mu)``; finite at any ``beta`` (``-inf`` exactly at a critical point)."""
    xt, heads, a, w = prepare(x, A, None, token_weights, head_weights, energy_only=True)
    return float(field_stats(xt, heads, a, w).log_slope(xt, a))


def slope(
    x: ArrayLike, A: ArrayLike | Heads, *, token_weights: ArrayLike | None = None, head_weights: ArrayLike | None = None
) -> ArrayLike:
    """Metric slope ``|dF|(mu) = (sum_i a_i b(x_i) |g(x_i)|^2)^{1/2}`` with
    ``g(x) = -P_x sum_h w_h sum_j a_j exp(x^T A_h x_j) A_h x_j`` (``A_h`` symmetric)."""
    xt, heads, a, w = prepare(x, A, None, token_weights, head_weights, energy_only=True)
    heads.check_gradient_flow()
    s = torch.exp(field_stats(xt, heads, a, w).log_slope(xt, a))
    if not bool(torch.isfinite(s)):
        raise FloatRangeError("the slope leaves the float range at these weights; use log_slope() instead")
    return like(s, x)


def metric_speed(
    x: ArrayLike,
    v: ArrayLike,
    A: ArrayLike | Heads,
    *,
    token_weights: ArrayLike | None = None,
    head_weights: ArrayLike | None = None,
) -> ArrayLike:
    """Metric speed ``||v||_mu = (sum_i a_i |v(x_i)|^2 / b(x_i))^{1/2}`` of a field ``v`` at ``mu``."""
    xt, heads, a, w = prepare(x, A, None, token_weights, head_weights, energy_only=True)
    vt = to_tensor(v, dtype=xt.dtype)
    st = field_stats(xt, heads, a, w, values=False)
    return like(torch.sqrt(st.speed_sq(vt, a)), x)


def bulk_field_stats(
    X: torch.Tensor, A: torch.Tensor, V: torch.Tensor | None, a: torch.Tensor, w: torch.Tensor, model: str
) -> tuple[list[float], list[float], list[float], list[float], list[float]]:
    """``log|F|``, ``min/max log b``, ``||v||^2_mu``, ``log|dF|`` of each state through batched
    :class:`FieldStats` (one dense pass gives the means ``m_hi``); ``X`` ``(S, N, d)`` the saved states,
    ``A``/``V`` ``(S, H, d, d)``. Here, beside the field, so the kernel is written once (the bulk
    diagnostics of saved states call it)."""
    keys = torch.einsum("snd,shed->shne", X, A)  # A_h x_j, (S, H, N, d)
    scores = X.unsqueeze(1) @ keys.transpose(-1, -2) + torch.log(a)  # (S, H, N, N)
    logZ = torch.logsumexp(scores, dim=-1)
    m = torch.exp(scores - logZ.unsqueeze(-1)) @ X.unsqueeze(1)  # (S, H, N, d)
    out_A = m @ A.transpose(-1, -2)
    out_V = out_A if V is None else m @ V.transpose(-1, -2)
    log_w = torch.log(w)
    st = FieldStats(out=out_A, logZ=logZ, log_w=log_w)
    v = FieldStats(out=out_V, logZ=logZ, log_w=log_w).velocity(X, model)
    log_b = st.log_mobility()
    return (
        st.log_abs_energy(a).tolist(), log_b.amin(-1).tolist(), log_b.amax(-1).tolist(),
        st.speed_sq(v, a).tolist(), st.log_slope(X, a).tolist(),
    )  # fmt: skip
