"""Causal ablations of a real network, through its own ``transformers`` modules (forward hooks).

Each block of a transformer adds an attention sub-block and an MLP sub-block to its residual
stream, and normalises. An ablation replaces, in every block, the output of one of them by zero
(the output projection's forward hook returns zeros, so the residual is passed on unchanged) or
makes a norm the identity (its forward hook returns its input); nothing is re-implemented:

* ``none``: the hooks run and change nothing (reproduces the model's hidden states);
* ``attention_only``: the MLPs removed; ``mlp_only``: the attention removed;
* ``no_norm2``: the norm after the attention sub-block's residual, before or around the MLP,
  made the identity (BERT: ``output.LayerNorm``, the one after the MLP that feeds the next block;
  GPT-2/Llama: ``ln_2``/``post_attention_layernorm``, the one before the MLP);
* ``attention_only_no_norm2``: both.

Module names per family: :data:`SUBMODULES`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
import torch

from attnflow.core.errors import InputError
from attnflow.hf.importer import HFLayers, blocks

#: ablation -> the parts it removes ("attention", "mlp", "norm2").
ABLATIONS: dict[str, tuple[str, ...]] = {
    "none": (),
    "attention_only": ("mlp",),
    "mlp_only": ("attention",),
    "no_norm2": ("norm2",),
    "attention_only_no_norm2": ("mlp", "norm2"),
}

#: model family -> (attention output projection, MLP output projection, second norm), dotted names in a block.
SUBMODULES: dict[str, tuple[str, str, str]] = {
    "bert": ("attention.output.dense", "output.dense", "output.LayerNorm"),
    "roberta": ("attention.output.dense", "output.dense", "output.LayerNorm"),
    "gpt2": ("attn.c_proj", "mlp.c_proj", "ln_2"),
    "llama": ("self_attn.o_proj", "mlp.down_proj", "post_attention_layernorm"),
    "mistral": ("self_attn.o_proj", "mlp.down_proj", "post_attention_layernorm"),
    "qwen2": ("self_attn.o_proj", "mlp.down_proj", "post_attention_layernorm"),
}


def _zero(module, args, out):
    return torch.zeros_like(out)


def _identity(module, args, out):
    return args[0]


def _keep(module, args, out):
    return None  # a hook that leaves the output alone: ablating nothing still runs the machinery


@contextlib.contextmanager
def ablated(model, ablation: str) -> Iterator[None]:
    """Within the block, ``model`` runs with ``ablation`` (one of :data:`ABLATIONS`) applied to every block."""
    if ablation not in ABLATIONS:
        raise InputError(f"unknown ablation {ablation!r}; choose one of {', '.join(ABLATIONS)}")
    kind = getattr(model.config, "model_type", "?")
    if kind not in SUBMODULES:
        raise InputError(f"ablations are defined for {', '.join(SUBMODULES)}; this model is {kind!r}")
    names = dict(zip(("attention", "mlp", "norm2"), SUBMODULES[kind]))
    parts = ABLATIONS[ablation]
    handles = []
    try:
        for blk in blocks(model):
            for part, name in names.items():
                mod = blk.get_submodule(name)
                hook = _keep if part not in parts else (_identity if part == "norm2" else _zero)
                handles.append(mod.register_forward_hook(hook))
        yield
    finally:
        for h in handles:
            h.remove()


def hidden_states(model, input_ids: torch.Tensor, ablation: str = "none") -> list[torch.Tensor]:
    """The ``L + 1`` hidden states (``output_hidden_states``, batch 1) of the ablated model, ``(N, d)`` each."""
    with ablated(model, ablation), torch.no_grad():
        out = model(input_ids=input_ids, output_hidden_states=True)
    return [h[0] for h in out.hidden_states]


def ablated_positions(model, layers: HFLayers, input_ids: torch.Tensor, ablation: str) -> np.ndarray:
    """The sphere positions ``(L+1, N, d)`` of :func:`attnflow.hf.flow.real_positions` (the points
    ``P z / |P z|`` the norms see) in the ablated model."""
    from attnflow.hf.flow import real_positions

    with ablated(model, ablation):
        X, _ = real_positions(model, layers, input_ids)
    return X
