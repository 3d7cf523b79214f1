"""The token flow of a prompt through a checkpoint's layers, next to what the model itself does.

Real positions: at depth ``l`` (``l = 0..L``) the sphere point ``P z / |P z|`` seen by the norm
that feeds layer ``l`` (``l = L``: the final norm), ``z`` that norm's input. The simulated flow
starts from the real positions at depth 0 and runs the ``mha`` field of
:func:`~attnflow.hf.sphere.on_sphere` for one unit of time per layer. Attention only: the MLP
blocks (and, in post-norm models, the norms after each sub-block) have no counterpart in the flow.

Each depth is compared four ways (:class:`Comparison`): the cumulative flow from depth 0; the
one-layer prediction restarted from the model's real positions at the depth before; and, as
baselines, not moving at all and the same two runs with random heads of the same shapes and norms
(:func:`~attnflow.hf.measures.random_heads`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import xarray as xr

from attnflow.analysis.diagnostics import count_clusters
from attnflow.config import defaults
from attnflow.core.errors import Hint, InputError, NumericalError
from attnflow.core.heads import Heads
from attnflow.core.trajectory import Trajectory
from attnflow.dynamics.fields import velocity
from attnflow.hf.importer import (
    HFImportError,
    HFLayers,
    blocks,
    check_model_folder,
    extract,
    load_model,
    no_answers,
    norm_modules,
)
from attnflow.hf.measures import head_activity, measure_path, random_heads, relative_jumps
from attnflow.hf.sphere import on_sphere, value_factors
from attnflow.io.metadata import describe
from attnflow.io.zarr_guard import open_store
from attnflow.kernels.dispatch import KernelOptions
from attnflow.schemes.integrators import INTEGRATORS
from attnflow.solve.controllers import FixedState
from attnflow.solve.loop import Attempt, StepFailed, Trial, integrate
from attnflow.solve.saveat import SaveAt
from attnflow.solve.simulation import simulate
from attnflow.weights.processes import Layers

#: Bin edges of the pairwise inner-product histograms.
HIST_EDGES = np.linspace(-1.0, 1.0, 41)

#: name -> (long_name, units, description) of the variables of :meth:`Comparison.to_xarray`.
COMPARISON_VARIABLES: dict[str, tuple[str, str, str]] = {
    "layer": ("depth l", "1", "depth l = 0..L: the input of block l (l = L: the last block's output)"),
    "block": ("block index", "1", "attention block 0..L-1 (one unit of time of the flow each)"),
    "token": ("token index i", "1", "position i of the token in the prompt"),
    "dim": ("coordinate index", "1", "coordinate 0..d-1 of the hidden state"),
    "bin": ("inner product <x_i, x_j>", "1", "centre of a bin of pairwise inner products on [-1, 1]"),
    "real_x": ("real position", "1", "the model's layer-normed hidden state of token i at depth l, on the sphere"),
    "sim_x": ("simulated position", "1", "the flow's position of token i at time l, on the sphere"),
    "cosine": ("cosine <sim_i, real_i>", "1", "inner product of simulated and real positions of token i"),
    "cosine_mean": ("mean cosine", "1", "mean over tokens of <sim_i, real_i>"),
    "hist_real": ("pair fraction (model)", "1", "fraction of pairs i < j whose <x_i, x_j> falls in the bin"),
    "hist_sim": ("pair fraction (flow)", "1", "fraction of pairs i < j whose <x_i, x_j> falls in the bin"),
    "clusters_real": ("clusters (model)", "1", "connected components of <x_i, x_j> > 1 - cluster_eps"),
    "clusters_sim": ("clusters (flow)", "1", "connected components of <x_i, x_j> > 1 - cluster_eps"),
    "input_ids": ("token id", "1", "the tokenizer's id of token i"),
    "radius": ("residual stream radius r_l", "1", "mean |P h_i| of the residual stream block l adds to"),
}


@dataclass
class Comparison:
    """Simulated vs real token positions at depths ``l = 0..L`` (``(L+1, N, d)`` each), with
    ``cosine[l, i] = <sim_i, real_i>``, pairwise inner-product histograms ``(L+1, bins)`` (fractions
    of the pairs ``i < j``), cluster counts ``(L+1,)`` and the radii ``r_l`` used for the values."""

    real: np.ndarray
    sim: np.ndarray
    ids: np.ndarray
    radius: np.ndarray
    cluster_eps: float
    tokens: list[str] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    #: ``(L+1, N, d)``: one layer of flow from the real positions at depth ``l - 1`` (``[0]`` = real[0]).
    restart: np.ndarray | None = None
    #: the cumulative flow and the restarted one with random heads of the same shapes (baselines).
    rand: np.ndarray | None = None
    rand_restart: np.ndarray | None = None
    #: per layer and head (``(L, H, ...)``) at the real positions: see :class:`~attnflow.hf.measures.HeadActivity`.
    attention: np.ndarray | None = None
    head_speed: np.ndarray | None = None
    head_collapse: np.ndarray | None = None
    head_log_mobility: np.ndarray | None = None
    total_speed: np.ndarray | None = None
    #: scale-free jumps of ``A_h`` and ``V_h`` across depth, real and random heads ``(L-1,)``.
    path_A: np.ndarray | None = None
    path_V: np.ndarray | None = None
    path_A_random: np.ndarray | None = None
    path_V_random: np.ndarray | None = None
    #: the folded heads of the flow and their value factors (for compact storage; not in the dataset).
    heads: tuple[Layers, list] | None = None

    @property
    def cosine(self) -> np.ndarray:
        return np.einsum("lnd,lnd->ln", self.sim, self.real)

    @staticmethod
    def histogram(x: np.ndarray) -> np.ndarray:
        """Fractions of the pairs ``i < j`` whose ``<x_i, x_j>`` falls in each bin of :data:`HIST_EDGES`."""
        iu = np.triu_indices(x.shape[-2], 1)
        out = [np.histogram(np.clip((s @ s.T)[iu], -1, 1), bins=HIST_EDGES)[0] for s in x]
        return np.array(out, dtype=np.float64) / max(1, len(iu[0]))

    def clusters(self, x: np.ndarray) -> np.ndarray:
        return np.array([count_clusters(torch.from_numpy(s), self.cluster_eps) for s in x])

    def to_xarray(self) -> xr.Dataset:
        """Dims ``layer`` (depth ``0..L``), ``block`` (``0..L-1``), ``token``, ``dim``, ``bin``."""
        centers = 0.5 * (HIST_EDGES[1:] + HIST_EDGES[:-1])
        cos = self.cosine
        data = {
            "real_x": (("layer", "token", "dim"), self.real),
            "sim_x": (("layer", "token", "dim"), self.sim),
            "cosine": (("layer", "token"), cos),
            "cosine_mean": (("layer",), cos.mean(-1)),
            "hist_real": (("layer", "bin"), self.histogram(self.real)),
            "hist_sim": (("layer", "bin"), self.histogram(self.sim)),
            "clusters_real": (("layer",), self.clusters(self.real)),
            "clusters_sim": (("layer",), self.clusters(self.sim)),
            "input_ids": (("token",), self.ids.astype(np.int64)),
            "radius": (("block",), self.radius),
        }
        coords = {
            "layer": np.arange(self.real.shape[0]),
            "block": np.arange(len(self.radius)),
            "token": np.arange(self.real.shape[1]),
            "dim": np.arange(self.real.shape[2]),
            "bin": centers,
        }
        attrs = {"cluster_eps": self.cluster_eps, **{f"hf_{k}": _attr(v) for k, v in self.meta.items()}}
        if self.tokens:
            attrs["tokens"] = json.dumps(self.tokens)  # a JSON string attribute: no string arrays in the store
        data.update(self.analysis_variables())
        return describe(xr.Dataset(data, coords=coords, attrs=attrs), COMPARISON_VARIABLES)

    def analysis_variables(self) -> dict[str, tuple[tuple[str, ...], Any]]:
        """The baselines, clustering measures, head activity and weight path (when computed)."""
        out: dict[str, tuple[tuple[str, ...], Any]] = {}
        if self.restart is None or self.rand is None or self.rand_restart is None:
            return out
        lay, blk = ("layer",), ("block",)
        out["cos_flow"] = (lay, _cos(self.sim, self.real))
        out["cos_nomove"] = (lay, _cos(np.broadcast_to(self.real[:1], self.real.shape), self.real))
        out["cos_random"] = (lay, _cos(self.rand, self.real))
        prev = np.concatenate([self.real[:1], self.real[:-1]])
        out["cos_restart"] = (lay, _cos(self.restart, self.real))
        out["cos_restart_nomove"] = (lay, _cos(prev, self.real))
        out["cos_restart_random"] = (lay, _cos(self.rand_restart, self.real))
        out["restart_x"] = (("layer", "token", "dim"), self.restart)
        out["random_x"] = (("layer", "token", "dim"), self.rand)
        out["random_restart_x"] = (("layer", "token", "dim"), self.rand_restart)
        for who, X in (("real", self.real), ("sim", self.sim), ("random", self.rand)):
            for name, v in measure_path(X).items():
                out[f"{name}_{who}"] = (lay, v)
        if self.attention is not None:
            out["attention"] = (("block", "head", "token", "key"), self.attention.astype(np.float32))
            out["head_speed"] = (("block", "head"), self.head_speed)
            out["head_collapse"] = (("block", "head"), self.head_collapse)
            out["head_log_mobility"] = (("block", "head"), self.head_log_mobility)
            out["total_speed"] = (blk, self.total_speed)
        if self.path_A is not None:
            for name in ("path_A", "path_V", "path_A_random", "path_V_random"):
                out[name] = (("jump",), getattr(self, name))
        return out


def _cos(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.einsum("lnd,lnd->ln", a, b).mean(-1)


def _attr(v: Any) -> Any:
    return "none" if v is None else (int(v) if isinstance(v, bool) else v)


def real_positions(model, layers: HFLayers, input_ids: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """``(X, r)``: the real sphere positions ``(L+1, N, d)`` of one forward pass and the residual
    stream radius ``r_l = mean_i |P h_i|`` each attention block adds to (``(L,)``; pre-norm models.
    Post-norm models need none, :func:`~attnflow.hf.sphere.fold_norm` pulls back exactly: ``r = 1``)."""
    mods, pre_norm = norm_modules(model, blocks(model))
    ins: list[torch.Tensor | None] = [None] * len(mods)
    hooks = []

    def keep(l: int):
        def hook(mod, args, out) -> None:  # returning None leaves the module's output alone
            ins[l] = args[0].detach()[0]

        return hook

    for l, m in enumerate(mods):
        hooks.append(m.register_forward_hook(keep(l)))
    try:
        with torch.no_grad():
            model(input_ids=input_ids)
    finally:
        for h in hooks:
            h.remove()
    seen = [t for t in ins if t is not None]
    if len(seen) != len(mods):
        raise InputError(f"{len(mods) - len(seen)} of the model's layer norms did not run in the forward pass")
    X = np.stack([layers.norms[l].to_sphere(seen[l]).numpy() for l in range(len(mods))])
    _check_finite(model, X)
    if not pre_norm:
        return X, np.ones(layers.L)
    r = []
    for l in range(layers.L):
        s = seen[l].to(torch.float64)
        if layers.norms[l].kind == "layer":
            s = s - s.mean(-1, keepdim=True)
        r.append(float(torch.linalg.vector_norm(s, dim=-1).mean()))
    return X, np.array(r)


def _check_finite(model, X: np.ndarray) -> None:
    """A forward pass whose hidden states are not finite (a weight of 6e37 from one flipped bit overflows)
    means damaged or unusable weights: said in one sentence, before anything is measured or written."""
    bad = ~np.isfinite(X.reshape(X.shape[0], -1)).all(axis=1)
    if bad.any():
        big = max(float(p.detach().abs().max()) for p in model.parameters() if p.numel())
        raise HFImportError(
            f"the model's own forward pass gives non-finite hidden states from layer {int(np.argmax(bad))} on "
            f"(its largest weight is {big:.3g} in size): the model folder's weights are damaged or unusable."
        )


@dataclass(frozen=True)
class _ConstantField:
    """The ``mha`` field of fixed heads, in the form the explicit steppers take."""

    heads: Heads
    a: torch.Tensor
    w: torch.Tensor
    model: str = "mha"
    options: KernelOptions | None = None

    def __call__(self, t: float, x: torch.Tensor) -> torch.Tensor:
        return velocity(x, self.heads, model="mha")

    def heads_at(self, t: float) -> Heads:
        return self.heads


def _attempt(step: Callable[..., torch.Tensor], f: _ConstantField) -> Attempt:
    """A fixed step of ``f`` as the loop's trial step (always accepted)."""
    return lambda t, y, h, first: Trial(step(f, t, y, h), 0.0)


def flow_through(x0: np.ndarray, process: Layers, steps_per_layer: int, method: str = "euler") -> np.ndarray:
    """Positions ``(L+1, N, d)`` of the ``mha`` flow of ``process`` from ``x0`` at ``t = 0, 1, ..., L``
    (the stepper and the one loop of :func:`~attnflow.solve.simulation.simulate`, without its
    diagnostics: :func:`~attnflow.solve.loop.integrate` with fixed steps, one layer at a time)."""
    if method not in INTEGRATORS:
        raise InputError(
            f"the hf flow takes an explicit method, one of {', '.join(INTEGRATORS)}; got {method!r}",
            hint=Hint("method"),
        )
    step = INTEGRATORS[method].step
    x = torch.as_tensor(np.asarray(x0), dtype=torch.float64)
    n, dt = x.shape[0], 1.0 / steps_per_layer
    out = [x.numpy().copy()]
    for l, heads in enumerate(process.layers):
        f = _ConstantField(heads.to(dtype=torch.float64), torch.full((n,), 1.0 / n, dtype=torch.float64), torch.ones(1))
        try:
            x = integrate(
                _attempt(step, f), x, t=float(l),
                control=FixedState(float(l), dt, steps_per_layer), saves=SaveAt(every=steps_per_layer).start(float(l)),
            )  # fmt: skip
        except StepFailed as e:
            raise NumericalError(
                f"the flow through layer {l} failed at t={e.t:.6g}: {e.why}; use more steps per layer", hint=Hint("dt")
            ) from None
        out.append(x.numpy().copy())
    return np.stack(out)


def check_prompt(ids: list[int], layers: HFLayers, vocab: int) -> None:
    """Refuse, with one sentence, token ids the model cannot take (``ValueError``)."""
    bad = [i for i in ids if not 0 <= i < vocab]
    if not ids or bad:
        raise InputError(f"token ids must be in [0, {vocab}); got {bad or 'no ids'}")
    if len(ids) < 2:
        raise InputError("the prompt needs at least two tokens")
    limit = layers.meta.max_positions
    if limit is not None and len(ids) > limit:
        raise InputError(
            f"the prompt has {len(ids)} tokens, more than the {limit} positions {layers.meta.architecture} was "
            "trained with; shorten it"
        )
    window = layers.meta.sliding_window
    if window is not None and len(ids) > int(window):
        raise InputError(f"the prompt has {len(ids)} tokens, more than the sliding window ({window}) the flow ignores")


def run_prompt(
    path_or_name: str,
    ids: list[int] | None = None,
    *,
    text: str | None = None,
    special_tokens: bool = True,
    steps_per_layer: int = 8,
    method: str = "euler",
    cluster_eps: float = defaults.CLUSTER_EPS,
    use_radius: bool = True,
    baseline_seed: int = 0,
    local_files_only: bool = True,
    progress=None,
) -> tuple[Trajectory, Comparison]:
    """Simulate the prompt's token flow through the checkpoint's layers and compare with the model.

    Give ``ids`` (token ids) or ``text`` (needs the tokenizer saved with the model; the special
    tokens the model was trained with, e.g. BERT's ``[CLS]`` and ``[SEP]``, are added unless
    ``special_tokens=False``). Returns the simulated :class:`~attnflow.io.trajectory.Trajectory`
    (saved at ``t = 0, 1, ..., L``) and the :class:`Comparison` with the real model, its baselines
    (random heads drawn with ``baseline_seed``) and what each head does at the real positions.
    """
    if (ids is None) == (text is None):
        raise InputError("give either token ids or a text prompt, not both or neither")
    if text is not None and not text.strip():
        raise InputError("the text prompt is empty; give at least one word", hint=Hint("text"))
    if int(steps_per_layer) < 1:
        raise InputError(f"steps per layer must be a positive integer; got {steps_per_layer}")
    model = load_model(path_or_name, local_files_only=local_files_only)
    if model.config.model_type == "vit":
        raise InputError(
            "'hf run' follows the tokens of a text prompt; a ViT has no token ids (use 'hf verify' for it)"
        )
    tokens: list[str] = []
    if text is not None:
        ids, tokens = tokenize(path_or_name, text, special_tokens=special_tokens, local_files_only=local_files_only)
    assert ids is not None  # one of ids and text was given (checked above)
    ids = [int(i) for i in ids]
    layers = extract(model, source=str(path_or_name))
    check_prompt(ids, layers, int(model.config.vocab_size))
    X, r = real_positions(model, layers, torch.tensor([ids]))
    pre = layers.meta.pre_norm
    flow = on_sphere(layers, radius=r if use_radius else 1.0)
    L = layers.L
    config = {
        "name": f"hf-{layers.meta.model_type}",
        "hf": {
            **layers.meta.as_dict(),
            "input_ids": ids,
            "steps_per_layer": int(steps_per_layer),
            "radius": r.tolist() if (use_radius and pre) else None,
            "values": "divided by the stream radius r_l" if pre else "pulled back through the norm (exact)",
        },
        "weights": {"process": "hf_layers"},
        "model": "mha",
    }
    if method not in INTEGRATORS:
        raise InputError(f"the hf flow takes an explicit method, one of {', '.join(INTEGRATORS)}; got {method!r}")
    traj = simulate(
        X[0],
        flow,
        model="mha",
        t_end=float(L),
        dt=1.0 / steps_per_layer,
        method=method,
        save_every=int(steps_per_layer),
        cluster_eps=cluster_eps,
        dtype=torch.float64,
        progress=progress,
        config=config,
    )
    g = torch.Generator().manual_seed(int(baseline_seed))
    rand = Layers([random_heads(h, g) for h in flow.layers], t_end=float(L))
    spl = int(steps_per_layer)

    def restart(process: Layers) -> np.ndarray:
        one = [flow_through(X[l], Layers([process.layers[l]], t_end=1.0), spl, method)[-1] for l in range(L)]
        return np.stack([X[0], *one])

    acts = [head_activity(X[l], flow.layers[l]) for l in range(L)]
    dense = lambda P: [h.A for h in P.layers]
    values = lambda P: [h.values for h in P.layers]
    cmp = Comparison(
        real=X,
        sim=traj.x,
        ids=np.array(ids),
        radius=r if (use_radius or not pre) else np.ones(L),
        cluster_eps=cluster_eps,
        tokens=tokens,
        meta=layers.meta.as_dict(),
        restart=restart(flow),
        rand=flow_through(X[0], rand, spl, method),
        rand_restart=restart(rand),
        attention=np.stack([a.attention for a in acts]),
        head_speed=np.stack([a.speed for a in acts]),
        head_collapse=np.stack([a.collapse for a in acts]),
        head_log_mobility=np.stack([a.log_mobility for a in acts]),
        total_speed=np.array([a.total_speed for a in acts]),
        path_A=relative_jumps(dense(flow)),
        path_V=relative_jumps(values(flow)),
        path_A_random=relative_jumps(dense(rand)),
        path_V_random=relative_jumps(values(rand)),
        heads=(
            flow,
            value_factors(
                layers, r.tolist() if use_radius and isinstance(r, np.ndarray) else (r if use_radius else 1.0)
            ),
        ),
    )
    return traj, cmp


def tokenize(
    path_or_name: str, text: str, *, special_tokens: bool = True, local_files_only: bool = True
) -> tuple[list[int], list[str]]:
    """``(ids, token strings)`` of ``text`` with the tokenizer saved with the model (a
    sentence-transformers folder's own tokenizer included); ``special_tokens`` adds the ones the
    model was trained with (BERT: ``[CLS] ... [SEP]``)."""
    from transformers import AutoTokenizer

    src = str(path_or_name)
    if Path(src).exists() or Path(src).is_symlink():
        try:
            src = str(check_model_folder(src))  # scanned, and refused if it names custom code
        except HFImportError as e:
            raise InputError(str(e)) from e
        local_files_only = True
    try:
        with no_answers():
            tok = AutoTokenizer.from_pretrained(src, local_files_only=local_files_only, trust_remote_code=False)
    except (OSError, ValueError, TypeError) as e:
        raise InputError(
            f"text needs the tokenizer saved with the model, and {str(path_or_name)!r} has none; "
            "pass token ids (ids=[1, 2, 3]) instead",
            hint=Hint("ids"),
        ) from e
    ids = tok(text, add_special_tokens=special_tokens)["input_ids"]
    names = tok.convert_ids_to_tokens(ids)
    return list(ids), [names] if isinstance(names, str) else list(names)


COMPARISON = "hf_comparison.zarr"


def load_comparison(path: str | os.PathLike) -> xr.Dataset:
    """The comparison dataset of a folder written by ``attnflow hf run``."""
    p = Path(path) / COMPARISON
    if not p.exists():
        raise FileNotFoundError(f"no {COMPARISON} in {str(path)!r}: not a folder written by 'attnflow hf run'")
    return open_store(p).load()
