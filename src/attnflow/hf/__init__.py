"""Real transformers in attnflow: import a Hugging Face checkpoint's heads, check them, run their flow.

Needs the optional extra ``attnflow[hf]`` (``transformers``, ``safetensors``). Nothing is downloaded.
"""

from attnflow.hf.flow import Comparison, load_comparison, run_prompt
from attnflow.hf.folder import save_hf_run
from attnflow.hf.importer import SUPPORTED, HFImportError, HFLayers, HFMeta, Norm, extract, load_heads, load_model
from attnflow.hf.sphere import GradientFlowProjection, fold_norm, on_sphere, to_gradient_flow
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
]
