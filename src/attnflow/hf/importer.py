"""Read the attention heads of a Hugging Face checkpoint on disk into a :class:`~attnflow.weights.Layers`.

For layer ``l`` and head ``h`` of a model with hidden size ``d``, ``H`` query heads of size ``k``
(``H_kv`` key/value heads under grouped-query attention, head ``h`` using group ``h // (H / H_kv)``)
and attention scale ``s``, the module computes, on its layer-normed input ``y``,

    ``attn(y)_i = b_O + sum_h W_O^h sum_j softmax_j((s W_Q^h y_i + s b_Q^h) . (W_K^h y_j + b_K^h)) (W_V^h y_j + b_V^h)``.

We store ``Q_h = s W_Q^h``, ``K_h = W_K^h`` (``k x d``), their biases, and, because attnflow
*averages* heads with masses ``w_h = 1/H`` (docs/model.md, Conventions), ``V_h = H W_O^h W_V^h``
(``d x d``) and ``b_V^h = H W_O^h b_V^h + b_O``, so that ``sum_h w_h (...) = attn(y)`` exactly.

Supported: GPT-2 (fused ``c_attn`` Conv1D), BERT and RoBERTa (``query/key/value``), ViT and the
``q_proj/k_proj/v_proj/o_proj`` decoders Llama, Mistral and Qwen2 (grouped-query attention,
rotary embeddings handled exactly). Nothing is downloaded.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from attnflow.core.errors import InputError, UnsafeInputError
from attnflow.core.heads import Heads
from attnflow.io.safety import inside, memory_budget, scan_folder
from attnflow.io.store import read_small_text
from attnflow.weights.processes import Layers

#: model_type -> family; the families whose layout :func:`load_heads` knows.
SUPPORTED: dict[str, str] = {
    "gpt2": "gpt2",
    "bert": "bert",
    "roberta": "bert",
    "vit": "vit",
    "llama": "decoder",
    "mistral": "decoder",
    "qwen2": "decoder",
}
#: Rotary variants whose frequencies do not depend on the sequence length.
STATIC_ROPE = ("default", "linear", "llama3", "yarn")


class HFImportError(InputError):
    """The checkpoint cannot be imported (not on disk, unsupported layout): a user error."""


@dataclass(frozen=True)
class Norm:
    """A normalisation ``y = gamma * (z - mean z) / sqrt(var z + eps) + beta`` (``kind="layer"``) or
    ``y = gamma * z / sqrt(mean z^2 + eps)`` (``kind="rms"``, ``beta = None``)."""

    kind: str
    gamma: torch.Tensor
    beta: torch.Tensor | None
    eps: float

    def apply(self, z: torch.Tensor) -> torch.Tensor:
        """The normalisation itself (for checks against the module)."""
        z = z.to(torch.float64)
        if self.kind == "layer":
            assert self.beta is not None  # a layer norm has a shift
            c = z - z.mean(-1, keepdim=True)
            return self.gamma * c / torch.sqrt((c * c).mean(-1, keepdim=True) + self.eps) + self.beta
        return self.gamma * z / torch.sqrt((z * z).mean(-1, keepdim=True) + self.eps)

    def to_sphere(self, z: torch.Tensor) -> torch.Tensor:
        """The point of the sphere the normalisation sees: ``P z / |P z|`` with ``P`` the centring
        (``kind="layer"``) or the identity (``kind="rms"``)."""
        z = z.to(torch.float64)
        if self.kind == "layer":
            z = z - z.mean(-1, keepdim=True)
        return z / torch.linalg.vector_norm(z, dim=-1, keepdim=True)


@dataclass(frozen=True)
class HFMeta:
    """What was imported: ``architecture``, ``model_type``, ``layers``, ``heads`` (query heads),
    ``kv_heads``, ``head_dim``, ``hidden`` (``d``), ``causal``, ``norm`` (``layer``/``rms``),
    ``pre_norm`` (norm before attention, GPT-2 style, or after, BERT style), ``rope``, ``source``."""

    architecture: str
    model_type: str
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    hidden: int
    causal: bool
    norm: str
    pre_norm: bool
    rope: bool
    source: str
    sliding_window: int | None = None
    max_positions: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


class HFLayers(Layers):
    """The heads of every layer of a checkpoint (one unit of time per layer, ``t_end = L``).

    ``layers[l]`` acts on the layer-normed hidden states ``y`` exactly as the module does;
    ``norms[l]`` (``l < L``) is the normalisation whose output feeds layer ``l`` and ``norms[L]`` the
    final one; ``meta`` describes the model. :func:`attnflow.hf.on_sphere` folds the norms in.
    """

    def __init__(
        self,
        heads: list[Heads],
        norms: list[Norm],
        meta: HFMeta,
        value_factors: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
    ):
        super().__init__(heads, t_end=float(len(heads)))
        self.norms, self.meta = norms, meta
        #: per layer ``(L_h, R_h)`` with ``V_h = L_h R_h``: ``L_h = H W_O^h`` ``(H, d, k)``, ``R_h = W_V^h`` ``(H, k, d)``.
        self.value_factors = value_factors

    def describe(self) -> dict:
        return {**super().describe(), **self.meta.as_dict()}


# ---------------------------------------------------------------------------------------------
# Loading.
# ---------------------------------------------------------------------------------------------


def _require_transformers():
    try:
        import transformers  # noqa: F401
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise HFImportError(
            "importing Hugging Face checkpoints needs the optional extra: pip install 'attnflow[hf]'"
        ) from e


#: Most files and folders a model folder may hold (a sentence-transformers folder holds a few dozen).
MAX_MODEL_ENTRIES = 10_000
#: The settings files in which transformers looks for custom code (``auto_map``).
CODE_NAMING_FILES = (
    "config.json",
    "tokenizer_config.json",
    "preprocessor_config.json",
    "processor_config.json",
    "feature_extractor_config.json",
    "image_processor_config.json",
)
#: Arguments of every transformers ``from_pretrained`` call: no code from the folder, no download.
SAFE_LOAD = {"trust_remote_code": False, "local_files_only": True}


@contextlib.contextmanager
def no_answers() -> Iterator[None]:
    """While a library loads a model, ``sys.stdin`` is an empty stream: a question it might ask (such
    as transformers' "run the custom code? [y/N]") reads end-of-file, never an answer piped into
    attnflow. Only attnflow's own ``--yes`` prompts read stdin, and only on a terminal."""
    saved = sys.stdin
    sys.stdin = io.StringIO()
    try:
        yield
    finally:
        sys.stdin = saved


def check_model_folder(path: str | os.PathLike) -> Path:
    """The folder holding the model's ``config.json`` (:func:`resolve_folder`), after treating the
    model folder at ``path`` as data from a stranger, before transformers sees any of it.

    Refuses (:class:`~attnflow.core.errors.UnsafeInputError`, one sentence) a symbolic link
    anywhere under ``path`` (a weights file or a sentence-transformers sub-folder pointing at a
    model elsewhere), a named pipe, device or socket, more than :data:`MAX_MODEL_ENTRIES` entries,
    more bytes than this process can hold, and any settings file (:data:`CODE_NAMING_FILES`) whose
    ``auto_map`` names custom code: attnflow never runs code shipped in a model folder.
    """
    root = Path(path)
    total = scan_folder(root, max_entries=MAX_MODEL_ENTRIES)
    budget = memory_budget()
    if total > budget:
        raise UnsafeInputError(
            f"the model folder {str(root)!r} holds {total:,} bytes, more than the {int(budget):,} this process can use; "
            "it is not loaded."
        )
    folder = resolve_folder(root)
    for where in dict.fromkeys((folder, root)):
        for name in CODE_NAMING_FILES:
            f = where / name
            if not f.exists():
                continue
            try:
                raw = json.loads(read_small_text(f))
            except (OSError, ValueError) as e:
                raise HFImportError(f"{str(f)!r} is not valid JSON ({e}); the model folder is damaged.") from None
            if isinstance(raw, dict) and "auto_map" in raw:
                raise UnsafeInputError(
                    f"{str(f)!r} names custom code (auto_map), which attnflow never runs: a model folder is data; "
                    "use a model whose type transformers knows."
                )
    return folder


def resolve_folder(path: str | os.PathLike) -> Path:
    """The folder holding ``config.json`` and the weights: ``path`` itself (``save_pretrained``), or,
    for a sentence-transformers folder, the ``Transformer`` module named in its ``modules.json``
    (the root, ``path: ""``, or a sub-folder such as ``0_Transformer/``)."""
    p = Path(path)
    if not p.is_dir():
        if p.exists():
            raise HFImportError(f"{str(p)!r} is a file; pass the folder a model was saved into with save_pretrained()")
        raise HFImportError(
            f"no Hugging Face model at {str(p)!r} on disk: attnflow never downloads weights. Pass the folder a model "
            "was saved into with save_pretrained() (it holds config.json and the weights)."
        )
    modules = p / "modules.json"
    if modules.is_file():
        try:
            entries = json.loads(read_small_text(modules))
            sub = [e.get("path", "") for e in entries if str(e.get("type", "")).endswith("models.Transformer")]
        except (ValueError, AttributeError, TypeError) as e:
            raise HFImportError(f"{str(modules)!r} is not a valid sentence-transformers modules.json ({e})") from e
        if not sub:
            raise HFImportError(
                f"{str(modules)!r} names no sentence_transformers.models.Transformer module: the folder holds no "
                "transformer to import"
            )
        # The module's path is data: it must name a sub-folder of this folder, never a model elsewhere.
        return inside(p, sub[0], repr(str(modules))) if sub[0] else p
    if not (p / "config.json").is_file() and (p / "0_Transformer" / "config.json").is_file():
        return p / "0_Transformer"
    if not (p / "config.json").is_file():
        raise HFImportError(
            f"{str(p)!r} has no config.json (nor a sentence-transformers modules.json): supported layouts are a "
            "save_pretrained() folder and a sentence-transformers folder"
        )
    return p


#: Bounds on a model's declared sizes, checked before the model is built (a config.json of a few
#: bytes may declare 100,000 layers): layers, hidden width, heads, and the parameter count.
MAX_LAYERS = 1024
MAX_HIDDEN = 65_536
MAX_HEADS = 1024


def check_config_sizes(raw: object, where: str) -> None:
    """Refuse a ``config.json`` whose declared sizes are absurd or would not fit in memory, before
    transformers builds the model (:class:`~attnflow.core.errors.UnsafeInputError`)."""
    if not isinstance(raw, dict):
        raise UnsafeInputError(f"{where} is not a JSON object of model settings.")

    def size(*keys: str) -> int | None:
        for k in keys:
            v = raw.get(k)
            if v is not None:
                if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                    raise UnsafeInputError(f"{where}: {k} is {str(v)[:40]!r}, not a non-negative integer.")
                return v
        return None

    layers = size("num_hidden_layers", "n_layer", "num_layers")
    hidden = size("hidden_size", "n_embd", "d_model")
    heads = size("num_attention_heads", "n_head")
    for name, v, most in (
        ("layers", layers, MAX_LAYERS),
        ("hidden size", hidden, MAX_HIDDEN),
        ("heads", heads, MAX_HEADS),
    ):
        if v is not None and v > most:
            raise UnsafeInputError(
                f"{where} declares {v:,} {name}, more than the {most:,} attnflow imports; the config is damaged or "
                "hostile."
            )
    if layers and hidden:
        need = 4.0 * 12 * layers * hidden**2  # float32 attention and MLP weights of a transformer block
        if need > memory_budget():
            raise UnsafeInputError(
                f"{where} declares {layers:,} layers of width {hidden:,} (about {need / 2**30:.1f} GiB of weights), "
                "more than this process can use."
            )


def _read_config(folder: Path):
    from transformers import AutoConfig

    cfg = folder / "config.json"
    try:
        raw = json.loads(read_small_text(cfg))
    except (OSError, ValueError) as e:
        raise HFImportError(f"{str(cfg)!r} is not valid JSON ({e}); the model's config is corrupt or truncated") from e
    check_config_sizes(raw, repr(str(cfg)))
    try:
        with no_answers():
            return AutoConfig.from_pretrained(str(folder), **SAFE_LOAD)
    except Exception as e:  # transformers and huggingface_hub validate fields with their own error types
        why = str(e).splitlines()[0] if str(e) else ""
        raise HFImportError(f"{str(cfg)!r} is not a usable model config ({type(e).__name__}: {why})") from e


def load_model(path_or_name: str | os.PathLike, *, local_files_only: bool = True):
    """The checkpoint's base model (``AutoModel``, float32, eager attention, eval mode).

    ``path_or_name``: a ``save_pretrained`` folder or a sentence-transformers folder
    (:func:`resolve_folder`); with ``local_files_only=False``, also a hub name (then downloads are
    transformers' business, never attnflow's default)."""
    _require_transformers()
    from transformers import AutoConfig, AutoModel

    src = str(path_or_name)
    if Path(src).exists() or Path(src).is_symlink():
        folder = check_model_folder(src)
        config = _read_config(folder)
        src = str(folder)
        local_files_only = True  # a folder on disk never reaches the network
    else:  # a name: only from the local Hugging Face cache unless local_files_only=False
        try:
            with no_answers():
                config = AutoConfig.from_pretrained(src, local_files_only=local_files_only, trust_remote_code=False)
        except (OSError, ValueError) as e:
            if local_files_only:
                raise HFImportError(
                    f"no Hugging Face model at {src!r} on disk: attnflow never downloads weights. Pass the folder "
                    "a model was saved into with save_pretrained() (it holds config.json and the weights), a "
                    "sentence-transformers folder, or the name of a model already in the local Hugging Face cache."
                ) from e
            raise HFImportError(f"could not load a model config from {src!r}: {e}") from e
    model_type = getattr(config, "model_type", "?")
    if model_type not in SUPPORTED:
        raise HFImportError(
            f"model type {model_type!r} at {src!r} is not supported; supported types: {', '.join(sorted(SUPPORTED))}"
        )
    try:
        with no_answers():
            model, info = AutoModel.from_pretrained(
                src,
                local_files_only=local_files_only,
                trust_remote_code=False,
                attn_implementation="eager",
                dtype=torch.float32,
                output_loading_info=True,
            )
    except Exception as e:  # safetensors, torch and transformers each raise their own kind
        raise HFImportError(
            f"the weights at {src!r} cannot be read, they are missing, truncated or corrupt "
            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
        ) from e
    missing = [k for k in info.get("missing_keys", []) if "attention" in k or "attn" in k or "norm" in k.lower()]
    if missing:
        raise HFImportError(
            f"the weights at {src!r} lack {len(missing)} attention or norm tensors (first: {sorted(missing)[0]!r}); "
            "the checkpoint is incomplete"
        )
    return model.eval()


def load_heads(path_or_name: str | os.PathLike, *, local_files_only: bool = True) -> HFLayers:
    """Import every layer's heads ``(Q_h, K_h, V_h, biases)``, its norm and the model's metadata.

    ``path_or_name``: a folder written by ``save_pretrained`` (or a name already in the local
    Hugging Face cache). Returns an :class:`HFLayers` (a :class:`~attnflow.weights.Layers`).
    A sentence-transformers folder (``modules.json``) is read as it is (:func:`resolve_folder`).
    """
    return extract(load_model(path_or_name, local_files_only=local_files_only), source=str(path_or_name))


# ---------------------------------------------------------------------------------------------
# Reading the modules.
# ---------------------------------------------------------------------------------------------


@dataclass
class LayerModules:
    """The modules of one layer: where its attention input enters (``q_in``), its output projection
    (``out``), and the raw projection weights ``W`` (rows = outputs) and biases."""

    q_in: torch.nn.Module
    out: torch.nn.Module
    W: dict[str, torch.Tensor] = field(default_factory=dict)
    b: dict[str, torch.Tensor | None] = field(default_factory=dict)
    scaling: float = 1.0
    causal: bool = False


def _first(obj: Any, *names: str) -> Any:
    for n in names:
        cur = obj
        for part in n.split("."):
            cur = getattr(cur, part, None)
            if cur is None:
                break
        if cur is not None:
            return cur
    return None


def _parameter(m: torch.nn.Module, name: str) -> torch.Tensor:
    """The module's tensor ``name`` (a parameter or buffer), detached."""
    t = getattr(m, name)
    if not isinstance(t, torch.Tensor):
        raise HFImportError(f"{type(m).__name__}.{name} is not a tensor")
    return t.detach()


def _linear(m: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(W, b)`` with ``m(y) = W y + b`` for ``nn.Linear`` and GPT-2's ``Conv1D`` (``y W + b``)."""
    W = _parameter(m, "weight").to(torch.float64)
    if type(m).__name__ == "Conv1D":
        W = W.T
    b = getattr(m, "bias", None)
    return W, None if b is None else b.detach().to(torch.float64)


def blocks(model) -> list[torch.nn.Module]:
    """The transformer blocks of a base model, in order."""
    found = _first(model, "h", "layers", "encoder.layer", "encoder.layers")
    if found is None:
        raise HFImportError(f"cannot find the transformer blocks of {type(model).__name__}")
    return list(found)


def layer_modules(block: torch.nn.Module, config) -> LayerModules:
    attn = _first(block, "attn", "self_attn", "attention")
    if attn is None:
        raise HFImportError(f"cannot find the attention module of {type(block).__name__}")
    inner, out = attn, _first(attn, "c_proj", "o_proj", "out_proj")
    if hasattr(attn, "self") and hasattr(attn, "output"):  # BERT / RoBERTa
        inner, out = attn.self, attn.output.dense
    if _first(inner, "q_norm", "k_norm") is not None:
        raise HFImportError("per-head query/key normalisation (q_norm/k_norm) is not supported")
    lm = LayerModules(q_in=inner, out=out)
    if hasattr(inner, "c_attn"):  # GPT-2: one fused Conv1D for q, k, v
        W, b = _linear(inner.c_attn)
        d = W.shape[1]
        for n, s in zip("qkv", range(3)):
            lm.W[n], lm.b[n] = W[s * d : (s + 1) * d], None if b is None else b[s * d : (s + 1) * d]
        lm.q_in = inner.c_attn
    else:
        mods = [_first(inner, f"{n}_proj", name) for n, name in zip("qkv", ("query", "key", "value"))]
        if any(m is None for m in mods):
            raise HFImportError(f"cannot find the query/key/value projections of {type(inner).__name__}")
        for n, m in zip("qkv", mods):
            lm.W[n], lm.b[n] = _linear(m)
        lm.q_in = mods[0]
    if out is None:
        raise HFImportError(f"cannot find the output projection of {type(inner).__name__}")
    lm.W["o"], lm.b["o"] = _linear(out)
    lm.scaling = float(getattr(inner, "scaling", 0.0) or (lm.W["q"].shape[0] // config.num_attention_heads) ** -0.5)
    lm.causal = bool(getattr(inner, "is_causal", False)) or bool(getattr(config, "is_decoder", False))
    return lm


def norm_modules(model, blks: list[torch.nn.Module]) -> tuple[list[torch.nn.Module], bool]:
    """``L + 1`` norm modules (the one feeding each layer's attention, then the final one) and
    whether the model normalises before attention (pre-norm) or after (post-norm, BERT)."""
    pre = [_first(b, "ln_1", "input_layernorm", "layernorm_before") for b in blks]
    if all(m is not None for m in pre):
        final = _first(model, "ln_f", "norm", "layernorm", "final_layernorm")
        if final is None:
            raise HFImportError(f"cannot find the final norm of {type(model).__name__}")
        return pre + [final], True
    post = [_first(b, "output.LayerNorm") for b in blks]
    emb = _first(model, "embeddings.LayerNorm")
    if emb is None or any(m is None for m in post):
        raise HFImportError(f"cannot find the layer norms of {type(model).__name__}")
    return [emb] + post, False


def read_norm(m: torch.nn.Module) -> Norm:
    gamma = _parameter(m, "weight").to(torch.float64)
    eps = float(_first(m, "eps", "variance_epsilon") or 1e-5)
    if "RMSNorm" in type(m).__name__:
        return Norm("rms", gamma, None, eps)
    if isinstance(m, torch.nn.LayerNorm):
        beta = m.bias.detach().to(torch.float64) if m.bias is not None else torch.zeros_like(gamma)
        return Norm("layer", gamma, beta, eps)
    raise HFImportError(f"unsupported normalisation module {type(m).__name__}")


def _rope(model, head_dim: int) -> tuple[torch.Tensor | None, float]:
    rot = _first(model, "rotary_emb")
    if rot is None:
        return None, 1.0
    kind = getattr(rot, "rope_type", "default")
    if kind not in STATIC_ROPE:
        raise HFImportError(
            f"rotary embeddings of type {kind!r} change with the sequence length and are not supported; "
            f"supported: {', '.join(STATIC_ROPE)}"
        )
    inv_freq = rot.inv_freq.detach().to(torch.float64)
    if 2 * inv_freq.numel() != head_dim:
        raise HFImportError(
            f"partial rotary embeddings ({2 * inv_freq.numel()} of {head_dim} head dimensions) are not supported"
        )
    return inv_freq, float(getattr(rot, "attention_scaling", 1.0))


def _config_count(config: Any, name: str, default: int | None, source: str) -> int:
    """``config.<name>`` as a positive whole number (``default`` when absent or null); a value of another
    kind is a damaged folder, said in one sentence (transformers does not check every field's type)."""
    value = getattr(config, name, None)
    if value is None and default is not None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise HFImportError(
            f"the config.json of {source or 'the model'!r} gives {name!r} as {repr(value)[:60]}, not a positive "
            "whole number; the model folder is damaged."
        )
    return value


def extract(model, *, source: str = "") -> HFLayers:
    """The :class:`HFLayers` of an already loaded base model (see :func:`load_heads`)."""
    config = model.config
    model_type = getattr(config, "model_type", "?")
    if model_type not in SUPPORTED:
        raise HFImportError(f"model type {model_type!r} is not supported; supported: {', '.join(sorted(SUPPORTED))}")
    blks = blocks(model)
    H = _config_count(config, "num_attention_heads", None, source)
    Hkv = _config_count(config, "num_key_value_heads", H, source)
    mods = [layer_modules(b, config) for b in blks]
    d = mods[0].W["q"].shape[1]
    k = mods[0].W["q"].shape[0] // H
    rope, rope_scale = _rope(model, k)
    norm_mods, pre_norm = norm_modules(model, blks)
    norms = [read_norm(m) for m in norm_mods]
    built = [_layer_heads(lm, H, Hkv, k, d, rope, rope_scale) for lm in mods]
    heads = [b[0] for b in built]
    archs = getattr(config, "architectures", None)
    if archs is not None and not (isinstance(archs, (list, tuple)) and all(isinstance(a, str) for a in archs)):
        raise HFImportError(
            f"the config.json of {source or 'the model'!r} gives 'architectures' as {repr(archs)[:60]}, not a list of "
            "class names; the model folder is damaged."
        )
    arch = (archs or [type(model).__name__])[0]
    meta = HFMeta(
        architecture=arch,
        model_type=model_type,
        layers=len(blks),
        heads=H,
        kv_heads=Hkv,
        head_dim=k,
        hidden=d,
        causal=mods[0].causal,
        norm=norms[0].kind,
        pre_norm=pre_norm,
        rope=rope is not None,
        source=source,
        sliding_window=getattr(config, "sliding_window", None) if getattr(config, "use_sliding_window", True) else None,
        max_positions=max_positions(config),
    )
    return HFLayers(heads, norms, meta, value_factors=[b[1] for b in built])


def max_positions(config) -> int | None:
    """The longest token sequence the model has position embeddings for (``None``: no fixed limit
    is recorded; rotary models still have ``max_position_embeddings``, which we enforce)."""
    n = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    if n is None:
        return None
    if getattr(config, "model_type", "") == "roberta":  # RoBERTa's positions start at pad_token_id + 1
        n -= int(getattr(config, "pad_token_id", 1) or 1) + 1
    return int(n)


def _layer_heads(
    lm: LayerModules, H: int, Hkv: int, k: int, d: int, rope, rope_scale: float
) -> tuple[Heads, tuple[torch.Tensor, torch.Tensor]]:
    group = H // Hkv
    kv = torch.arange(H) // group  # query head h reads key/value head h // (H / H_kv)

    def split(W: torch.Tensor, n: int) -> torch.Tensor:  # (n k, d) -> (n, k, d)
        return W.reshape(n, k, W.shape[-1])

    def bias(name: str, n: int) -> torch.Tensor:
        b = lm.b[name]
        return torch.zeros(n, k, dtype=torch.float64) if b is None else b.reshape(n, k)

    # Rotary attention_scaling multiplies both cos and sin, i.e. scales q and k: fold it in.
    sq = lm.scaling * rope_scale
    Q, bQ = sq * split(lm.W["q"], H), sq * bias("q", H)
    K, bK = rope_scale * split(lm.W["k"], Hkv)[kv], rope_scale * bias("k", Hkv)[kv]
    Wv, bv = split(lm.W["v"], Hkv)[kv], bias("v", Hkv)[kv]
    Wo = lm.W["o"].reshape(d, H, k).permute(1, 0, 2)  # (H, d, k): W_O^h
    V = H * Wo @ Wv  # (H, d, d): the average over heads reproduces the sum
    bO = lm.b["o"] if lm.b["o"] is not None else torch.zeros(d, dtype=torch.float64)
    bV = H * (Wo @ bv.unsqueeze(-1)).squeeze(-1) + bO
    heads = Heads(
        K=K.contiguous(),
        Q=Q.contiguous(),
        V=V.contiguous(),
        bias_q=bQ if bool(bQ.any()) else None,
        bias_k=bK if bool(bK.any()) else None,
        bias_v=bV if bool(bV.any()) else None,
        causal=lm.causal,
        rope=rope,
    )
    return heads, ((H * Wo).contiguous(), Wv.contiguous())
