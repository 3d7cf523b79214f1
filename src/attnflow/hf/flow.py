"""The token flow of a prompt through a checkpoint's layers, next to what the model itself does.

Real positions: at depth ``l`` (``l = 0..L``) the sphere point ``P h / |P h|`` seen by the norm
that feeds layer ``l`` (``l = L``: the final norm), ``h`` the residual stream there. The simulated
flow starts from the real positions at depth 0 (the input embeddings, projected to the sphere)
and runs the ``mha`` field of :func:`~attnflow.hf.sphere.on_sphere` for one unit of time per layer.
Attention only: the MLP blocks of the real model have no counterpart in the flow.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import xarray as xr

from attnflow.analysis.diagnostics import count_clusters
from attnflow.hf.importer import HFLayers, blocks, extract, load_model, norm_modules
from attnflow.hf.sphere import on_sphere
from attnflow.io.trajectory import Trajectory
from attnflow.solve.simulate import simulate

#: Bin edges of the pairwise inner-product histograms.
HIST_EDGES = np.linspace(-1.0, 1.0, 41)


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
        coords = {"layer": np.arange(self.real.shape[0]), "bin": centers}
        attrs = {"cluster_eps": self.cluster_eps, **{f"hf_{k}": _attr(v) for k, v in self.meta.items()}}
        if self.tokens:
            attrs["tokens"] = json.dumps(self.tokens)  # a JSON string attribute: no string arrays in the store
        return xr.Dataset(data, coords=coords, attrs=attrs)


def _attr(v: Any) -> Any:
    return "none" if v is None else (int(v) if isinstance(v, bool) else v)


def real_positions(model, layers: HFLayers, input_ids: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """``(X, r)``: the real sphere positions ``(L+1, N, d)`` of one forward pass and the residual
    stream radius ``r_l = mean_i |P h_i|`` each attention block adds to (``(L,)``)."""
    mods, pre_norm = norm_modules(model, blocks(model))
    ins: list[torch.Tensor | None] = [None] * len(mods)
    outs: list[torch.Tensor | None] = [None] * len(mods)
    hooks = []

    def keep(l: int):
        def hook(mod, args, out) -> None:  # returning None leaves the module's output alone
            ins[l], outs[l] = args[0].detach()[0], out.detach()[0]

        return hook

    for l, m in enumerate(mods):
        hooks.append(m.register_forward_hook(keep(l)))
    try:
        with torch.no_grad():
            model(input_ids=input_ids)
    finally:
        for h in hooks:
            h.remove()
    seen_in = [t for t in ins if t is not None]
    seen_out = [t for t in outs if t is not None]
    if len(seen_in) != len(mods) or len(seen_out) != len(mods):
        raise ValueError(f"{len(mods) - len(seen_in)} of the model's layer norms did not run in the forward pass")
    X = np.stack([layers.norms[l].to_sphere(seen_in[l]).numpy() for l in range(len(mods))])
    # Pre-norm: attention adds to the norm's input h; post-norm (BERT): to the norm's output y.
    stream = seen_in if pre_norm else seen_out
    r = []
    for l in range(layers.L):
        s = stream[l].to(torch.float64)
        if layers.norms[l].kind == "layer":
            s = s - s.mean(-1, keepdim=True)
        r.append(float(torch.linalg.vector_norm(s, dim=-1).mean()))
    return X, np.array(r)


def run_prompt(
    path_or_name: str,
    ids: list[int] | None = None,
    *,
    text: str | None = None,
    steps_per_layer: int = 8,
    method: str = "euler",
    cluster_eps: float = 1e-3,
    use_radius: bool = True,
    local_files_only: bool = True,
    progress=None,
) -> tuple[Trajectory, Comparison]:
    """Simulate the prompt's token flow through the checkpoint's layers and compare with the model.

    Give ``ids`` (token ids) or ``text`` (needs the tokenizer saved with the model). Returns the
    simulated :class:`~attnflow.simulate.Trajectory` (saved at ``t = 0, 1, ..., L``) and the
    :class:`Comparison` with the real model's positions.
    """
    if (ids is None) == (text is None):
        raise ValueError("give either token ids or a text prompt, not both or neither")
    if int(steps_per_layer) < 1:
        raise ValueError(f"steps per layer must be a positive integer; got {steps_per_layer}")
    model = load_model(path_or_name, local_files_only=local_files_only)
    if model.config.model_type == "vit":
        raise ValueError(
            "'hf run' follows the tokens of a text prompt; a ViT has no token ids (use 'hf verify' for it)"
        )
    tokens: list[str] = []
    if text is not None:
        ids, tokens = _tokenize(path_or_name, text, local_files_only)
    assert ids is not None  # one of ids and text was given (checked above)
    ids = [int(i) for i in ids]
    vocab = int(model.config.vocab_size)
    bad = [i for i in ids if not 0 <= i < vocab]
    if not ids or bad:
        raise ValueError(f"token ids must be in [0, {vocab}); got {bad or 'no ids'}")
    if len(ids) < 2:
        raise ValueError("the prompt needs at least two tokens")
    layers = extract(model, source=str(path_or_name))
    window = layers.meta.sliding_window
    if window is not None and len(ids) > int(window):
        raise ValueError(f"the prompt has {len(ids)} tokens, more than the sliding window ({window}) the flow ignores")
    X, r = real_positions(model, layers, torch.tensor([ids]))
    flow = on_sphere(layers, radius=r if use_radius else 1.0)
    L = layers.L
    config = {
        "name": f"hf-{layers.meta.model_type}",
        "hf": {
            **layers.meta.as_dict(),
            "input_ids": ids,
            "steps_per_layer": int(steps_per_layer),
            "radius": r.tolist() if use_radius else None,
        },
        "weights": {"process": "hf_layers"},
        "model": "mha",
    }
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
    cmp = Comparison(
        real=X,
        sim=traj.x,
        ids=np.array(ids),
        radius=r if use_radius else np.ones(L),
        cluster_eps=cluster_eps,
        tokens=tokens,
        meta=layers.meta.as_dict(),
    )
    return traj, cmp


def _tokenize(path_or_name: str, text: str, local_files_only: bool) -> tuple[list[int], list[str]]:
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(path_or_name), local_files_only=local_files_only)
    except (OSError, ValueError, TypeError) as e:
        raise ValueError(
            f"--text needs the tokenizer saved with the model, and {str(path_or_name)!r} has none; "
            "pass token ids with --ids 1,2,3 instead"
        ) from e
    ids = tok(text, add_special_tokens=False)["input_ids"]
    names = tok.convert_ids_to_tokens(ids)
    return list(ids), [names] if isinstance(names, str) else list(names)


COMPARISON = "hf_comparison.zarr"


def load_comparison(path: str | Path) -> xr.Dataset:
    """The comparison dataset of a folder written by ``attnflow hf run``."""
    p = Path(path) / COMPARISON
    if not p.exists():
        raise FileNotFoundError(f"no {COMPARISON} in {str(path)!r}: not a folder written by 'attnflow hf run'")
    return xr.open_zarr(p).load()
