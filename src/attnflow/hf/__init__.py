"""Real transformers in attnflow: import a Hugging Face checkpoint's heads, check them, run their flow.

Needs the optional extra ``attnflow[hf]`` (``transformers``, ``safetensors``). Nothing is downloaded.
"""

from .importer import HFImportError, HFLayers, HFMeta, Norm, SUPPORTED, extract, load_heads, load_model
from .verify import LayerCheck, verify, verify_model
from .sphere import GradientFlowProjection, fold_norm, on_sphere, to_gradient_flow
from .flow import Comparison, load_comparison, run_prompt, save_hf_run

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
]
