"""The real model as an experiment: every measure over a prompt corpus, with bootstrap 95% CIs.

For each prompt the study puts the model's real sphere positions ``X_l`` (``l = 0..L``, see
:func:`~attnflow.hf.flow.real_positions`) next to these clouds (``variant``), all started at ``X_0``:

* ``flow``: the attention-only flow of the real heads (:func:`~attnflow.hf.flow.flow_through`,
  ``steps_per_layer`` steps per unit of time); ``flow_1step``: one Euler step per layer (the
  network's own step);
* baselines: ``no_move`` (``X_0`` kept); ``contraction`` (uniform attention with ``V = I``, i.e.
  the mean-shift flow ``x' = P_x mean_j x_j``, run for a time ``tau_l`` per prompt and depth chosen so
  its mean inner product is the real-head flow's: a generic contraction as strong as the flow's;
  the model is not looked at, so nothing is cross-fitted); ``random_s`` (random heads of the same
  shapes and norms, seeds ``s``) and their mean ``random``;
* depth tests: ``shuffled_k`` (the layers in a random order ``k``; mean ``shuffled``), ``reuse_l``
  (layer ``l``'s heads at every depth; mean ``reuse``), ``ou_k`` (an OU-like weight path: every
  entry of ``Q, K, V`` and the biases an AR(1) sequence across depth, ``rho`` per layer, with the
  stationary law ``N(mean, var)`` of that entry over the real layers; mean ``ou``);
* ``gf``: the gradient-flow projection of the real heads (:func:`~attnflow.hf.sphere.to_gradient_flow`)
  run as the ``gf`` model (where the paper's theorems apply);
* ablations of the real network (:mod:`attnflow.hf.ablate`): ``attention_only``, ``mlp_only``,
  ``no_norm2``, ``attention_only_no_norm2``;
* control: a copy of the model whose blocks (and the norm before the first) all equal block 0:
  ``control_model``, ``control_flow`` and ``control_shuffled`` (its layers in the orders ``k``). It
  is zero by construction; the control that can fail is a comparison, not a variant: two random
  halves of the layer orders against each other (``shuffled_half1 - shuffled_half2``,
  :data:`HALVES`), expected 0, estimated through the same flows and the same hierarchical CI.

Measures at each depth (``measure``): ``cos`` (mean cosine with the model's positions of the same
token), ``spearman`` (Spearman rank correlation of the pairwise inner products ``<x_i, x_j>``,
``i < j``, with the model's: not won by collapse, 0 when a cloud has no order left),
``cos_flow`` (mean cosine with the real-order flow), and the threshold-free cloud measures
``mean_inner``, ``effective_rank``, ``nn_cosine`` of :mod:`attnflow.hf.measures`. Control variants
are measured against the control model and its flow.

:func:`comparisons` turns the dataset into paired differences over prompts with percentile
bootstrap 95% CIs (``scipy.stats.bootstrap``).
"""

from __future__ import annotations

import copy
import json
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import xarray as xr

from attnflow.core.errors import InputError
from attnflow.core.figures import FIGURE_DPI
from attnflow.core.geometry import project_tangent
from attnflow.core.heads import Heads
from attnflow.core.memory import release_freed_memory
from attnflow.hf.ablate import ABLATIONS, ablated_positions
from attnflow.hf.flow import check_prompt, flow_through, real_positions, tokenize
from attnflow.hf.importer import HFLayers, blocks, extract, load_model, norm_modules
from attnflow.hf.measures import effective_rank, mean_cosine, mean_inner, nn_cosine, random_heads, relative_jumps
from attnflow.hf.paths import CrossGram, fit_weight_models, match_heads, shapes, smooth_path
from attnflow.hf.sphere import on_sphere, to_gradient_flow
from attnflow.io.metadata import describe
from attnflow.io.store import atomic_folder, write_manifest
from attnflow.solve.simulation import simulate
from attnflow.weights.processes import Layers

#: Measures stored per prompt, variant and depth.
MEASURES = ("cos", "spearman", "cos_flow", "mean_inner", "effective_rank", "nn_cosine")
#: The ablations run (``none`` is the model itself).
STUDY_ABLATIONS = tuple(a for a in ABLATIONS if a != "none")
#: Variants averaged over their draws: family -> prefix of the drawn variants.
FAMILIES = {
    "random": "random_",
    "shuffled": "shuffled_",
    "reuse": "reuse_",
    "ou": "ou_",
    "control_shuffled": "control_shuffled_",
    "random_matched": "random_matched_",
}
#: Degree of the smooth path's polynomial in depth (:func:`~attnflow.hf.paths.smooth_path`).
SMOOTH_DEGREE = 2
#: Layer orders run on the identical-layers control.
CONTROL_ORDERS = 3

VARIABLES: dict[str, tuple[str, str, str]] = {
    "prompt": ("prompt index", "1", "index of the prompt in the corpus (texts: attribute prompts)"),
    "variant": ("cloud compared", "1", "model, flow, baselines, depth tests, ablations, control (module docstring)"),
    "depth": ("depth l", "1", "depth l = 0..L: the input of block l (l = L: the last block's output)"),
    "process": ("weight path", "1", "the head sequence whose path length across depth is measured"),
    "cos": ("mean cosine with the model", "1", "mean_i <x_i, x_i(model)> at the same depth"),
    "spearman": (
        "rank correlation with the model",
        "1",
        "Spearman correlation of the pairwise <x_i, x_j> (i < j) with the model's at the same depth",
    ),
    "cos_flow": ("mean cosine with the flow", "1", "mean_i <x_i, x_i(real-order flow)> at the same depth"),
    "mean_inner": ("mean inner product", "1", "(sum_{i != j} <x_i, x_j>) / (N (N - 1))"),
    "effective_rank": ("effective rank", "1", "exp(entropy of the eigenvalues of x x^T / N); 1 = one point"),
    "nn_cosine": ("nearest-neighbour cosine", "1", "mean_i max_{j != i} <x_i, x_j>"),
    "n_tokens": ("tokens", "1", "number of tokens N of the prompt (special tokens included)"),
    "contraction_tau": (
        "matched contraction time",
        "1",
        "time tau_l of the mean-shift flow whose mean inner product is nearest the flow's at depth l (grid)",
    ),
    "gf_warnings": (
        "gf stability warnings",
        "1",
        "warnings the gf flow's stepper raised (step too large; -1: not run)",
    ),
    "path_A": ("weight path of A", "1", "sum over layer boundaries of |A_{l+1} - A_l| / mean(|A_l|, |A_{l+1}|)"),
    "path_V": ("weight path of V", "1", "sum over layer boundaries of |V_{l+1} - V_l| / mean(|V_l|, |V_{l+1}|)"),
}


@dataclass
class StudySetup:
    """What every prompt of a study shares: the model, its heads, the draws of the depth tests."""

    model: Any
    layers: HFLayers
    source: str
    steps_per_layer: int = 4
    method: str = "euler"
    seeds: int = 3
    shuffles: int = 100
    ou_draws: int = 3
    #: bootstrap resamples of the matched-head weight fit (0: no fit)
    fit_boot: int = 1000
    weight_fit: dict[str, Any] = field(default_factory=dict)
    ou_rho: float = 0.9
    seed: int = 0
    tau_max: float = 4.0
    tau_steps: int = 80
    #: the gf projection is stiff (MiniLM: dt <= 1/245 for Euler): its own steps per layer, and on
    #: the first ``gf_prompts`` prompts only (the others hold NaN; comparisons drop them).
    gf_steps_per_layer: int = 64
    gf_prompts: int | None = None
    control: Any = None
    control_layers: HFLayers | None = None
    perms: list[list[int]] = field(default_factory=list)
    lock: threading.RLock = field(default_factory=threading.RLock)
    cache: dict[tuple, Any] = field(default_factory=dict)

    @property
    def taus(self) -> np.ndarray:
        return np.linspace(0.0, self.tau_max, self.tau_steps + 1)


def identical_layers(model) -> Any:
    """A copy of ``model`` whose blocks all equal block 0 and, for post-norm models, whose norm
    before the first block equals the blocks' own, so every layer's heads on the sphere coincide
    (the control of the depth tests: the layer order cannot matter)."""
    c = copy.deepcopy(model)
    blks = blocks(c)
    for b in blks[1:]:
        b.load_state_dict(blks[0].state_dict())
    mods, pre = norm_modules(c, blks)
    if not pre:
        mods[0].load_state_dict(mods[1].state_dict())
    return c


def permutations(L: int, count: int, rng: np.random.Generator) -> list[list[int]]:
    """``count`` distinct random orders of ``0..L-1``, none the identity (when ``L > 1``); every
    non-identity order (``L! - 1`` of them, in lexicographic order) when ``count`` reaches that number."""
    import itertools
    import math

    if L > 1 and count >= math.factorial(L) - 1:
        return [list(p) for p in itertools.permutations(range(L))][1:]
    out: list[list[int]] = []
    seen: set[tuple[int, ...]] = set()
    while len(out) < count:
        p = tuple(int(i) for i in rng.permutation(L))
        if L > 1 and (p == tuple(range(L)) or p in seen):
            continue
        seen.add(p)
        out.append(list(p))
    return out


def members(names: Sequence[str], prefix: str) -> list[str]:
    """The drawn variants of a family: ``prefix`` followed by a draw number (``random_0``, not ``random_matched_0``)."""
    return [n for n in names if n.startswith(prefix) and n[len(prefix) :].isdigit()]


def make_setup(path_or_name: str, **options: Any) -> StudySetup:
    """Load the model (never downloading), its heads, the identical-layers control and the layer orders."""
    model = load_model(path_or_name)
    if model.config.model_type == "vit":
        raise InputError("'hf study' follows the tokens of text prompts; a ViT has no token ids")
    layers = extract(model, source=str(path_or_name))
    s = StudySetup(model=model, layers=layers, source=str(path_or_name), **options)
    for name, low in (("steps_per_layer", 1), ("seeds", 1), ("shuffles", 1), ("ou_draws", 1)):
        if int(getattr(s, name)) < low:
            raise InputError(f"{name} must be at least {low}; got {getattr(s, name)}")
    if not 0.0 <= s.ou_rho < 1.0:
        raise InputError(f"ou_rho must be in [0, 1); got {s.ou_rho}")
    s.control = identical_layers(model)
    s.control_layers = extract(s.control, source=f"{path_or_name} (identical layers)")
    s.perms = permutations(layers.L, s.shuffles, np.random.default_rng(s.seed))
    if s.fit_boot > 0:
        s.weight_fit = fit_weight_models(
            list(on_sphere(layers).layers), n_boot=s.fit_boot, n_orders=len(s.perms), seed=s.seed
        ).as_dict()
    return s


def _tensors(h: Heads) -> dict[str, torch.Tensor]:
    names = ("Q", "K", "V", "bias_q", "bias_k", "bias_v")
    return {n: getattr(h, n) for n in names if getattr(h, n) is not None}


def ou_process(process: Layers, rho: float, generator: torch.Generator) -> Layers:
    """Heads along an OU-like path: each entry ``theta`` of ``Q, K, V`` and the biases follows
    ``theta_l = m + s z_l``, ``z_{l+1} = rho z_l + sqrt(1 - rho^2) xi_l`` (``z_0, xi ~ N(0, 1)``), with
    ``m, s`` that entry's mean and standard deviation over the real layers: the stationary law
    of each entry is the real one's (a Gaussian fit), the correlation across depth is ``rho``."""
    per = [_tensors(h.to(dtype=torch.float64)) for h in process.layers]
    L = len(per)
    stats = {
        n: (torch.stack([p[n] for p in per]).mean(0), torch.stack([p[n] for p in per]).std(0, correction=0))
        for n in per[0]
    }
    z = {n: torch.randn(m.shape, generator=generator, dtype=torch.float64) for n, (m, _) in stats.items()}
    out = []
    for l in range(L):
        if l > 0:
            for n in z:
                xi = torch.randn(z[n].shape, generator=generator, dtype=torch.float64)
                z[n] = rho * z[n] + np.sqrt(1.0 - rho**2) * xi
        base = process.layers[l]
        vals = {n: stats[n][0] + stats[n][1] * z[n] for n in stats}
        out.append(Heads(**{**{k: getattr(base, k) for k in ("causal", "rope")}, **vals}))
    return Layers(out, t_end=float(L))


def value_factors_of(
    heads: Heads, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(U, W)`` with ``V_h = U_h W_h`` (``(H, d, m)``, ``(H, m, d)``) from a randomized range finder of
    width ``m = min(d, k + 8)`` (``k`` the heads' rank), or None when that does not reproduce ``V`` to
    ``1e-10`` relative (then the dense ``V`` is used). Imported heads have ``rank V_h <= k``: applying
    ``W`` then ``U`` costs ``2 m d`` per token and head instead of ``d^2``."""
    V = heads.values.to(torch.float64)
    H, d, _ = V.shape
    m = min(d, heads.rank + 8)
    if m >= d // 2:
        return None
    g = generator or torch.Generator().manual_seed(0)
    Y = V @ torch.randn(d, m, generator=g, dtype=torch.float64)
    U, _ = torch.linalg.qr(Y)  # (H, d, m), orthonormal columns spanning the range of V
    W = U.transpose(1, 2) @ V
    err = torch.linalg.vector_norm(U @ W - V) / torch.linalg.vector_norm(V).clamp_min(1e-300)
    return (U, W) if float(err) <= 1e-10 else None


def attention_logits(x: torch.Tensor, heads: Heads) -> torch.Tensor:
    """The logits ``(Q_h x_i + b_Q) . (K_h x_j + b_K)`` ``(..., H, N, N)`` of ``heads`` at the clouds ``x``
    ``(..., N, d)`` (``-inf`` above the diagonal for causal heads). ``heads`` may hold a stack of
    same-shaped layers on a leading axis (:func:`stacked_heads`), one per cloud."""
    q, k, c = heads.logit_features(x)  # (B, H, N, r), c (B, H, N) or None
    logits = q @ k.transpose(-1, -2)
    if c is not None:
        logits = logits + c.unsqueeze(-2)
    if heads.causal:
        n = x.shape[-2]
        logits = logits.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    return logits


def pack(heads: Heads, factors: tuple[torch.Tensor, torch.Tensor] | None = None) -> dict[str, Any] | None:
    """``Q_h``, ``K_h`` (and ``W_h`` of ``V_h = U_h W_h``) of every head side by side, ``(..., d, H (2k + m))``,
    and ``[U_1 ... U_H]`` ``(..., d, H m)``: a cloud's features for all heads in one matrix product
    (:func:`batched_field`). None for heads without query factors or with rotary embeddings."""
    if heads.Q is None or heads.rope is not None:
        return None
    H, k, d = heads.Q.shape[-3:]
    parts = [heads.Q, heads.K] + ([factors[1]] if factors is not None else [])
    M = torch.cat(parts, -2)  # (..., H, 2k (+ m), d)
    out: dict[str, Any] = {"P": M.reshape(*M.shape[:-3], -1, d).transpose(-1, -2), "k": k, "H": H, "width": M.shape[-2]}
    if factors is not None:
        U = factors[0]  # (..., H, d, m)
        out["U"] = U.transpose(-3, -2).reshape(*U.shape[:-3], d, -1)
    return out


def batched_field(
    x: torch.Tensor,
    heads: Heads,
    factors: tuple[torch.Tensor, torch.Tensor] | None = None,
    packed: dict[str, Any] | None = None,
) -> torch.Tensor:
    """The ``mha`` field ``P_x (1/H) sum_h softmax_j(logits_hij) (V_h x_j + b_V)`` of ``heads`` at a batch
    of clouds ``x`` ``(B, N, d)`` (uniform token and head masses, as :func:`~attnflow.hf.flow.flow_through`;
    checked against :func:`attnflow.dynamics.fields.velocity` in the tests). ``factors``: ``V = U W``
    (:func:`value_factors_of`), applied after the attention average (``V`` itself is then not read).
    ``heads`` may be a stack of ``B`` layers (:func:`stacked_heads`): each cloud then moves by its own.
    ``packed``: :func:`pack` of ``heads, factors`` (made here when not given), optionally with a
    ``"scale"`` ``(B, 1, 1)`` multiplying each cloud's values (``V c``, ``b_V c``)."""
    pk = packed if packed is not None else pack(heads, factors)
    if pk is None:  # dense or rotary heads: the features head by head
        attn = torch.softmax(attention_logits(x, heads), dim=-1)
        if factors is None:
            out = attn @ heads.value_features(x)  # (B, H, N, d)
        else:
            U, W = factors
            out = (attn @ (x.unsqueeze(-3) @ W.transpose(-1, -2))) @ U.transpose(-1, -2)
            if heads.bias_v is not None:
                out = out + heads.bias_v.unsqueeze(-2)  # the attention weights sum to one
        return project_tangent(x, out.mean(-3))
    H, k = pk["H"], pk["k"]
    Z = (x @ pk["P"]).unflatten(-1, (H, pk["width"])).transpose(-2, -3)  # (B, H, N, 2k (+ m))
    q, kf = Z[..., :k], Z[..., k : 2 * k]
    if heads.bias_k is not None:
        kf = kf + heads.bias_k.unsqueeze(-2)
    logits = q @ kf.transpose(-1, -2)
    if heads.bias_q is not None:
        logits = logits + (kf @ heads.bias_q.unsqueeze(-1)).transpose(-1, -2)
    if heads.causal:
        n = x.shape[-2]
        logits = logits.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    attn = torch.softmax(logits, dim=-1)
    if factors is None:
        return project_tangent(x, (attn @ heads.value_features(x)).mean(-3))
    y = (attn @ Z[..., 2 * k :]).transpose(-2, -3).flatten(-2)  # (B, N, H m)
    out = (y @ pk["U"].transpose(-1, -2)) / H
    if heads.bias_v is not None:
        out = out + heads.bias_v.mean(-2).unsqueeze(-2)  # the attention weights sum to one
    if "scale" in pk:  # values scaled per cloud (V c, b_V c)
        out = out * pk["scale"]
    return project_tangent(x, out)


def stacked_heads(layers: Sequence[Heads], *, values: bool = True) -> Heads:
    """Same-shaped layers stacked on a leading axis: :func:`batched_field` and
    :func:`attention_logits` of the stack at clouds ``(J, N, d)`` give each layer's own at its cloud
    (the tensors broadcast). ``values=False`` leaves ``V`` out (when value factors are passed instead)."""

    def st(get: Callable[[Heads], torch.Tensor | None]) -> torch.Tensor | None:
        got = [get(h) for h in layers]
        return None if got[0] is None else torch.stack([t.to(torch.float64) for t in got])  # type: ignore[union-attr]

    return Heads(
        K=st(lambda h: h.K),  # type: ignore[arg-type]
        Q=st(lambda h: h.queries),  # dense heads (Q None) as factors: the identity and A
        V=st(lambda h: h.values) if values else None,
        bias_q=st(lambda h: h.bias_q),
        bias_k=st(lambda h: h.bias_k),
        bias_v=st(lambda h: h.bias_v),
        causal=layers[0].causal,
        rope=layers[0].rope,
    )


def flow_batch(
    x0: np.ndarray,
    stacks: Sequence[Sequence[Heads]],
    steps_per_layer: int,
    factors: dict[int, Any] | None = None,
) -> np.ndarray:
    """Euler flows of many head stacks at once: ``(B, L+1, N, d)`` positions at ``t = 0..L`` of the
    ``mha`` flow of ``stacks[b]`` (one unit of time per layer) from ``x0`` (``(N, d)``, or ``(B, N, d)``
    one start per stack). Stacks that begin with the same heads from the same start share their states
    up to where they part (the layer orders of the depth test: 6 distinct first layers, at most 30
    distinct pairs, ...), and at each depth the clouds that use the same :class:`Heads` object share
    one tensor call (at most ``L`` calls per step for any number of orders).
    ``factors``: a cache ``id(heads) -> (heads, value factors)`` kept between calls (filled here)."""
    from attnflow.core.geometry import retract

    cache = {} if factors is None else factors
    B = len(stacks)
    x = torch.as_tensor(np.asarray(x0), dtype=torch.float64)
    # The distinct states at the current depth (rows of ``cur``) and the row each stack is at.
    cur = x.clone() if x.ndim == 3 else x[None].clone()
    row = list(range(B)) if x.ndim == 3 else [0] * B
    dt = 1.0 / int(steps_per_layer)
    out = np.empty((B, len(stacks[0]) + 1, *cur.shape[1:]))
    out[:, 0] = cur.numpy()[row]
    L = len(stacks[0])
    for l in range(L):
        # A new state for every distinct (state, heads) pair; pairs that share heads share a call.
        pairs: dict[tuple[int, int], int] = {}
        for b in range(B):
            row[b] = pairs.setdefault((row[b], id(stacks[b][l])), len(pairs))
        heads_of: dict[int, Heads] = {id(stacks[b][l]): stacks[b][l] for b in range(B)}
        nxt = torch.empty((len(pairs), *cur.shape[1:]), dtype=torch.float64)
        groups: dict[int, list[tuple[int, int]]] = {}
        for (parent, key), new in pairs.items():
            groups.setdefault(key, []).append((parent, new))
        for key, members_ in groups.items():
            h = heads_of[key]
            if key not in cache or cache[key][0] is not h:
                cache[key] = (h, value_factors_of(h))
            if len(cache[key]) < 3:  # the packed features, kept beside the factors
                cache[key] = (*cache[key][:2], pack(h, cache[key][1]))
            _, f, pk = cache[key]
            y = cur[torch.as_tensor([p for p, _ in members_])]
            for _ in range(int(steps_per_layer)):
                y = retract(y + dt * batched_field(y, h, f, pk))
            nxt[torch.as_tensor([n for _, n in members_])] = y
        cur = nxt
        out[:, l + 1] = cur.numpy()[row]
    return out


def _entropy(logits: torch.Tensor) -> torch.Tensor:
    """Mean over heads and tokens of ``-sum_j p_ij log p_ij``, ``p = softmax(logits)``: ``(...)`` from ``(..., H, N, N)``."""
    logp = torch.log_softmax(logits, dim=-1)
    p = logp.exp()
    return -(p * torch.where(p > 0, logp, torch.zeros_like(logp))).sum(-1).mean((-1, -2))


def attention_entropy(x: torch.Tensor, heads: Heads) -> float:
    """Mean over heads and tokens of the entropy ``-sum_j p_ij log p_ij`` of the attention at the cloud ``x``."""
    return float(_entropy(attention_logits(x, heads)))


def displacement(x: np.ndarray, heads: Heads, steps_per_layer: int, factors: Any = None) -> float:
    """Mean token displacement ``mean_i |x_i(1) - x_i(0)|`` of one layer (one unit of time) of the flow from ``x``
    (``factors``: the value factors of ``heads``, :func:`value_factors_of`)."""
    y = flow_batch(x, [[heads]], steps_per_layer, {id(heads): (heads, factors)})[0]
    return float(np.linalg.norm(y[1] - y[0], axis=-1).mean())


def _displacements(
    x: torch.Tensor, heads: Heads, steps_per_layer: int, factors: Any, packed: dict[str, Any] | None = None
) -> np.ndarray:
    """:func:`displacement` of each layer of a stack (:func:`stacked_heads`) from its own cloud ``x[j]``."""
    from attnflow.core.geometry import retract

    y, dt = x, 1.0 / int(steps_per_layer)
    pk = packed if packed is not None else pack(heads, factors)
    for _ in range(int(steps_per_layer)):
        y = retract(y + dt * batched_field(y, heads, factors, pk))
    return np.linalg.norm((y - x).numpy(), axis=-1).mean(-1)


def _low_rank_factors(Lf: torch.Tensor, Rf: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(U, W)`` with ``V = L R = U W`` and orthonormal ``U`` (the form of :func:`value_factors_of`) from
    the factors of drawn values, ``U`` from a QR of ``L``; None when that is no cheaper than dense ``V``."""
    if 2 * Lf.shape[-1] >= Lf.shape[-2]:
        return None
    U, _ = torch.linalg.qr(Lf)
    return U, (U.transpose(-1, -2) @ Lf) @ Rf


def _stack_factors(fs: Sequence[Any]) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The value factors of a stack of layers (None unless every layer has them)."""
    if any(f is None for f in fs):
        return None
    return torch.stack([f[0] for f in fs]), torch.stack([f[1] for f in fs])


def matched_random_stack(
    reals: Sequence[Heads],
    xs: Sequence[np.ndarray],
    generator: torch.Generator,
    steps_per_layer: int,
    *,
    draws: int = 1,
    iterations: int = 6,
    real_factors: Sequence[Any] | None = None,
) -> list[list[tuple[Heads, dict[str, float], Any]]]:
    """:func:`matched_random_heads` for every layer ``reals[l]`` at its cloud ``xs[l]``, ``draws`` times
    (the random heads drawn from ``generator`` draw by draw, layer by layer, as that many calls would),
    with the bisections and fixed points of all ``draws x L`` heads run together (one tensor call per
    step). Returns ``out[draw][l] = (heads, reached, value factors of heads)``."""
    L = len(reals)
    J = int(draws) * L
    rf = list(real_factors) if real_factors is not None else [value_factors_of(h) for h in reals]
    x1 = torch.stack([torch.as_tensor(np.asarray(x), dtype=torch.float64) for x in xs])  # (L, N, d)
    xj = x1.repeat(int(draws), 1, 1)  # (J, N, d): draw-major, as the heads below
    drawn = [random_heads(reals[j % L], generator, value_factors=True) for j in range(J)]
    rand = [h for h, _ in drawn]
    # The real layers' targets, one stacked call each.
    real_stack = stacked_heads(reals, values=_stack_factors(rf) is None)
    target_e = _entropy(attention_logits(x1, real_stack)).numpy()
    target_d = _displacements(x1, real_stack, steps_per_layer, _stack_factors(rf))
    te, td = np.tile(target_e, int(draws)), np.tile(target_d, int(draws))
    # Entropy: the logits are linear in the query scale s (Q and its bias): bisection on log s.
    logits0 = attention_logits(xj, stacked_heads(rand, values=False))
    lo, hi = np.full(J, -12.0), np.full(J, 12.0)  # entropy decreases as the logits grow
    for _ in range(36):  # 24 / 2^36: the scale to 1e-9 relative
        mid = 0.5 * (lo + hi)
        e = _entropy(logits0 * torch.as_tensor(np.exp(mid))[:, None, None, None]).numpy()
        up = e > te
        lo, hi = np.where(up, mid, lo), np.where(up, hi, mid)
    scale = np.exp(0.5 * (lo + hi))
    rand = [
        replace(h, Q=h.queries * float(s), bias_q=None if h.bias_q is None else h.bias_q * float(s))
        for h, s in zip(rand, scale)
    ]
    reached_e = _entropy(logits0 * torch.as_tensor(scale)[:, None, None, None]).numpy()
    # Speed: the values scaled by c (V and its bias) until one layer moves the tokens as far as the real one.
    fs = [_low_rank_factors(*lr) for _, lr in drawn]  # V = L R: U spans the columns of L
    dense = _stack_factors(fs) is None

    if not dense:  # stacked and packed once; each iteration picks its rows and scales U and b_V
        all_st = stacked_heads(rand, values=False)
        all_f = _stack_factors(fs)
        all_pk = pack(all_st, all_f)

    def moved(idx: np.ndarray, c: np.ndarray) -> np.ndarray:
        if dense:
            hs = [_value_scaled(rand[j], float(cj)) for j, cj in zip(idx, c)]
            return _displacements(xj[torch.as_tensor(idx)], stacked_heads(hs), steps_per_layer, None)
        # Every stacked layer moves (no copies of the packed matrices); the values' scale c multiplies
        # each layer's head average (U c and b_V c: the same field).
        full = np.ones(J)
        full[idx] = c
        pk = {**all_pk, "scale": torch.as_tensor(full)[:, None, None]}  # type: ignore[dict-item]
        return _displacements(xj, all_st, steps_per_layer, all_f, pk)[idx]

    c = np.ones(J)
    got = moved(np.arange(J), c)
    done = np.zeros(J, dtype=bool)
    for _ in range(int(iterations)):
        done |= (got <= 0) | (np.abs(got / td - 1.0) < 1e-4)
        act = np.flatnonzero(~done)
        if len(act) == 0:
            break
        c[act] *= td[act] / got[act]
        got[act] = moved(act, c[act])
    out: list[list[tuple[Heads, dict[str, float], Any]]] = []
    for j in range(J):
        if j % L == 0:
            out.append([])
        f = fs[j]
        reached = {
            "entropy": float(reached_e[j]),
            "entropy_real": float(te[j]),
            "displacement": float(got[j]),
            "displacement_real": float(td[j]),
        }
        out[-1].append((_value_scaled(rand[j], float(c[j])), reached, None if f is None else (f[0] * c[j], f[1])))
    return out


def matched_random_heads(
    real: Heads,
    x: np.ndarray,
    generator: torch.Generator,
    steps_per_layer: int,
    *,
    iterations: int = 6,
    real_factors: Any = None,
) -> tuple[Heads, dict[str, float]]:
    """Random heads (:func:`~attnflow.hf.measures.random_heads`) matched to ``real`` at the cloud ``x``:
    the logits scaled (``Q`` and its bias) so the mean attention entropy is the real heads' (bisection on
    the log scale), then the values scaled (``V`` and its bias) so one layer moves the tokens as far as the
    real heads do (:func:`displacement`, fixed-point iteration on the scale). Returns the heads and the
    reached ``{"entropy", "entropy_real", "displacement", "displacement_real"}`` (one layer of
    :func:`matched_random_stack`)."""
    rf = None if real_factors is None else [real_factors]
    h, reached, _ = matched_random_stack(
        [real], [x], generator, steps_per_layer, iterations=iterations, real_factors=rf
    )[0][0]
    return h, reached


def _value_scaled(h: Heads, c: float) -> Heads:
    return replace(h, V=h.values * c, bias_v=None if h.bias_v is None else h.bias_v * c)


def uniform_heads(d: int, scale: float) -> Heads:
    """One head with zero logits (uniform attention) and ``V = scale I``: the mean-shift field ``scale P_x mean_j x_j``."""
    z = torch.zeros(1, 1, d, dtype=torch.float64)
    return Heads(K=z, Q=z.clone(), V=scale * torch.eye(d, dtype=torch.float64)[None])


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman correlation of the pairwise inner products of clouds ``a`` and ``b`` (``i < j``);
    0 when either has no order left (all pairs equal)."""
    return float(_spearman_many(a[None, None], b[None])[0, 0])


def _centred_ranks(G: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Average ranks along the last axis minus their mean, and whether the row has an order (not all equal)."""
    from scipy.stats import rankdata

    r = rankdata(G, axis=-1)
    return r - r.mean(-1, keepdims=True), np.ptp(G, axis=-1) > 0


def _spearman_many(X: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """:func:`spearman` of every cloud ``X[v, l]`` ``(V, L+1, N, d)`` with ``ref[l]`` ``(L+1, N, d)``:
    ``(V, L+1)``. The Pearson correlation of the average ranks (what ``scipy.stats.spearmanr`` computes),
    the reference's ranks found once per depth."""
    N = X.shape[-2]
    iu = np.triu_indices(N, 1)
    if len(iu[0]) < 2:
        return np.zeros(X.shape[:2])
    # Each Gram matrix as a @ a.T, as the one-cloud form always did (equal pairs stay equal).
    gx = np.array([[(a @ a.T)[iu] for a in per] for per in X])
    gy = np.array([(b @ b.T)[iu] for b in ref])
    rx, okx = _centred_ranks(gx)
    ry, oky = _centred_ranks(gy)
    with np.errstate(invalid="ignore", divide="ignore"):
        r = (rx * ry[None]).sum(-1) / np.sqrt((rx * rx).sum(-1) * (ry * ry).sum(-1)[None])
    return np.where(okx & oky[None] & np.isfinite(r), r, 0.0)


def measure_many(runs: dict[str, np.ndarray], ref: np.ndarray, flow: np.ndarray) -> dict[str, dict[str, np.ndarray]]:
    """Every measure of :data:`MEASURES` at every depth of every cloud ``runs[name]`` ``(L+1, N, d)``
    against the reference ``ref`` and the flow ``flow``: ``{name: {measure: (L+1,)}}``."""
    names = list(runs)
    X = np.stack([np.asarray(runs[n], dtype=np.float64) for n in names])  # (V, L+1, N, d)
    out = {
        "cos": mean_cosine(X, ref[None]),
        "spearman": _spearman_many(X, ref),
        "cos_flow": mean_cosine(X, flow[None]),
        "mean_inner": np.array([[mean_inner(x) for x in per] for per in X]),
        "effective_rank": np.array([[effective_rank(x) for x in per] for per in X]),
        "nn_cosine": np.array([[nn_cosine(x) for x in per] for per in X]),
    }
    return {n: {m: out[m][v] for m in MEASURES} for v, n in enumerate(names)}


def measure_all(X: np.ndarray, ref: np.ndarray, flow: np.ndarray) -> dict[str, np.ndarray]:
    """Every measure of :data:`MEASURES` at every depth of ``X`` ``(L+1, N, d)``."""
    return measure_many({"X": X}, ref, flow)["X"]


def _gf_flow(x0: np.ndarray, process: Layers, spl: int) -> tuple[np.ndarray, int]:
    """The ``gf`` flow's positions at ``t = 0..L`` and the number of stability warnings it raised."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        traj = simulate(
            x0,
            process,
            model="gf",
            t_end=process.t_end,
            dt=1.0 / spl,
            method="euler",
            save_every=spl,
            dtype=torch.float64,
        )
    return np.asarray(traj.x), len(caught)


def processes(
    setup: StudySetup, radius: np.ndarray
) -> tuple[Layers, dict[str, Layers], dict[str, tuple[float, float]]]:
    """``(flow, processes, paths)`` for the residual radii ``radius`` (all ones for post-norm models,
    where they are the same for every prompt and built once): the real heads on the sphere, every
    drawn head sequence of the study and the weight path length of ``A`` and ``V`` of each."""
    key = tuple(np.round(np.asarray(radius, dtype=np.float64), 12).tolist())
    with setup.lock:
        if key in setup.cache:
            return setup.cache[key]
        L = setup.layers.L
        flow = on_sphere(setup.layers, radius=radius)
        matched = Layers(match_heads(list(flow.layers))[0], t_end=float(L))
        procs: dict[str, Layers] = {"real": flow}
        for s in range(setup.seeds):
            g = torch.Generator().manual_seed(setup.seed + 1000 + s)
            procs[f"random_{s}"] = Layers([random_heads(h, g) for h in flow.layers], t_end=float(L))
        # The real heads themselves, not copies (Layers() converts every layer to a new object): the
        # batched flows share the states and tensor calls of stacks that hold the same heads.
        for k, p in enumerate(setup.perms):
            procs[f"shuffled_{k}"] = _sharing([flow.layers[i] for i in p])
        for l in range(L):
            procs[f"reuse_{l}"] = _sharing([flow.layers[l]] * L)
        for k in range(setup.ou_draws):
            g = torch.Generator().manual_seed(setup.seed + 2000 + k)
            procs[f"ou_{k}"] = ou_process(matched, setup.ou_rho, g)
        if flow.layers[0].rope is None:
            procs["smooth"] = Layers(smooth_path(flow.layers, degree=SMOOTH_DEGREE), t_end=float(L))
        procs["gf"] = to_gradient_flow(flow).layers
        assert setup.control_layers is not None
        # One radius for every layer (their mean): identical blocks then give identical heads on the sphere.
        procs["control"] = on_sphere(setup.control_layers, radius=float(np.mean(radius)))
        # Heads matched across depth before any path length: a relabelling of a layer's heads is the
        # same network. The real layers in any order: look-ups in their cross Gram matrix.
        cg = CrossGram(list(flow.layers))
        paths = {"real": _cg_path(cg, list(range(L)))}
        paths.update({f"shuffled_{k}": _cg_path(cg, p) for k, p in enumerate(setup.perms)})
        for n, P in procs.items():
            if n.startswith("reuse_") or n in paths:
                continue
            m = match_heads([shapes(h) for h in P.layers])[0]
            paths[n] = (
                float(relative_jumps([h.A for h in m]).sum()),
                float(relative_jumps([h.values for h in m]).sum()),
            )
        setup.cache[key] = (flow, procs, paths)
        return setup.cache[key]


def _sharing(heads: list[Heads]) -> Layers:
    """Layers holding these very :class:`Heads` objects (float64 already), one unit of time each."""
    out = Layers(heads[:1], t_end=float(len(heads)))
    out.layers = list(heads)
    return out


def _cg_path(cg: CrossGram, order: Sequence[int]) -> tuple[float, float]:
    idx = cg.match(list(order))
    return float(cg.jumps(idx, "A").sum()), float(cg.jumps(idx, "V").sum())


def study_prompt(setup: StudySetup, ids: Sequence[int], index: int = 0) -> dict[str, Any]:
    """All variants' measures for one prompt: ``{"measures": {variant: {measure: (L+1,)}},
    "contraction": {measure: (L+1,)}, "contraction_tau": (L+1,), "paths": {process: (A, V)}, "n_tokens": N}``."""
    L, spl, method = setup.layers.L, setup.steps_per_layer, setup.method
    t = torch.tensor([list(ids)])
    pre = setup.layers.meta.pre_norm
    with setup.lock:  # the ablations hook the shared modules: one forward pass at a time
        X, r = real_positions(setup.model, setup.layers, t)
        abl = {a: ablated_positions(setup.model, setup.layers, t, a) for a in STUDY_ABLATIONS}
        assert setup.control_layers is not None
        Xc, rc = real_positions(setup.control, setup.control_layers, t)
    flow, procs, paths = processes(setup, r if pre else np.ones(L))
    x0 = X[0]
    runs: dict[str, np.ndarray] = {"model": X}
    runs["flow"] = flow_through(x0, flow, spl, method)
    runs["flow_1step"] = flow_through(x0, flow, 1, "euler")
    runs["no_move"] = np.broadcast_to(x0, X.shape).copy()
    drawn = [n for n in procs if n not in ("real", "control", "gf")]
    procs = dict(procs)  # the per-prompt random heads below stay out of the shared cache
    with setup.lock:
        shared = setup.cache.setdefault(("value_factors",), {})
        for P in procs.values():
            for h in P.layers:
                if id(h) not in shared:
                    shared[id(h)] = (h, value_factors_of(h))
        factors = dict(shared)
    g = torch.Generator().manual_seed(setup.seed + 3000 + index)
    # Random heads matched to the real ones at this prompt's positions, every seed and layer at once.
    matched = matched_random_stack(
        list(flow.layers),
        list(X[:L]),
        g,
        spl,
        draws=setup.seeds,
        real_factors=[factors[id(h)][1] for h in flow.layers],
    )
    for s, per_layer in enumerate(matched):
        drawn.append(f"random_matched_{s}")
        procs[drawn[-1]] = _sharing([h for h, _, _ in per_layer])
        factors.update({id(h): (h, f) for h, _, f in per_layer})
    if method == "euler":  # one batched call for every drawn head sequence
        for name, Y in zip(drawn, flow_batch(x0, [procs[n].layers for n in drawn], spl, factors)):
            runs[name] = Y
    else:
        for name in drawn:
            runs[name] = flow_through(x0, procs[name], spl, method)
    gf_warnings = -1  # -1: the gf flow was not run for this prompt
    gf_cpu = time.process_time()
    if setup.gf_prompts is None or index < setup.gf_prompts:
        runs["gf"], gf_warnings = _gf_flow(x0, procs["gf"], int(setup.gf_steps_per_layer))
    gf_cpu = time.process_time() - gf_cpu

    runs.update(abl)
    measures = measure_many(runs, X, runs["flow"])
    if "gf" not in measures:
        measures["gf"] = {m: np.full(L + 1, np.nan) for m in MEASURES}
    # The identical-layers control, measured against its own model and flow.
    cflow = procs["control"]
    cf = flow_through(Xc[0], cflow, spl, method)
    measures["control_model"] = measure_all(Xc, Xc, cf)
    measures["control_flow"] = measure_all(cf, Xc, cf)
    # Identical layers: a few orders show it as well as many (the layers are one head sequence).
    cstacks = [[cflow.layers[i] for i in p] for p in setup.perms[:CONTROL_ORDERS]]
    cruns = {f"control_shuffled_{k}": Y for k, Y in enumerate(flow_batch(Xc[0], cstacks, spl, factors))}
    measures.update(measure_many(cruns, Xc, cf))
    # The contraction baseline: the mean-shift flow along a grid of times, read at the time whose mean
    # inner product is nearest the flow's at each depth (as strong a contraction as the real heads').
    dtau = setup.tau_max / setup.tau_steps
    grid = Layers([uniform_heads(x0.shape[1], dtau)] * setup.tau_steps, t_end=float(setup.tau_steps))
    C = flow_through(x0, grid, 2, "euler")
    mi = np.array([mean_inner(c) for c in C])
    idx = np.argmin(np.abs(mi[:, None] - measures["flow"]["mean_inner"][None, :]), axis=0)  # (L+1,)
    contraction = measure_all(C[idx], X, runs["flow"])
    return {
        "measures": measures,
        "contraction": contraction,
        "contraction_tau": setup.taus[idx],
        "paths": paths,
        "n_tokens": len(ids),
        "gf_warnings": gf_warnings,
        "gf_cpu": gf_cpu,
    }


def _prompt_released(setup: StudySetup, ids: Sequence[int], index: int) -> dict[str, Any]:
    """:func:`study_prompt`, then the heap's freed memory returned (:func:`~attnflow.core.memory.release_freed_memory`)."""
    out = study_prompt(setup, ids, index)
    release_freed_memory()
    return out


def run_study(
    path_or_name: str,
    prompts: Sequence[str],
    *,
    use_dask: bool = False,
    workers: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    estimate: Callable[[dict[str, float]], None] | None = None,
    corpus: str = "",
    **options: Any,
) -> xr.Dataset:
    """Run every variant over ``prompts`` (texts, tokenized with the model's own tokenizer and its
    special tokens) and return the self-describing dataset (dims ``prompt, variant, depth``).

    ``use_dask``: the prompts are computed as ``dask.delayed`` tasks on the threaded scheduler
    (``workers`` threads; forward passes through the shared model are serialised).
    ``estimate``: called once, after the first prompt (serial runs), with the CPU seconds
    ``{"setup", "prompt", "gf", "total"}``: the setup's, the first prompt's without its gf flow, that gf
    flow's, and ``total = setup + P prompt + G gf`` for ``P`` prompts, ``G`` of them with the gf flow."""
    if not prompts:
        raise InputError("the study needs at least one prompt")
    start = time.process_time()
    setup = make_setup(path_or_name, **options)
    vocab = int(setup.model.config.vocab_size)
    ids_all = []
    for n, text in enumerate(prompts):
        ids, _ = tokenize(path_or_name, text)
        try:
            check_prompt(ids, setup.layers, vocab)
        except ValueError as e:
            raise InputError(f"prompt {n} ({text[:40]!r}): {e}") from None
        ids_all.append(ids)
    if not setup.layers.meta.pre_norm:  # post-norm: every prompt's head sequences are the same, built now
        processes(setup, np.ones(setup.layers.L))
    # The heap's freed memory back to the system after the setup and after every prompt: without it
    # the resident size grows with the prompts run (7.1 GB after 30 MiniLM prompts, 1.5 GB of them
    # alive; attnflow.core.memory). No number changes.
    release_freed_memory()
    setup_cpu = time.process_time() - start
    if use_dask:
        import dask

        tasks = [dask.delayed(_prompt_released)(setup, ids, k) for k, ids in enumerate(ids_all)]
        results = list(dask.compute(*tasks, scheduler="threads", num_workers=workers))
    else:
        results = []
        for k, ids in enumerate(ids_all):
            t0 = time.process_time()
            results.append(_prompt_released(setup, ids, k))
            if k == 0 and estimate is not None:
                P = len(ids_all)
                G = P if setup.gf_prompts is None else min(P, int(setup.gf_prompts))
                gf = float(results[0].get("gf_cpu", 0.0))
                one = time.process_time() - t0 - gf
                estimate({"setup": setup_cpu, "prompt": one, "gf": gf, "total": setup_cpu + P * one + G * gf})
            if progress is not None:
                progress(k + 1, len(ids_all))
    return assemble(results, setup, list(prompts), corpus=corpus)


def assemble(results: list[dict[str, Any]], setup: StudySetup, prompts: list[str], corpus: str = "") -> xr.Dataset:
    """The dataset of :func:`run_study` from the per-prompt results of :func:`study_prompt`."""
    P, L = len(results), setup.layers.L
    variants = list(results[0]["measures"])
    data = {m: np.array([[res["measures"][v][m] for v in variants] for res in results]) for m in MEASURES}
    cvals = {m: np.stack([res["contraction"][m] for res in results]) for m in MEASURES}
    names = [*variants, "contraction"]
    fams = {fam: [variants.index(v) for v in members(variants, prefix)] for fam, prefix in FAMILIES.items()}
    fams = {fam: idx for fam, idx in fams.items() if idx}
    names += list(fams)
    for m in MEASURES:
        parts = [data[m], cvals[m][:, None]]
        parts += [data[m][:, idx].mean(1, keepdims=True) for idx in fams.values()]
        data[m] = np.concatenate(parts, axis=1)
    processes = list(results[0]["paths"])
    pathA = np.array([[res["paths"][n][0] for n in processes] for res in results])
    pathV = np.array([[res["paths"][n][1] for n in processes] for res in results])
    dims = ("prompt", "variant", "depth")
    ds = xr.Dataset(
        {
            **{m: (dims, data[m]) for m in MEASURES},
            "n_tokens": (("prompt",), np.array([res["n_tokens"] for res in results], dtype=np.int64)),
            "contraction_tau": (("prompt", "depth"), np.stack([res["contraction_tau"] for res in results])),
            "gf_warnings": (("prompt",), np.array([res["gf_warnings"] for res in results], dtype=np.int64)),
            "path_A": (("prompt", "process"), pathA),
            "path_V": (("prompt", "process"), pathV),
        },
        coords={
            "prompt": np.arange(P),
            "variant": np.array(names, dtype=object),
            "depth": np.arange(L + 1),
            "process": np.array(processes, dtype=object),
        },
        attrs={
            "title": "attnflow hf study: a real model's token flow against baselines, depth tests and ablations",
            "source": setup.source,
            "corpus": corpus,
            "prompts": json.dumps(prompts),
            "architecture": setup.layers.meta.architecture,
            "model_type": setup.layers.meta.model_type,
            "steps_per_layer": int(setup.steps_per_layer),
            "method": setup.method,
            "random_seeds": int(setup.seeds),
            "layer_orders": json.dumps(setup.perms),
            "ou_rho": float(setup.ou_rho),
            "ou_draws": int(setup.ou_draws),
            "draws": json.dumps({fam: len(idx) for fam, idx in fams.items()}),
            "weight_fit": json.dumps(setup.weight_fit),
            "head_matching": "Hungarian assignment between consecutive layers on the head distance "
            "|A/|A| - A'/|A'||_F^2 + |V/|V| - V'/|V'||_F^2 (attnflow.hf.paths)",
            "smooth_degree": int(SMOOTH_DEGREE),
            "seed": int(setup.seed),
            "contraction": "uniform attention, V = I (mean-shift flow), time per prompt and depth matched to the "
            "flow's mean inner product",
            "ablations": json.dumps({a: list(ABLATIONS[a]) for a in STUDY_ABLATIONS}),
            "Conventions": "CF-1.10",
        },
    )
    return describe(ds, VARIABLES)


# ---------------------------------------------------------------------------------------------
# Comparisons with bootstrap confidence intervals.
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One comparison: the per-prompt statistic of ``a`` minus that of ``b`` (``b`` empty: ``a`` alone),
    its mean over prompts (and draws) and its 95% CI: hierarchical (prompts and draws resampled
    together, :func:`hierarchical_ci`) when ``a`` or ``b`` is a family of ``draws > 1`` random draws,
    else the percentile bootstrap over prompts; ``lo_prompts, hi_prompts``: the prompt-only CI of the
    same mean (narrower when the draws vary). ``band``: the prompts' length band (``all``: every prompt)."""

    group: str
    a: str
    b: str
    measure: str
    statistic: str
    mean_a: float
    mean_b: float
    diff: float
    lo: float
    hi: float
    n: int = 0
    band: str = "all"
    draws: int = 1
    lo_prompts: float = float("nan")
    hi_prompts: float = float("nan")

    @property
    def excludes_zero(self) -> bool:
        return self.lo > 0 or self.hi < 0

    def as_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "excludes_zero": self.excludes_zero}


def bootstrap_ci(
    values: np.ndarray, *, n_boot: int = 2000, seed: int = 0, level: float = 0.95
) -> tuple[np.ndarray, np.ndarray] | tuple[float, float]:
    """Percentile bootstrap CI of the mean of ``values`` over its first axis (prompts): the
    ``(1 - level) / 2`` and ``(1 + level) / 2`` quantiles of the means of ``n_boot`` resamples with
    replacement (the same resamples for every column of a 2-D ``values``). One value gives ``(v, v)``."""
    v = np.asarray(values, dtype=np.float64)
    if v.shape[0] < 2:
        lo = hi = v.mean(0)
    else:
        idx = np.random.default_rng(seed).integers(0, v.shape[0], size=(int(n_boot), v.shape[0]))
        means = v[idx].mean(1)
        lo, hi = np.quantile(means, [(1 - level) / 2, (1 + level) / 2], axis=0)
        # A constant sample's quantiles may differ from it by rounding: pin them to the sample.
        const = np.ptp(v, axis=0) == 0
        lo, hi = np.where(const, v[0], lo), np.where(const, v[0], hi)
    if v.ndim == 1:
        return float(lo), float(hi)
    return np.asarray(lo), np.asarray(hi)


def hierarchical_ci(
    values: np.ndarray, *, n_boot: int = 2000, seed: int = 0, level: float = 0.95
) -> tuple[float, float]:
    """Two-level percentile bootstrap CI of the grand mean of ``values`` ``(P, K)`` (prompts x random
    draws: seeds, layer orders, OU paths): each resample draws ``P`` prompts and, independently, ``K``
    draws with replacement, and averages the chosen cells. The prompts are resampled exactly as
    :func:`bootstrap_ci` does with the same ``seed``, so when the draws do not vary (or ``K = 1``) the
    interval is the prompt-only one (to rounding); when they vary it also holds the draws' spread."""
    v = np.asarray(values, dtype=np.float64)
    if v.ndim == 1:
        v = v[:, None]
    P, K = v.shape
    if P < 2 and K < 2:
        m = float(v.mean())
        return m, m
    B = int(n_boot)
    pidx = np.random.default_rng(seed).integers(0, P, size=(B, P)) if P > 1 else np.zeros((B, 1), dtype=int)
    kidx = np.random.default_rng([seed, 1]).integers(0, K, size=(B, K))
    counts = np.zeros((B, K))
    np.add.at(counts, (np.arange(B)[:, None], kidx), 1.0)
    per = v @ (counts / K).T  # (P, B): each prompt's mean over the resampled draws
    means = per[pidx, np.arange(B)[:, None]].mean(1)
    lo, hi = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    if np.ptp(v) == 0:
        lo = hi = v.flat[0]
    return float(lo), float(hi)


def statistic(ds: xr.Dataset, variant: str, measure: str, how: str) -> np.ndarray:
    """Per prompt: ``how = "depth_mean"`` (mean over depths 1..L), ``"final"`` (depth L) or
    ``"one_minus_depth_mean"`` (1 minus the depth mean)."""
    x = ds[measure].sel(variant=variant).values
    if how == "final":
        return x[:, -1]
    m = x[:, 1:].mean(1)
    return 1.0 - m if how == "one_minus_depth_mean" else m


#: The split-half control: pseudo-variant -> (family, half). Each names one half of the family's
#: draws, split at random (:func:`split_halves`); ``half1 - half2`` pairs draw ``j`` of one half with
#: draw ``j`` of the other.
HALVES = {"shuffled_half1": ("shuffled", 0), "shuffled_half2": ("shuffled", 1)}
#: The split-half control needs this many draws in its family (10 pairs at least: a percentile
#: bootstrap over fewer pairs has no spread to speak of).
MIN_SPLIT_DRAWS = 20


def split_halves(K: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Two disjoint random halves of ``0..K-1``, ``K // 2`` indices each (one index left out when ``K`` is
    odd). At random, not first and second half: the orders are listed lexicographically when all
    ``L! - 1`` are run, and a fixed split would then compare orders that begin with different layers."""
    p = np.random.default_rng([int(seed), 2]).permutation(int(K))
    h = int(K) // 2
    return p[:h], p[h : 2 * h]


def draws_of(ds: xr.Dataset, variant: str, measure: str, how: str, *, seed: int = 0) -> np.ndarray:
    """``(P, K)``: the statistic of each draw of a family variant (``K = 1``: the variant itself); for a
    pseudo-variant of :data:`HALVES`, the draws of that half of the family (``seed``: :func:`split_halves`)."""
    if variant in HALVES:
        family, half = HALVES[variant]
        d = draws_of(ds, family, measure, how)
        return d[:, split_halves(d.shape[1], seed)[half]]
    prefix = FAMILIES.get(variant)
    drawn = members(ds.variant.values.tolist(), prefix) if prefix else []
    if not drawn:
        return statistic(ds, variant, measure, how)[:, None]
    return np.stack([statistic(ds, v, measure, how) for v in drawn], 1)


#: (group, a, b, measure, statistic) of every comparison printed.
COMPARISONS: list[tuple[str, str, str, str, str]] = [
    *[
        ("baseline", "flow", b, m, "depth_mean")
        for b in ("no_move", "contraction", "random", "random_matched", "flow_1step", "gf")
        for m in ("cos", "spearman")
    ],
    ("depth", "flow", "shuffled", "cos", "depth_mean"),
    ("depth", "flow", "shuffled", "spearman", "depth_mean"),
    ("depth", "shuffled", "", "cos_flow", "one_minus_depth_mean"),
    ("depth", "flow", "reuse", "cos", "depth_mean"),
    ("depth", "flow", "smooth", "cos", "depth_mean"),
    ("depth", "flow", "smooth", "spearman", "depth_mean"),
    ("depth", "flow", "ou", "cos", "depth_mean"),
    ("depth", "flow", "ou", "spearman", "depth_mean"),
    ("control", "control_flow", "control_shuffled", "cos", "depth_mean"),
    ("control", "control_shuffled", "", "cos_flow", "one_minus_depth_mean"),
    # The split-half control: two random halves of the layer orders against each other. Its expected
    # value is 0 (the orders are exchangeable), but each half's mean carries its draws' noise, so only
    # an interval that holds the draw variance contains 0: a prompt-only CI excludes it (it can fail).
    ("control", "shuffled_half1", "shuffled_half2", "cos", "depth_mean"),
    ("control", "shuffled_half1", "shuffled_half2", "spearman", "depth_mean"),
    *[
        ("ablation", a, "model", m, "final")
        for a in ("flow", *STUDY_ABLATIONS)
        for m in ("mean_inner", "effective_rank", "nn_cosine")
    ],
    *[("ablation", a, "", "cos", "depth_mean") for a in ("flow", *STUDY_ABLATIONS)],
    *[("ablation", a, "flow", "cos", "depth_mean") for a in ("attention_only", "attention_only_no_norm2")],
]

#: Length bands (tokens, special tokens included): ``(label, lowest, highest)``, both ends included.
BANDS: tuple[tuple[str, int, int], ...] = (("2-11", 2, 11), ("12-17", 12, 17), ("18-23", 18, 23), ("24+", 24, 10**9))
#: A band is reported when it holds at least this many prompts.
MIN_BAND = 5


def comparisons(ds: xr.Dataset, *, n_boot: int = 2000, seed: int = 0, bands: bool = True) -> list[Row]:
    """Every comparison of :data:`COMPARISONS` present in ``ds``, with its 95% CI (hierarchical over
    prompts and draws for the families of draws), for all prompts and, with ``bands``, per length band
    of :data:`BANDS` holding at least :data:`MIN_BAND` prompts. The split-half control (:data:`HALVES`)
    is computed when the layer orders number at least :data:`MIN_SPLIT_DRAWS`."""
    variants = set(ds.variant.values.tolist())
    tokens = ds.n_tokens.values
    selections = [("all", np.ones(len(tokens), dtype=bool))]
    if bands:
        for label, lo_t, hi_t in BANDS:
            sel = (tokens >= lo_t) & (tokens <= hi_t)
            if sel.sum() >= MIN_BAND and not sel.all():
                selections.append((label, sel))
    shuffled = members(list(variants), FAMILIES["shuffled"])
    if len(shuffled) >= MIN_SPLIT_DRAWS:
        variants |= set(HALVES)
    rows = []
    for group, a, b, m, how in COMPARISONS:
        if a not in variants or (b and b not in variants):
            continue
        da = draws_of(ds, a, m, how, seed=seed)
        db = draws_of(ds, b, m, how, seed=seed) if b else np.zeros((da.shape[0], 1))
        # (P, K): at most one side is a family of draws, or both are halves of one (draws paired).
        d = da - db
        va, vb = da.mean(1), db.mean(1)
        keep_all = np.isfinite(d).all(1)  # prompts a variant was not run on (gf) hold NaN
        for band, sel in selections:
            keep = keep_all & sel
            if not keep.any():
                continue
            dk = d[keep]
            lo_p, hi_p = bootstrap_ci(dk.mean(1), n_boot=n_boot, seed=seed)
            lo, hi = hierarchical_ci(dk, n_boot=n_boot, seed=seed) if dk.shape[1] > 1 else (lo_p, hi_p)
            rows.append(
                Row(
                    group,
                    a,
                    b,
                    m,
                    how,
                    float(va[keep].mean()),
                    float(vb[keep].mean()),
                    float(dk.mean()),
                    float(lo),
                    float(hi),
                    int(keep.sum()),
                    band,
                    int(dk.shape[1]),
                    float(lo_p),
                    float(hi_p),
                )
            )
    return rows


def order_effect(ds: xr.Dataset, measure: str = "cos") -> np.ndarray:
    """Per layer order ``k``: the mean over prompts of ``flow - shuffled_k`` (depth-mean ``measure``):
    the distribution of the order effect over the orders run."""
    d = draws_of(ds, "flow", measure, "depth_mean")[:, 0:1] - draws_of(ds, "shuffled", measure, "depth_mean")
    return d[np.isfinite(d).all(1)].mean(0)


def spreads(ds: xr.Dataset, measure: str = "cos") -> dict[str, list[float]]:
    """Per family of draws (random seeds, layer orders, reused layers, OU draws): each draw's
    mean over prompts of the depth-mean statistic (their spread is the draws' spread)."""
    out = {}
    for fam, prefix in FAMILIES.items():
        drawn = members(ds.variant.values.tolist(), prefix)
        if drawn:
            out[fam] = [float(statistic(ds, v, measure, "depth_mean").mean()) for v in drawn]
    return out


def path_summary(ds: xr.Dataset) -> dict[str, tuple[float, float, float]]:
    """Weight path length of ``A`` per process family: (mean, min, max) over its draws and prompts."""
    out = {}
    procs = ds.process.values.tolist()
    for fam in ("real", "smooth", "random", "shuffled", "ou", "control"):
        drawn = [p for p in procs if p == fam] + members(procs, fam + "_")
        if drawn:
            v = ds.path_A.sel(process=drawn).values
            out[fam] = (float(v.mean()), float(v.min()), float(v.max()))
    return out


# ---------------------------------------------------------------------------------------------
# Storage and figures.
# ---------------------------------------------------------------------------------------------

STUDY_STORE = "study.zarr"

#: Variants drawn per figure panel.
PANELS = (
    (
        "flow, baselines and depth tests",
        ("model", "flow", "flow_1step", "no_move", "contraction", "random", "random_matched", "smooth")
        + ("shuffled", "reuse", "ou", "gf"),
    ),
    ("ablations of the real network", ("model", "flow", *STUDY_ABLATIONS)),
)


def save_study(ds: xr.Dataset, rows: list[Row], out: str | Path, *, figures: bool = True) -> list[Path]:
    """Write ``study.zarr`` (the dataset, with the comparisons as a JSON attribute),
    ``comparisons.json`` and, with ``figures``, ``figures/study_<measure>.png`` into the new folder ``out``."""
    out = Path(out)
    ds = ds.copy()
    ds.attrs["comparisons"] = json.dumps([r.as_dict() for r in rows])
    # Written whole or not at all, never through a link, and marked as attnflow's with a manifest
    # (kind "study") like every folder attnflow writes.
    with atomic_folder(out) as tmp:
        ds.to_zarr(tmp / STUDY_STORE, mode="w-", zarr_format=2, consolidated=True)  # consolidated (issue 43)
        (tmp / "comparisons.json").write_text(json.dumps([r.as_dict() for r in rows], indent=1))
        if figures:
            plot_study(ds, tmp / "figures")
        write_manifest(tmp, kind="study")
    written = [out / STUDY_STORE, out / "comparisons.json", out / "manifest.json"]
    if figures:
        written += sorted((out / "figures").glob("*.png"))
    return written


def load_study(path: str | Path) -> xr.Dataset:
    """The dataset of a folder written by ``attnflow hf study``."""
    p = Path(path) / STUDY_STORE
    if not p.is_dir():
        raise InputError(f"no {STUDY_STORE} in {str(path)!r}: not a folder written by 'attnflow hf study'")
    return xr.open_zarr(p, consolidated=False).load()


def plot_study(ds: xr.Dataset, folder: str | Path, *, n_boot: int = 1000) -> list[Path]:
    """One figure per measure: its mean over prompts against depth, with a bootstrap 95% band, for
    the flow, baselines and depth tests (left) and the ablations (right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    depth = ds.depth.values
    variants = ds.variant.values.tolist()
    paths = []
    for m in MEASURES:
        fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
        for ax, (title, names) in zip(axes, PANELS):
            # 11 curves on the left: the default cycle has 10 colours.
            ax.set_prop_cycle(color=[plt.get_cmap("tab20")(i) for i in range(20)])
            for v in names:
                if v not in variants:
                    continue
                x = ds[m].sel(variant=v).values
                x = x[np.isfinite(x).all(1)]
                if len(x) == 0:
                    continue
                band = np.array(bootstrap_ci(x, n_boot=n_boot)).T
                style = {"color": "k", "lw": 2.2} if v == "model" else {}
                (line,) = ax.plot(depth, x.mean(0), marker="o", ms=3, label=v, **style)
                ax.fill_between(depth, band[:, 0], band[:, 1], color=line.get_color(), alpha=0.18, lw=0)
            ax.set_title(title, fontsize=10)
            ax.set_xlabel("depth l (layers)")
            ax.legend(fontsize=7, ncol=2)
            ax.grid(alpha=0.3)
        axes[0].set_ylabel(f"{ds[m].attrs.get('long_name', m)} (mean, 95% CI)")
        fig.suptitle(
            f"{ds.attrs.get('architecture', '')}: {ds[m].attrs.get('long_name', m)} over {ds.sizes['prompt']} prompts",
            fontsize=11,
        )
        fig.tight_layout()
        p = folder / f"study_{m}.png"
        fig.savefig(p, dpi=FIGURE_DPI)
        plt.close(fig)
        paths.append(p)
    return paths
