"""Attention heads: the matrices ``A_h = Q_h^T K_h`` and ``V_h`` of docs/model.md, and presets.

A :class:`Heads` object is the one representation the kernel consumes. It keeps the factors
``Q, K`` (shape ``(H, k, d)``) so that logits ``(Q_h x_i) . (K_h x_j)`` cost ``O(N^2 k)``; dense
interaction matrices ``A`` (shape ``(H, d, d)``) are stored as ``Q = I, K = A``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from attnflow.core.arrays import ArrayLike, to_tensor
from attnflow.core.errors import InputError


@dataclass(frozen=True)
class Heads:
    """``H`` heads with query/key factors ``Q, K`` of shape ``(H, k, d)`` and values ``V`` ``(H, d, d)``.

    ``V = None`` means ``V_h = A_h = Q_h^T K_h`` (the gradient-flow choice). ``Q = None`` means
    the dense form: ``K`` holds ``A`` itself and the query factor is the identity.

    Optional parts of real transformer layers (all default off): feature biases ``bias_q, bias_k``
    ``(H, k)`` (logits ``(Q_h x_i + b_Q) . (K_h x_j + b_K)``), a value bias ``bias_v`` ``(H, d)``
    (values ``V_h x_j + b_V``), a ``causal`` mask (``i`` attends to ``j <= i``) and rotary position
    embeddings ``rope`` (inverse frequencies ``(k/2,)``; token ``i`` sits at position ``i``).
    """

    K: torch.Tensor
    Q: torch.Tensor | None = None
    V: torch.Tensor | None = None
    bias_q: torch.Tensor | None = None
    bias_k: torch.Tensor | None = None
    bias_v: torch.Tensor | None = None
    causal: bool = False
    rope: torch.Tensor | None = None

    @classmethod
    def from_factors(cls, Q: ArrayLike, K: ArrayLike, V: ArrayLike | None = None) -> Heads:
        """Low-rank heads from ``Q, K`` ``(H, k, d)`` and optional ``V`` ``(H, d, d)``."""
        Qt, Kt = to_tensor(Q), to_tensor(K)
        if Qt.ndim == 2:
            Qt, Kt = Qt[None], Kt[None]
        if Qt.ndim != 3 or Qt.shape != Kt.shape:
            raise InputError(f"Q and K must both have shape (H, k, d); got {tuple(Qt.shape)} and {tuple(Kt.shape)}")
        Vt = _as_stack(V, "V", Kt.shape[0], Kt.shape[2]) if V is not None else None
        return cls(K=Kt, Q=Qt.to(Kt.dtype), V=None if Vt is None else Vt.to(Kt.dtype))

    @classmethod
    def from_matrices(cls, A: ArrayLike, V: ArrayLike | None = None) -> Heads:
        """Dense heads from ``A`` ``(H, d, d)`` (or ``(d, d)`` for one head) and optional ``V``."""
        At = to_tensor(A)
        if At.ndim == 2:
            At = At[None]
        if At.ndim != 3 or At.shape[1] != At.shape[2]:
            raise InputError(f"A must have shape (H, d, d); got {tuple(At.shape)}")
        Vt = _as_stack(V, "V", At.shape[0], At.shape[1]).to(At.dtype) if V is not None else None
        return cls(K=At, V=Vt)

    @property
    def H(self) -> int:
        return int(self.K.shape[0])

    @property
    def d(self) -> int:
        return int(self.K.shape[2])

    @property
    def rank(self) -> int:
        return int(self.K.shape[1])

    @property
    def A(self) -> torch.Tensor:
        """Interaction matrices ``A_h = Q_h^T K_h``, shape ``(H, d, d)``."""
        return self.K if self.Q is None else self.Q.transpose(1, 2) @ self.K

    @property
    def queries(self) -> torch.Tensor:
        """Query matrices ``Q_h`` (the identity when none were given, as then ``A_h = K_h``)."""
        if self.Q is not None:
            return self.Q
        eye = torch.eye(self.K.shape[-1], dtype=self.K.dtype, device=self.K.device)
        return eye.expand(self.K.shape[0], -1, -1)

    @property
    def values(self) -> torch.Tensor:
        """Value matrices ``V_h`` (``A_h`` when none were given)."""
        return self.A if self.V is None else self.V

    @property
    def plain(self) -> bool:
        """True when no bias, causal mask or rotary embedding is set (the heads of docs/model.md)."""
        return (
            self.bias_q is None
            and self.bias_k is None
            and self.bias_v is None
            and not self.causal
            and self.rope is None
        )

    def without_values(self) -> Heads:
        """The same heads with the value side dropped (``V = None``, so ``V_h = A_h``; no value bias).

        What the energy ``F``, the mobility ``b`` and the slope ``|dF|`` need: they depend on the
        logits alone. The query/key factors, their biases, the causal mask and the rotary embedding
        are all kept (``Heads(K=h.K, Q=h.Q)`` would silently drop them).
        """
        return replace(self, V=None, bias_v=None)

    def to(self, dtype: torch.dtype | None = None, device: torch.device | str | None = None) -> Heads:
        def conv(t: torch.Tensor) -> torch.Tensor:
            return t.to(dtype=dtype or t.dtype, device=device or t.device)

        opt = lambda t: None if t is None else conv(t)
        return replace(
            self,
            K=conv(self.K),
            Q=opt(self.Q),
            V=opt(self.V),
            bias_q=opt(self.bias_q),
            bias_k=opt(self.bias_k),
            bias_v=opt(self.bias_v),
            rope=None if self.rope is None else self.rope.to(device=device or self.rope.device),
        )

    def factors(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Query and key features ``(q, k)`` of shape ``(H, N, r)`` with ``q_i . k_j = x_i^T A_h x_j``."""
        if self.Q is None:
            # Dense A: q_i = x_i, k_j = A_h x_j.  expand() shares memory across heads.
            q = x.unsqueeze(-3).expand(*x.shape[:-2], self.H, *x.shape[-2:])
            return q, x.unsqueeze(-3) @ self.K.transpose(-1, -2)
        xs = x.unsqueeze(-3)
        return xs @ self.Q.transpose(-1, -2), xs @ self.K.transpose(-1, -2)

    def logit_features(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """``(q, k, c)`` with logits ``q_i . k_j + c_j`` equal to ``(Q_h x_i + b_Q) . (K_h x_j + b_K)``
        (each side rotated by its position when ``rope`` is set); ``c`` ``(H, N)`` or None.

        Without rotation the query bias adds the key term ``c_j = b_Q . k_j`` (passed to the kernel
        as ``key_bias``); the key bias, carried in ``k``, adds ``x_i^T Q_h^T b_K`` to row ``i`` only,
        which cancels in the softmax but not in ``Z_h``, so it is kept exactly.
        """
        q, k = self.factors(x)
        if self.bias_k is not None:
            k = k + self.bias_k.unsqueeze(-2)
        if self.rope is not None:
            if self.bias_q is not None:
                q = q + self.bias_q.unsqueeze(-2)
            return rotary(q, self.rope), rotary(k, self.rope), None
        if self.bias_q is None:
            return q, k, None
        return q, k, (k @ self.bias_q.unsqueeze(-1)).squeeze(-1)

    def value_features(self, x: torch.Tensor) -> torch.Tensor:
        """``V_h x_j (+ b_V)`` for every head and token, shape ``(H, N, d)``."""
        v = x.unsqueeze(-3) @ self.values.transpose(-1, -2)
        return v if self.bias_v is None else v + self.bias_v.unsqueeze(-2)

    def check_gradient_flow(self, atol: float = 1e-10) -> None:
        """Raise ``ValueError`` unless every ``A_h`` is symmetric and ``V_h = A_h`` (model ``gf``)."""
        if not self.plain:
            raise InputError(
                "model 'gf' needs plain heads: these carry biases, a causal mask or rotary embeddings. "
                "Map them to admissible heads first (attnflow.hf.to_gradient_flow) or use model='mha'."
            )
        A = self.A
        tol = atol * max(1.0, float(A.abs().max()))
        asym = float((A - A.transpose(1, 2)).abs().amax())
        if asym > tol:
            raise InputError(
                f"model 'gf' needs symmetric interaction matrices A_h = Q_h^T K_h; the largest |A - A^T| "
                f"entry is {asym:.3g}. Symmetrise them ((A + A^T)/2) or use model='mha'."
            )
        if self.V is not None:
            dv = float((self.V - A).abs().amax())
            if dv > tol:
                raise InputError(
                    f"model 'gf' needs V_h = A_h; the largest |V - A| entry is {dv:.3g}. "
                    "Pass V=None (meaning V = A) or use model='mha'."
                )


def rotary(f: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding of features ``f`` ``(..., N, r)``, token ``i`` at position ``i``:
    ``f cos(i theta) + rot(f) sin(i theta)`` with ``rot([f1, f2]) = [-f2, f1]`` (halves), ``theta = inv_freq``
    repeated twice (the GPT-NeoX / Llama convention)."""
    pos = torch.arange(f.shape[-2], dtype=torch.float64, device=f.device)
    ang = pos[:, None] * inv_freq.to(torch.float64)[None, :]
    ang = torch.cat((ang, ang), dim=-1)
    cos, sin = ang.cos().to(f.dtype), ang.sin().to(f.dtype)
    half = f.shape[-1] // 2
    rot = torch.cat((-f[..., half:], f[..., :half]), dim=-1)
    return f * cos + rot * sin


def _as_stack(M: ArrayLike, name: str, H: int, d: int) -> torch.Tensor:
    t = to_tensor(M)
    if t.ndim == 2:
        t = t[None].expand(H, d, d)
    if tuple(t.shape) != (H, d, d):
        raise InputError(f"{name} must have shape (H, d, d) = ({H}, {d}, {d}); got {tuple(t.shape)}")
    return t


def as_heads(A: ArrayLike | Heads, V: ArrayLike | None = None) -> Heads:
    """Normalise the ``(A, V)`` arguments of the functional API into a :class:`Heads`."""
    if isinstance(A, Heads):
        if V is None:
            return A
        return replace(A, V=_as_stack(V, "V", A.H, A.d).to(A.K.dtype))
    return Heads.from_matrices(A, V)


# ---------------------------------------------------------------------------------------------
# Presets for head matrices (numpy float64, shape (H, d, d)).
# ---------------------------------------------------------------------------------------------


def identity_heads(H: int, d: int, beta: float = 1.0) -> np.ndarray:
    """``A_h = beta I`` for every head: the isotropic (Geshkovski et al.) interaction."""
    return np.broadcast_to(beta * np.eye(d), (H, d, d)).copy()


def gaussian_heads(H: int, d: int, beta: float = 1.0, seed: int | None = None) -> np.ndarray:
    """``A_h = beta G_h / sqrt(d)``, ``G_h`` i.i.d. standard Gaussian (not symmetric: model ``mha``)."""
    rng = np.random.default_rng(seed)
    return beta * rng.standard_normal((H, d, d)) / np.sqrt(d)


def goe_heads(H: int, d: int, beta: float = 1.0, seed: int | None = None) -> np.ndarray:
    """``A_h = beta (G_h + G_h^T) / (2 sqrt(d))``: symmetric GOE matrices (usable with ``gf``)."""
    rng = np.random.default_rng(seed)
    G = rng.standard_normal((H, d, d))
    return beta * (G + G.transpose(0, 2, 1)) / (2.0 * np.sqrt(d))


def value_matrices(A: np.ndarray, kind: str = "A") -> np.ndarray:
    """Value matrices from a preset: ``"A"`` (``V = A``), ``"-A"`` (``V = -A``) or ``"identity"``."""
    if kind == "A":
        return A.copy()
    if kind == "-A":
        return -A
    if kind == "identity":
        return np.broadcast_to(np.eye(A.shape[-1]), A.shape).copy()
    raise InputError(f"unknown value preset {kind!r}; choose 'A', '-A' or 'identity'")
