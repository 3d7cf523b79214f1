"""Permutation-invariant weight paths across depth: heads matched between layers, then the paper's
weight models fitted to the matched path.

Any permutation of the heads within a layer is the same network (the flow sums over heads with
equal weights), so comparing head ``h`` of layer ``l`` with head ``h`` of layer ``l + 1`` measures
the arbitrary labels as much as the weights. :func:`match_heads` first relabels the heads of every
layer to follow the previous layer's (Hungarian assignment, :func:`scipy.optimize.linear_sum_assignment`)
on the **head distance**

    ``dist(h, h')^2 = |A_h / |A_h|_F - A'_h' / |A'_h'|_F|_F^2 + |V_h / |V_h|_F - V'_h' / |V'_h'|_F|_F^2``

(``A_h = Q_h^T K_h``, ``V_h`` the value matrix: the scale-free shapes of what a head attends to and
what it writes; ``0 <= dist^2 <= 8``). Layer 0 keeps its labels; layer ``l + 1`` is matched to the
already relabelled layer ``l``.

:func:`fit_weight_models` fits, on the matched path ``theta_{l,h} = (A_{l,h}, V_{l,h})`` (each head's
matrices divided by their mean Frobenius norm over depth, so the fit is scale-free), the two weight
models of the paper (docs/model.md, "Weight processes"):

* OU, ``d theta = -lambda (theta - theta_bar) dt + sigma dW`` with one unit of time per layer: the
  pooled lag-one autocorrelation ``rho`` of the entries about their depth mean gives
  ``lambda = -log rho`` and the stationary variance ``s^2`` gives ``sigma = sqrt(2 lambda s^2)``
  (in units of the head's Frobenius norm per unit depth); ``r2_ou`` is the one-step prediction's
  share of explained variance;
* oscillating, ``theta_l = theta_bar + C sin(omega l + phi)`` with one ``omega`` for all entries
  (grid over ``(0, pi]``, least squares for ``theta_bar, C, phi`` per entry): ``omega`` and ``r2_osc``;
* the trend of the jumps ``|theta_{l+1} - theta_l|`` with depth (``jump_slope``, least-squares slope
  of ``log jump`` against ``l``): integrable weights (OU) have jumps that settle, oscillating ones
  keep jumping.

Every statistic is a function of the per-head Gram matrices ``G_h[l, m] = <theta_{l,h}, theta_{m,h}>``,
so the percentile CIs resample the matched heads (``n_boot`` times) at the cost of ``L x L`` sums;
the control is the same fit on shuffled stacks (the layers in random orders, matched again).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment

from attnflow.core.heads import Heads

#: Frequencies tried by the oscillating fit (radians per layer).
OMEGAS = np.linspace(np.pi / 64, np.pi, 64)
_PROJ: dict[int, np.ndarray] = {}


def _residual_projections(L: int) -> np.ndarray:
    """``(len(OMEGAS), L, L)``: ``I - P`` with ``P`` the projection onto ``1, sin(omega l), cos(omega l)``."""
    if L not in _PROJ:
        t = np.arange(L, dtype=np.float64)
        out = []
        for w in OMEGAS:
            B = np.stack([np.ones(L), np.sin(w * t), np.cos(w * t)], 1)
            out.append(np.eye(L) - B @ np.linalg.pinv(B))
        _PROJ[L] = np.array(out)
    return _PROJ[L]


def _unit(M: torch.Tensor) -> torch.Tensor:
    """Each head's matrix divided by its Frobenius norm (a zero matrix stays zero), flattened ``(H, -1)``."""
    flat = M.reshape(M.shape[0], -1).to(torch.float64)
    n = torch.linalg.vector_norm(flat, dim=1, keepdim=True)
    return flat / torch.where(n > 0, n, torch.ones_like(n))


def shapes(h: Heads) -> Heads:
    """Dense heads holding only ``A_h`` and ``V_h`` (what :func:`head_distance` and :func:`gram` read),
    so that repeated matchings do not form ``Q_h^T K_h`` again."""
    return Heads(K=h.A.to(torch.float64), V=h.values.to(torch.float64))


def head_distance(a: Heads, b: Heads) -> np.ndarray:
    """``(H_a, H_b)`` matrix of the head distance of the module docstring between the heads of ``a`` and ``b``."""
    fa = torch.cat([_unit(a.A), _unit(a.values)], 1)
    fb = torch.cat([_unit(b.A), _unit(b.values)], 1)
    sq = (fa * fa).sum(1)[:, None] + (fb * fb).sum(1)[None, :] - 2.0 * fa @ fb.T
    return np.sqrt(np.clip(sq.numpy(), 0.0, None))


def permute_heads(h: Heads, order: np.ndarray | list[int]) -> Heads:
    """The same layer with its heads relabelled: new head ``i`` is old head ``order[i]`` (biases and all)."""
    idx = torch.as_tensor(np.asarray(order, dtype=np.int64))
    pick = lambda t: None if t is None else t[idx]
    return replace(
        h, K=h.K[idx], Q=pick(h.Q), V=pick(h.V), bias_q=pick(h.bias_q), bias_k=pick(h.bias_k), bias_v=pick(h.bias_v)
    )


def match_heads(layers: list[Heads]) -> tuple[list[Heads], list[np.ndarray]]:
    """``(matched, orders)``: every layer relabelled to follow the previous one (Hungarian assignment
    on :func:`head_distance`), and the order applied to each (``orders[0]`` is the identity)."""
    out = [layers[0]]
    orders = [np.arange(layers[0].H)]
    for h in layers[1:]:
        _, col = linear_sum_assignment(head_distance(out[-1], h))
        orders.append(np.asarray(col))
        out.append(permute_heads(h, col))
    return out, orders


def path_length(layers: list[Heads]) -> float:
    """Sum over layer boundaries of the mean head distance between head ``h`` of layer ``l`` and head
    ``h`` of layer ``l + 1`` (labels as given: match first for a permutation-invariant length)."""
    return float(sum(np.mean(np.diag(head_distance(a, b))) for a, b in zip(layers[:-1], layers[1:])))


def gram(layers: list[Heads]) -> np.ndarray:
    """``(H, L, L)`` Gram matrices ``G_h[l, m] = <theta_{l,h}, theta_{m,h}>`` of the matched path, each
    head's ``A`` and ``V`` divided by their mean Frobenius norm over depth."""
    out = []
    for get in (lambda h: h.A, lambda h: h.values):
        M = torch.stack([get(h).to(torch.float64).reshape(h.H, -1) for h in layers], 1)  # (H, L, P)
        scale = torch.linalg.vector_norm(M, dim=2).mean(1).clamp_min(1e-300)[:, None, None]
        M = M / scale
        out.append((M @ M.transpose(1, 2)).numpy())
    return out[0] + out[1]


#: Statistics of :func:`fit_gram` (the names of :class:`WeightFit`'s entries).
FIT_STATS = ("rho", "rate", "sigma", "r2_ou", "omega", "r2_osc", "jump_slope", "path")


def fit_gram(G: np.ndarray) -> dict[str, float]:
    """The weight-model statistics of :data:`FIT_STATS` from the summed Gram matrix ``G`` ``(L, L)``."""
    L = G.shape[0]
    # Centre about the depth mean: C = J G J with J = I - 11^T / L.
    J = np.eye(L) - 1.0 / L
    C = J @ G @ J
    num = sum(C[l + 1, l] for l in range(L - 1))
    den = sum(C[l, l] for l in range(L - 1))
    rho = float(num / den) if den > 0 else float("nan")
    rate = float(-np.log(rho)) if rho > 0 else float("inf")
    s2 = float(np.trace(C) / L)
    sigma = float(np.sqrt(2.0 * rate * s2)) if np.isfinite(rate) else float("inf")
    # One-step prediction c_{l+1} ~ rho c_l: residual sum over l.
    res = sum(C[l + 1, l + 1] - 2 * rho * C[l + 1, l] + rho**2 * C[l, l] for l in range(L - 1))
    tot = sum(C[l + 1, l + 1] for l in range(L - 1))
    r2_ou = float(1.0 - res / tot) if tot > 0 else float("nan")
    total = float(np.trace(C))
    res_w = np.einsum("wlm,ml->w", _residual_projections(L), G)  # trace((I - P_w) G) per frequency
    k = int(np.argmin(res_w))
    best = (float(res_w[k]), float(OMEGAS[k]))
    r2_osc = float(1.0 - best[0] / total) if total > 0 else float("nan")
    jumps = np.array([np.sqrt(max(G[l, l] + G[l + 1, l + 1] - 2 * G[l, l + 1], 0.0)) for l in range(L - 1)])
    slope = float(np.polyfit(np.arange(L - 1), np.log(np.maximum(jumps, 1e-300)), 1)[0]) if L > 2 else float("nan")
    return {
        "rho": rho,
        "rate": rate,
        "sigma": sigma,
        "r2_ou": r2_ou,
        "omega": best[1],
        "r2_osc": r2_osc,
        "jump_slope": slope,
        "path": float(jumps.sum()),
    }


@dataclass(frozen=True)
class WeightFit:
    """The fit on the matched real path (``value``), its percentile 95% CI over resampled heads
    (``lo``, ``hi``) and the same statistic on shuffled, re-matched stacks (``control``: one value per
    order; its 2.5% and 97.5% quantiles are the control band)."""

    value: dict[str, float]
    lo: dict[str, float]
    hi: dict[str, float]
    control: dict[str, list[float]]
    n_boot: int
    n_orders: int

    def control_band(self, name: str) -> tuple[float, float]:
        v = np.asarray(self.control[name], dtype=np.float64)
        v = v[np.isfinite(v)]
        if len(v) == 0:
            return float("nan"), float("nan")
        lo, hi = np.quantile(v, [0.025, 0.975])
        return float(lo), float(hi)

    @property
    def regime(self) -> str:
        """Where the matched path sits in the paper's dichotomy, in words (see the module docstring).

        A trend counts only when the slope's CI over heads excludes 0 **and** clears the band of the
        same slope on shuffled, re-matched stacks (the control): a trend a random order of the same
        layers shows as well is not evidence about depth."""
        lo, hi = self.lo["jump_slope"], self.hi["jump_slope"]
        c_lo, c_hi = self.control_band("jump_slope")
        band = f"shuffled stacks' band [{c_lo:+.3g}, {c_hi:+.3g}]"
        if hi < 0:
            if hi < c_lo:
                return f"integrable-like: the matched jumps shrink with depth (slope CI below 0 and below the {band})"
            return f"undecided: the matched jumps shrink with depth (slope CI below 0), but not beyond the {band}"
        if lo > 0:
            if lo > c_hi:
                return (
                    "non-integrable-like: the matched jumps do not settle, they grow with depth (slope CI above 0 "
                    f"and above the {band})"
                )
            return f"undecided: the matched jumps grow with depth (slope CI above 0), but not beyond the {band}"
        return "undecided: the matched jumps neither shrink nor grow with depth (slope CI contains 0)"

    def as_dict(self) -> dict[str, Any]:
        return {
            "value": self.value,
            "lo": self.lo,
            "hi": self.hi,
            "control": {k: self.control_band(k) for k in self.control},
            "n_boot": self.n_boot,
            "n_orders": self.n_orders,
            "regime": self.regime,
        }


class CrossGram:
    """Inner products of every head of every layer with every other (``A`` and ``V`` separately,
    ``(L H, L H)`` each), formed once: matching any order of the layers, its matched path's Gram
    matrices and its path lengths are then index look-ups (the same numbers as :func:`match_heads`,
    :func:`gram` and :func:`~attnflow.hf.measures.relative_jumps` on the re-ordered heads)."""

    def __init__(self, layers: list[Heads]):
        self.L, self.H = len(layers), layers[0].H
        FA = torch.cat([h.A.to(torch.float64).reshape(h.H, -1) for h in layers])
        FV = torch.cat([h.values.to(torch.float64).reshape(h.H, -1) for h in layers])
        self.GA, self.GV = (FA @ FA.T).numpy(), (FV @ FV.T).numpy()
        nA, nV = np.sqrt(np.diag(self.GA)), np.sqrt(np.diag(self.GV))
        cA = self.GA / np.outer(np.where(nA > 0, nA, 1), np.where(nA > 0, nA, 1))
        cV = self.GV / np.outer(np.where(nV > 0, nV, 1), np.where(nV > 0, nV, 1))
        unitA, unitV = (nA > 0).astype(float), (nV > 0).astype(float)
        sq = (
            unitA[:, None] + unitA[None, :] - 2 * cA + unitV[:, None] + unitV[None, :] - 2 * cV
        )  # |a - b|^2 of unit vectors (zero matrices stay zero)
        self.D = np.sqrt(np.clip(sq, 0.0, None))

    def match(self, order: list[int] | np.ndarray) -> np.ndarray:
        """``(L, H)`` global head indices (``layer * H + head``) of the layers in ``order``, matched."""
        H = self.H
        rows = [order[0] * H + np.arange(H)]
        for q in order[1:]:
            cand = q * H + np.arange(H)
            _, col = linear_sum_assignment(self.D[np.ix_(rows[-1], cand)])
            rows.append(cand[col])
        return np.array(rows)

    def gram(self, idx: np.ndarray) -> np.ndarray:
        """:func:`gram` of the matched path ``idx`` ``(L, H)``."""
        out = np.zeros((self.H, len(idx), len(idx)))
        for G in (self.GA, self.GV):
            for h in range(self.H):
                sub = G[np.ix_(idx[:, h], idx[:, h])]
                s = np.sqrt(np.diag(sub)).mean()
                out[h] += sub / max(s * s, 1e-300)
        return out

    def jumps(self, idx: np.ndarray, which: str = "A") -> np.ndarray:
        """:func:`~attnflow.hf.measures.relative_jumps` of ``A`` (or ``V``) along the matched path ``idx``."""
        G = self.GA if which == "A" else self.GV
        H = self.H
        norm = lambda a: np.sqrt(max(float(np.mean(G[a, a])), 0.0))
        out = []
        for a, b in zip(idx[:-1], idx[1:]):
            diff = np.sqrt(max(float(np.mean(G[b, b] + G[a, a] - 2 * G[a, b])), 0.0))
            scale = 0.5 * (norm(a) + norm(b))
            out.append(diff / scale if scale > 0 else 0.0)
        del H
        return np.array(out)


def fit_weight_models(layers: list[Heads], *, n_boot: int = 1000, n_orders: int = 100, seed: int = 0) -> WeightFit:
    """Match the heads of ``layers``, fit the weight models (:func:`fit_gram`) with a bootstrap over
    heads, and the same fit on ``n_orders`` shuffled, re-matched stacks (the control)."""
    rng = np.random.default_rng(seed)
    cg = CrossGram(layers)
    L = len(layers)
    G = cg.gram(cg.match(np.arange(L)))
    value = fit_gram(G.sum(0))
    H = G.shape[0]
    boots = [fit_gram(G[rng.integers(0, H, H)].sum(0)) for _ in range(int(n_boot))]
    lo, hi = {}, {}
    for k in FIT_STATS:
        v = np.array([b[k] for b in boots])
        v = v[np.isfinite(v)]
        lo[k], hi[k] = (float(np.quantile(v, 0.025)), float(np.quantile(v, 0.975))) if len(v) else (np.nan, np.nan)
    control: dict[str, list[float]] = {k: [] for k in FIT_STATS}
    for _ in range(int(n_orders)):
        p = rng.permutation(L)
        while L > 1 and np.array_equal(p, np.arange(L)):
            p = rng.permutation(L)
        fit = fit_gram(cg.gram(cg.match(p)).sum(0))
        for k in FIT_STATS:
            control[k].append(fit[k])
    return WeightFit(value, lo, hi, control, int(n_boot), int(n_orders))


def dense(h: Heads) -> Heads:
    """The same heads in dense form (``Q = None``, ``K = A_h``): the query bias becomes the key-side
    vector ``Q_h^+ b_Q`` (the same key term ``b_Q . K_h x_j`` in the logits) and the key bias, which
    adds a constant to each query's row, is dropped (the softmax, and so the ``mha`` field, ignore it)."""
    if h.rope is not None:
        raise ValueError("rotary heads have no dense form with the same logits")
    h = h.to(dtype=torch.float64)
    bq = None
    if h.bias_q is not None and h.Q is not None:
        bq = (torch.linalg.pinv(h.Q) @ h.bias_q.unsqueeze(-1)).squeeze(-1)
    elif h.bias_q is not None:
        bq = h.bias_q
    return Heads(K=h.A, V=h.values, bias_q=bq, bias_v=h.bias_v, causal=h.causal)


def smooth_path(layers: list[Heads], degree: int = 2) -> list[Heads]:
    """A structure-preserving smooth weight path: the heads matched across depth (:func:`match_heads`),
    in dense form (:func:`dense`), every entry of ``A_h``, ``V_h`` and the biases replaced by its
    least-squares polynomial of ``degree`` in the depth ``l`` (``degree >= L - 1`` interpolates: the
    real heads back). The head structure of each depth is kept; only the jumps between layers go."""
    matched = [dense(h) for h in match_heads(layers)[0]]
    L = len(matched)
    t = np.arange(L, dtype=np.float64)
    B = np.vander(t, min(int(degree), L - 1) + 1)
    proj = torch.from_numpy(B @ np.linalg.pinv(B))  # (L, L) projection onto the polynomials

    def fit(get) -> list[torch.Tensor | None]:
        vals = [get(h) for h in matched]
        if vals[0] is None:
            return [None] * L
        S = torch.stack(vals)
        return list(torch.einsum("lm,m...->l...", proj, S).unbind(0))

    A, V = fit(lambda h: h.K), fit(lambda h: h.V)
    bq, bv = fit(lambda h: h.bias_q), fit(lambda h: h.bias_v)
    return [
        Heads(K=A[l], V=V[l], bias_q=bq[l], bias_v=bv[l], causal=matched[l].causal)  # type: ignore[arg-type]
        for l in range(L)
    ]
