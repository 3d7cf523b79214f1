"""Real transformers in attnflow: import a Hugging Face checkpoint's heads, check them, run their flow.

Needs the optional extra ``attnflow[hf]`` (``transformers``, ``safetensors``). Nothing is downloaded.
"""

from attnflow.hf.example import minilm_folder
from attnflow.hf.flow import Comparison, load_comparison, run_prompt, tokenize
from attnflow.hf.folder import save_hf_run
from attnflow.hf.importer import (
    SUPPORTED,
    HFImportError,
    HFLayers,
    HFMeta,
    Norm,
    check_model_folder,
    extract,
    load_heads,
    load_model,
    resolve_folder,
)
from attnflow.hf.measures import HeadActivity, effective_rank, head_activity, mean_inner, nn_cosine, random_heads
from attnflow.hf.sphere import GradientFlowProjection, fold_norm, on_sphere, to_gradient_flow, value_factors
from attnflow.hf.verify import LayerCheck, verify, verify_model

__all__ = [
    "HFImportError",
    "HFLayers",
    "HFMeta",
    "Norm",
    "SUPPORTED",
    "extract",
    "load_heads",
    "load_model",
    "LayerCheck",
    "verify",
    "verify_model",
    "GradientFlowProjection",
    "fold_norm",
    "on_sphere",
    "to_gradient_flow",
    "Comparison",
    "load_comparison",
    "run_prompt",
    "save_hf_run",
    "tokenize",
    "resolve_folder",
    "check_model_folder",
    "minilm_folder",
    "value_factors",
    "HeadActivity",
    "head_activity",
    "random_heads",
    "mean_inner",
    "effective_rank",
    "nn_cosine",
]
