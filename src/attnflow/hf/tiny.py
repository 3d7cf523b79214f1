"""Tiny random checkpoints of every supported family, built from configs and saved to disk.

Used by the tests and by ``examples/hf_tiny_model.py``; nothing is downloaded. The weights are
redrawn at order-one scale (the library's 0.02 initialisation gives near-uniform attention, which
would make an exactness check too easy), and biases and norm parameters are made non-zero.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from attnflow.core.errors import InputError

FAMILIES = ("gpt2", "bert", "roberta", "vit", "llama", "qwen2", "mistral")


def tiny_config(family: str, *, hidden: int = 32, layers: int = 2, heads: int = 4, vocab: int = 64):
    """A transformers config of the given family with the given sizes."""
    import transformers as tf

    common: dict[str, Any] = dict(
        num_hidden_layers=layers, num_attention_heads=heads, hidden_size=hidden, vocab_size=vocab
    )
    if family == "gpt2":
        return tf.GPT2Config(
            n_embd=hidden,
            n_layer=layers,
            n_head=heads,
            vocab_size=vocab,
            n_positions=128,
            bos_token_id=0,
            eos_token_id=0,
        )
    if family == "bert":
        return tf.BertConfig(**common, intermediate_size=2 * hidden, max_position_embeddings=128)
    if family == "roberta":
        return tf.RobertaConfig(**common, intermediate_size=2 * hidden, max_position_embeddings=130, pad_token_id=1)
    if family == "vit":
        return tf.ViTConfig(
            hidden_size=hidden,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            intermediate_size=2 * hidden,
            image_size=16,
            patch_size=4,
            num_channels=3,
        )
    kv = max(1, heads // 2)  # grouped-query attention: two query heads per key/value head
    if family == "llama":
        return tf.LlamaConfig(
            **common, num_key_value_heads=kv, intermediate_size=2 * hidden, max_position_embeddings=128
        )
    if family == "qwen2":
        return tf.Qwen2Config(
            **common, num_key_value_heads=kv, intermediate_size=2 * hidden, max_position_embeddings=128
        )
    if family == "mistral":
        return tf.MistralConfig(
            **common, num_key_value_heads=kv, intermediate_size=2 * hidden, max_position_embeddings=128
        )
    raise InputError(f"unknown family {family!r}; choose one of {FAMILIES}")


def randomise(model: torch.nn.Module, seed: int = 0, gain: float = 1.5) -> torch.nn.Module:
    """Redraw every parameter: matrices ``N(0, gain^2 / fan_in)``, vectors ``N(0, 0.3^2)`` (norm
    gains ``1 + N(0, 0.3^2)``), so logits are of order one and every bias term matters."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=g)
            if p.ndim >= 2:
                fan_in = p.shape[0] if "c_attn" in name or "c_proj" in name or "c_fc" in name else p.shape[-1]
                p.copy_(r * gain / math.sqrt(fan_in))
            elif name.endswith("weight"):  # 1-D weights are norm gains (LayerNorm, RMSNorm, ln_1, ln_f)
                p.copy_(1.0 + 0.3 * r)
            else:
                p.copy_(0.3 * r)
    return model


def save_tiny(family: str, folder: str | Path, *, seed: int = 0, tokenizer: bool = False, **sizes) -> Path:
    """Build, randomise and ``save_pretrained`` a tiny model of ``family`` into ``folder``.

    ``tokenizer=True`` also saves a small word-level tokenizer (every ``vocab`` word ``w0, w1, ...``
    plus the words of :data:`WORDS`), so that ``attnflow hf run --text`` works offline.
    """
    import transformers as tf

    torch.manual_seed(seed)
    cfg = tiny_config(family, **sizes)
    model = tf.AutoModel.from_config(cfg)
    randomise(model, seed)
    folder = Path(folder)
    model.save_pretrained(folder)
    if tokenizer:
        word_tokenizer(int(cfg.vocab_size)).save_pretrained(folder)
    return folder


WORDS = (
    "the a cat dog sat on mat and ran to big small red blue tree house over under with of in is was "
    "flow token head layer sphere attention"
).split()


def word_tokenizer(vocab: int):
    """A whitespace word-level tokenizer with ``vocab`` entries (unknown words map to ``[UNK]``)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["[UNK]", *WORDS]
    words += [f"w{i}" for i in range(max(0, vocab - len(words)))]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words[:vocab])}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")
