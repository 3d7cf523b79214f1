"""Real transformers in attnflow: import a Hugging Face checkpoint's heads, check them, run their flow.

Needs the optional extra ``attnflow[hf]`` (``transformers``, ``safetensors``). Nothing is downloaded.
"""

from .importer import HFImportError, HFLayers, HFMeta, Norm, SUPPORTED, extract, load_heads, load_model
from .verify import LayerCheck, verify, verify_model

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
]
