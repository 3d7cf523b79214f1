"""Attention heads: the matrices ``A_h = Q_h^T K_h`` and ``V_h`` of MODEL.md, and presets.

A :class:`Heads` object is the one representation the kernel consumes. It keeps the factors
``Q, K`` (shape ``(H, k, d)``) so that logits ``(Q_h x_i) . (K_h x_j)`` cost ``O(N^2 k)``; dense
interaction matrices ``A`` (shape ``(H, d, d)``) are stored as ``Q = I, K = A``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ._arrays import ArrayLike, to_tensor


@dataclass(frozen=True)
class Heads:
    """``H`` heads with query/key factors ``Q, K`` of shape ``(H, k, d)`` and values ``V`` ``(H, d, d)``.

    ``V = None`` means ``V_h = A_h = Q_h^T K_h`` (the gradient-flow choice). ``Q = None`` means
    the dense form: ``K`` holds ``A`` itself and the query factor is the identity.
    """

    K: torch.Tensor
    Q: torch.Tensor | None = None
    V: torch.Tensor | None = None

    @classmethod
    def from_factors(cls, Q: ArrayLike, K: ArrayLike, V: ArrayLike | None = None) -> "Heads":
        """Low-rank heads from ``Q, K`` ``(H, k, d)`` and optional ``V`` ``(H, d, d)``."""
        Qt, Kt = to_tensor(Q), to_tensor(K)
        if Qt.ndim == 2:
            Qt, Kt = Qt[None], Kt[None]
        if Qt.ndim != 3 or Qt.shape != Kt.shape:
            raise ValueError(f"Q and K must both have shape (H, k, d); got {tuple(Qt.shape)} and {tuple(Kt.shape)}")
        Vt = _as_stack(V, "V", Kt.shape[0], Kt.shape[2]) if V is not None else None
        return cls(K=Kt, Q=Qt.to(Kt.dtype), V=None if Vt is None else Vt.to(Kt.dtype))

    @classmethod
    def from_matrices(cls, A: ArrayLike, V: ArrayLike | None = None) -> "Heads":
        """Dense heads from ``A`` ``(H, d, d)`` (or ``(d, d)`` for one head) and optional ``V``."""
        At = to_tensor(A)
        if At.ndim == 2:
            At = At[None]
        if At.ndim != 3 or At.shape[1] != At.shape[2]:
            raise ValueError(f"A must have shape (H, d, d); got {tuple(At.shape)}")
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
    def values(self) -> torch.Tensor:
        """Value matrices ``V_h`` (``A_h`` when none were given)."""
        return self.A if self.V is None else self.V

    def to(self, dtype: torch.dtype | None = None, device=None) -> "Heads":
        conv = lambda t: None if t is None else t.to(dtype=dtype or t.dtype, device=device or t.device)  # noqa: E731
        return Heads(K=conv(self.K), Q=conv(self.Q), V=conv(self.V))

    def factors(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Query and key features ``(q, k)`` of shape ``(H, N, r)`` with ``q_i . k_j = x_i^T A_h x_j``."""
        if self.Q is None:
            # Dense A: q_i = x_i, k_j = A_h x_j.  expand() shares memory across heads.
            q = x.unsqueeze(-3).expand(*x.shape[:-2], self.H, *x.shape[-2:])
            return q, x.unsqueeze(-3) @ self.K.transpose(-1, -2)
        xs = x.unsqueeze(-3)
        return xs @ self.Q.transpose(-1, -2), xs @ self.K.transpose(-1, -2)

    def value_features(self, x: torch.Tensor) -> torch.Tensor:
        """``V_h x_j`` for every head and token, shape ``(H, N, d)``."""
        return x.unsqueeze(-3) @ self.values.transpose(-1, -2)

    def check_gradient_flow(self, atol: float = 1e-10) -> None:
        """Raise ``ValueError`` unless every ``A_h`` is symmetric and ``V_h = A_h`` (model ``gf``)."""
        A = self.A
        tol = atol * max(1.0, float(A.abs().max()))
        asym = float((A - A.transpose(1, 2)).abs().amax())
        if asym > tol:
            raise ValueError(
                f"model 'gf' needs symmetric interaction matrices A_h = Q_h^T K_h; the largest |A - A^T| "
                f"entry is {asym:.3g}. Symmetrise them ((A + A^T)/2) or use model='mha'."
            )
        if self.V is not None:
            dv = float((self.V - A).abs().amax())
            if dv > tol:
                raise ValueError(
                    f"model 'gf' needs V_h = A_h; the largest |V - A| entry is {dv:.3g}. "
                    "Pass V=None (meaning V = A) or use model='mha'."
                )


def _as_stack(M: ArrayLike, name: str, H: int, d: int) -> torch.Tensor:
    t = to_tensor(M)
    if t.ndim == 2:
        t = t[None].expand(H, d, d)
    if tuple(t.shape) != (H, d, d):
        raise ValueError(f"{name} must have shape (H, d, d) = ({H}, {d}, {d}); got {tuple(t.shape)}")
    return t


def as_heads(A: ArrayLike | Heads, V: ArrayLike | None = None) -> Heads:
    """Normalise the ``(A, V)`` arguments of the functional API into a :class:`Heads`."""
    if isinstance(A, Heads):
        if V is None:
            return A
        return Heads(K=A.K, Q=A.Q, V=_as_stack(V, "V", A.H, A.d).to(A.K.dtype))
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
    raise ValueError(f"unknown value preset {kind!r}; choose 'A', '-A' or 'identity'")
