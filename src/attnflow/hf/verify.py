"""Exactness check: our ``mha`` field without ``P_x``, applied to the layer-normed hidden states,
against every layer's own attention output (the output projection's result, bias included)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnflow.dynamics.fields import velocity
from attnflow.hf.importer import HFLayers, blocks, extract, layer_modules, load_model


@dataclass(frozen=True)
class LayerCheck:
    """One layer: ``rel_error = max |ours - theirs| / max |theirs|`` over tokens and coordinates."""

    layer: int
    rel_error: float
    max_abs: float
    tokens: int

    def ok(self, tol: float) -> bool:
        return self.rel_error < tol


def sample_inputs(model, n_tokens: int, seed: int) -> dict[str, torch.Tensor]:
    """Seeded model inputs: random token ids, or random pixels for a vision model."""
    g = torch.Generator().manual_seed(seed)
    cfg = model.config
    if cfg.model_type == "vit":
        size, ch = int(cfg.image_size), int(cfg.num_channels)
        return {"pixel_values": torch.randn(1, ch, size, size, generator=g)}
    return {"input_ids": torch.randint(0, int(cfg.vocab_size), (1, n_tokens), generator=g)}


def capture_attention(model, inputs: dict[str, torch.Tensor]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """For every layer, ``(y, attn(y))``: the input of the query projection (the layer-normed
    hidden states) and the output of the output projection, from one forward pass."""
    blks = blocks(model)
    mods = [layer_modules(b, model.config) for b in blks]
    seen: list[dict[str, torch.Tensor]] = [{} for _ in blks]
    hooks = []
    for l, lm in enumerate(mods):
        hooks.append(lm.q_in.register_forward_pre_hook(lambda m, args, l=l: seen[l].__setitem__("y", args[0].detach())))
        hooks.append(lm.out.register_forward_hook(lambda m, args, out, l=l: seen[l].__setitem__("o", out.detach())))
    try:
        with torch.no_grad():
            model(**inputs)
    finally:
        for h in hooks:
            h.remove()
    return [(s["y"][0], s["o"][0]) for s in seen]


def verify_model(
    model, layers: HFLayers | None = None, *, n_tokens: int = 12, seed: int = 0, ids: list[int] | None = None
) -> list[LayerCheck]:
    """Compare, layer by layer and in float32, ``sum_h w_h out_h(y)`` with the module's output
    (on the token ``ids`` given, else on ``n_tokens`` seeded random ones)."""
    layers = layers if layers is not None else extract(model)
    inputs = sample_inputs(model, n_tokens, seed) if ids is None else {"input_ids": torch.tensor([list(ids)])}
    checks = []
    for l, (y, o) in enumerate(capture_attention(model, inputs)):
        ours = velocity(y.float(), layers.layers[l].to(dtype=torch.float32), model="mha", project=False)
        err = float((ours - o).abs().max())
        scale = float(o.abs().max())
        checks.append(LayerCheck(l, err / scale if scale > 0 else err, scale, int(y.shape[0])))
    return checks


def verify(path_or_name: str, *, n_tokens: int = 12, seed: int = 0, local_files_only: bool = True) -> list[LayerCheck]:
    """Load a checkpoint from disk and run :func:`verify_model` on it."""
    model = load_model(path_or_name, local_files_only=local_files_only)
    return verify_model(model, extract(model, source=str(path_or_name)), n_tokens=n_tokens, seed=seed)
