"""Importing Hugging Face checkpoints: tiny random models of every supported family are built from
configs, saved to a temporary folder and loaded by path (no network). The exactness check compares
our field with each layer's own attention module."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # belt and braces: nothing here may touch the network

import dataclasses

import pytest
import torch

pytest.importorskip("transformers")

from attnflow import velocity
from attnflow.hf import HFImportError, extract, load_heads, load_model, verify, verify_model
from attnflow.hf.tiny import FAMILIES, save_tiny

TOL = 1e-4
EXPECT = {  # family: (causal, norm, pre_norm, rope, kv_heads)
    "gpt2": (True, "layer", True, False, 4),
    "bert": (False, "layer", False, False, 4),
    "roberta": (False, "layer", False, False, 4),
    "vit": (False, "layer", True, False, 4),
    "llama": (True, "rms", True, True, 2),
    "qwen2": (True, "rms", True, True, 2),
    "mistral": (True, "rms", True, True, 2),
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    return {f: save_tiny(f, root / f, seed=i, tokenizer=f == "gpt2") for i, f in enumerate(FAMILIES)}


@pytest.fixture(scope="module")
def loaded(checkpoints):
    return {f: load_model(p) for f, p in checkpoints.items()}


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_reproduces_its_attention_exactly(family, checkpoints):
    layers = load_heads(checkpoints[family])
    m = layers.meta
    assert (m.layers, m.heads, m.head_dim, m.hidden) == (2, 4, 8, 32)
    assert (m.causal, m.norm, m.pre_norm, m.rope, m.kv_heads) == EXPECT[family]
    assert layers.L == 2 and layers.t_end == 2.0 and len(layers.norms) == 3
    checks = verify(checkpoints[family], n_tokens=10, seed=1)  # loads the checkpoint by path
    assert len(checks) == 2
    for c in checks:
        assert c.rel_error < TOL, (family, c)
        assert c.max_abs > 0.5  # a real signal, not a vanishing output


def _corrupt(heads, **changes):
    return dataclasses.replace(heads, **changes)


@pytest.mark.parametrize(
    "family, change",
    [
        ("gpt2", {"bias_q": None}),  # the key term b_Q . k_j of the logits
        ("gpt2", {"bias_v": None}),  # value and output-projection biases
        ("gpt2", {"causal": False}),  # the causal mask
        ("bert", {"bias_q": None}),  # (a key bias only shifts whole rows of logits: it cancels)
        ("llama", {"rope": None}),  # rotary embeddings
        ("qwen2", {"bias_q": None}),  # Qwen2 has q/k/v biases (rotated with q)
    ],
)
def test_each_ingredient_is_needed(family, change, loaded):
    """Removing one ingredient of the import breaks the exactness check: the check can fail."""
    layers = extract(loaded[family])
    layers.layers[1] = _corrupt(layers.layers[1], **change)
    checks = verify_model(loaded[family], layers, n_tokens=10, seed=1)
    assert checks[0].rel_error < TOL
    assert checks[1].rel_error > 1e-2


def test_heads_are_averaged_with_the_output_projection_folded_in(loaded):
    """``sum_h w_h V_h = W_O W_V`` summed over heads: with ``w_h = 1/H``, ``V_h = H W_O^h W_V^h``."""
    model = loaded["bert"]
    layers = extract(model)
    att = model.encoder.layer[0].attention
    Wv, Wo = att.self.value.weight.double(), att.output.dense.weight.double()
    assert torch.allclose(layers.layers[0].V.mean(0), Wo @ Wv, atol=1e-12)


def test_grouped_query_heads_share_keys_and_values(loaded):
    h = extract(loaded["llama"]).layers[0]
    assert torch.equal(h.K[0], h.K[1]) and torch.equal(h.K[2], h.K[3]) and not torch.equal(h.K[0], h.K[2])
    assert not torch.equal(h.Q[0], h.Q[1])


def test_a_name_that_is_not_on_disk_is_refused_without_download():
    with pytest.raises(HFImportError, match="never downloads"):
        load_heads("surely-not-a-model/on-this-disk")


def test_unsupported_model_type_is_refused(tmp_path):
    import transformers as tf

    tf.GPTNeoXConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64, vocab_size=64
    ).save_pretrained(tmp_path)
    with pytest.raises(HFImportError, match="not supported"):
        load_heads(tmp_path)


@pytest.mark.parametrize("family", ["gpt2", "llama", "bert"])
def test_norm_folded_into_the_heads_matches_the_norm_module(family, loaded):
    """On the sphere point ``x = P z / |P z|`` the folded heads act as the raw heads act on the
    module's own normalisation of ``z`` (``|z|`` large so that ``eps`` is negligible)."""
    from attnflow.hf.importer import blocks, norm_modules
    from attnflow.hf.sphere import on_sphere

    model = loaded[family]
    layers = extract(model)
    flow = on_sphere(layers, radius=[2.0, 3.0])
    mods, _ = norm_modules(model, blocks(model))
    z = 50.0 * torch.randn(9, 32, generator=torch.Generator().manual_seed(0))
    for l in range(2):
        with torch.no_grad():
            y = mods[l](z).double()
        raw = velocity(y, layers.layers[l], model="mha", project=False)
        x = layers.norms[l].to_sphere(z)
        folded = velocity(x, flow.layers[l], model="mha", project=False)
        # Pre-norm: values divided by the radius. Post-norm (BERT): pulled back through the norm's
        # output map y = sqrt(d) gamma * x + beta, so sqrt(d) gamma * folded is the module's output.
        scale = [2.0, 3.0][l] if layers.meta.pre_norm else 32**0.5 * layers.norms[l].gamma
        assert torch.allclose(folded * scale, raw, rtol=0, atol=1e-5 * float(raw.abs().max()))


@pytest.mark.slow
@pytest.mark.parametrize("family, sizes", [("gpt2", dict(hidden=768, heads=12)), ("llama", dict(hidden=512, heads=8))])
def test_realistic_widths_stay_exact_in_float32(family, sizes, tmp_path):
    """GPT-2-base and Llama-like widths (two layers to stay fast): float32 error stays below 1e-4."""
    path = save_tiny(family, tmp_path / family, layers=2, vocab=128, **sizes)
    model = load_model(path)
    checks = verify_model(model, extract(model), n_tokens=64, seed=3)
    assert all(c.rel_error < TOL for c in checks), checks
