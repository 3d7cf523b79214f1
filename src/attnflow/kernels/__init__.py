"""The attention kernel, once: ``out_h(x_i)`` and ``logZ_h(x_i)`` of every head.

:mod:`.dense` (fused flash / streamed kernels and the numpy reference), :mod:`.fastsum` (fast
summation for ``d <= 4``), :mod:`.dispatch` (which backend evaluates a call, :data:`BACKENDS`).
"""

from attnflow.kernels import dense, dispatch, fastsum
from attnflow.kernels.dense import (
    DEFAULT_BLOCK_ELEMENTS,
    KERNEL_BACKENDS,
    attention_stats,
    attention_stats_reference,
    resolve_backend,
)
from attnflow.kernels.dispatch import BACKENDS, head_stats, kernel_options
from attnflow.kernels.fastsum import FastSumResult, fast_attention_stats

__all__ = [
    "BACKENDS",
    "DEFAULT_BLOCK_ELEMENTS",
    "KERNEL_BACKENDS",
    "FastSumResult",
    "attention_stats",
    "attention_stats_reference",
    "dense",
    "dispatch",
    "fast_attention_stats",
    "fastsum",
    "head_stats",
    "kernel_options",
    "resolve_backend",
]
