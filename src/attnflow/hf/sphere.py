"""From a checkpoint's heads to flows on the sphere: fold the layer norms in (:func:`on_sphere`) and
project onto the gradient-flow class (:func:`to_gradient_flow`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch

from attnflow.core.errors import InputError
from attnflow.core.heads import Heads
from attnflow.hf.importer import HFLayers, Norm
from attnflow.weights.processes import Layers


def norm_map(norm: Norm, d: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(M, beta)`` with ``norm(z) = M x + beta`` for the sphere point ``x = P z / |P z|`` (``eps -> 0``):
    ``M = sqrt(d) diag(gamma) P``, ``P`` the centring ``I - 1 1^T / d`` (LayerNorm) or ``I`` (RMSNorm)."""
    P = torch.eye(d, dtype=torch.float64)
    if norm.kind == "layer":
        P = P - 1.0 / d
    return math.sqrt(d) * norm.gamma[:, None] * P, norm.beta


def pull_back(norm: Norm, d: int) -> torch.Tensor:
    """``D = diag(1 / (sqrt(d) gamma))``: a change ``dy`` of the norm's output ``y = sqrt(d) gamma * x + beta``
    is the change ``D dy`` of its sphere point ``x`` (post-norm models, where attention adds to ``y``)."""
    if bool((norm.gamma == 0).any()):
        raise InputError(
            "a LayerNorm gain is exactly zero: the post-norm pull-back D = diag(1/(sqrt(d) gamma)) is undefined"
        )
    return torch.diag(1.0 / (math.sqrt(d) * norm.gamma))


def fold_norm(heads: Heads, norm: Norm, radius: float = 1.0, *, post_norm: bool = False) -> Heads:
    """Heads acting on sphere points ``x`` as ``heads`` act on ``y = norm(z)``.

    With ``y = M x + beta``: ``Q' = Q M``, ``b_Q' = b_Q + Q beta`` (same for ``K``) and

    * pre-norm (GPT-2, Llama; attention adds to the norm's input ``h``, ``|P h| ~ r``):
      ``V' = V M / r``, ``b_V' = (b_V + V beta) / r``;
    * post-norm (BERT; attention adds to the norm's *output* ``y``): ``V' = D V M``,
      ``b_V' = D (b_V + V beta)`` with ``D`` = :func:`pull_back`, so that ``y + attn(y)`` is exactly
      ``sqrt(d) gamma * (x + u) + beta`` with ``u`` the field (``radius`` is not used).
    """
    h = heads.to(dtype=torch.float64)
    M, beta = norm_map(norm, h.d)

    def shifted(F: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor | None:
        if beta is None:
            return b
        shift = F @ beta
        return shift if b is None else b + shift

    Q = h.Q if h.Q is not None else torch.eye(h.d, dtype=torch.float64).expand(h.H, h.d, h.d)
    V = h.values
    out = pull_back(norm, h.d) if post_norm else torch.eye(h.d, dtype=torch.float64) / radius
    bV = shifted(V, h.bias_v)
    return replace(
        h,
        Q=Q @ M,
        K=h.K @ M,
        V=out @ V @ M,
        bias_q=shifted(Q, h.bias_q),
        bias_k=shifted(h.K, h.bias_k),
        bias_v=None if bV is None else bV @ out.T,
    )


def on_sphere(layers: HFLayers, radius: float | Sequence[float] | np.ndarray = 1.0) -> Layers:
    """The imported layers as a flow of sphere points: layer ``l`` reads ``y = norm_l(x)`` (its own
    norm folded into ``Q, K, V`` by :func:`fold_norm`), one unit of time per layer.

    Pre-norm models: ``radius`` (one number or one per layer) divides the values; with the real
    residual stream's size ``r_l = |P h|`` there, one Euler step of size 1 moves ``x`` as the
    attention block moves ``h / r_l``. Post-norm models (``layers.meta.pre_norm`` false): the values
    are pulled back through the norm (exact for every token; ``radius`` is not used).
    """
    L = layers.L
    r = np.broadcast_to(np.asarray(radius, dtype=np.float64), (L,))
    if not np.all(r > 0):
        raise InputError(f"radius must be positive; got {r.tolist()}")
    post = not layers.meta.pre_norm
    return Layers(
        [fold_norm(layers.layers[l], layers.norms[l], float(r[l]), post_norm=post) for l in range(L)],
        t_end=float(L),
    )


@dataclass(frozen=True)
class GradientFlowProjection:
    """The nearest ``gf``-admissible heads and how far each layer was from them.

    ``layers``: the projected process (``A_h`` symmetric, ``V_h = A_h``); per layer ``l``:
    ``distance[l] = (sum_h |A_h - S_h|^2 + |V_h - S_h|^2)^{1/2} / (sum_h |A_h|^2 + |V_h|^2)^{1/2}``
    (Frobenius norms; 0 means already a gradient flow, 1 means nothing of it is),
    ``asymmetry[l] = |A - sym A| / |A|`` and ``value_gap[l] = |V - A| / (|V| + |A|)``;
    ``dropped``: the parts of the heads a gradient flow cannot have (biases, causal mask, rotary).
    """

    layers: Layers
    distance: np.ndarray
    asymmetry: np.ndarray
    value_gap: np.ndarray
    dropped: tuple[str, ...]


def nearest_gradient_flow_heads(heads: Heads) -> tuple[Heads, float, float, float]:
    """``S_h = sym((A_h + V_h) / 2)``, the minimiser of ``|A_h - S|^2 + |V_h - S|^2`` over symmetric
    ``S``; returns the heads ``(S, V = S)`` and the three relative distances of the layer."""
    A, V = heads.A.to(torch.float64), heads.values.to(torch.float64)
    M = 0.5 * (A + V)
    S = 0.5 * (M + M.transpose(1, 2))
    fro = lambda t: float(torch.linalg.vector_norm(t))
    total = math.hypot(fro(A), fro(V))
    dist = math.hypot(fro(A - S), fro(V - S)) / total if total > 0 else 0.0
    asym = fro(A - 0.5 * (A + A.transpose(1, 2))) / fro(A) if fro(A) > 0 else 0.0
    gap = fro(V - A) / (fro(V) + fro(A)) if fro(V) + fro(A) > 0 else 0.0
    return Heads(K=S), dist, asym, gap


def to_gradient_flow(layers: Layers) -> GradientFlowProjection:
    """Map every head to the nearest ``gf``-admissible head (symmetric ``A``, ``V = A``) and report
    how far each layer was; see :class:`GradientFlowProjection`."""
    out, dist, asym, gap = [], [], [], []
    dropped: set[str] = set()
    for h in layers.layers:
        dropped |= {
            n
            for n, on in [
                ("query/key biases", h.bias_q is not None or h.bias_k is not None),
                ("value bias", h.bias_v is not None),
                ("causal mask", h.causal),
                ("rotary embeddings", h.rope is not None),
            ]
            if on
        }
        S, d_, a_, g_ = nearest_gradient_flow_heads(h)
        out.append(S)
        dist.append(d_)
        asym.append(a_)
        gap.append(g_)
    return GradientFlowProjection(
        layers=Layers(out, t_end=layers.t_end),
        distance=np.array(dist),
        asymmetry=np.array(asym),
        value_gap=np.array(gap),
        dropped=tuple(sorted(dropped)),
    )


def value_factors(layers: HFLayers, radius: float | Sequence[float] = 1.0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer ``(L'_h, R'_h)`` with ``L'_h R'_h`` the folded value ``V'_h`` of :func:`on_sphere`
    (``(H, d, k)`` and ``(H, k, d)``): the rank-``k`` form in which a run folder stores the values."""
    if layers.value_factors is None:
        raise InputError("these layers were built without their value factors; import them with extract()")
    L = layers.L
    r = np.broadcast_to(np.asarray(radius, dtype=np.float64), (L,))
    out = []
    for l, (Lf, Rf) in enumerate(layers.value_factors):
        d = Lf.shape[1]
        M, _ = norm_map(layers.norms[l], d)
        left = pull_back(layers.norms[l], d) if not layers.meta.pre_norm else torch.eye(d, dtype=torch.float64) / r[l]
        out.append((left @ Lf.to(torch.float64), Rf.to(torch.float64) @ M))
    return out
