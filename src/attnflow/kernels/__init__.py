"""The attention kernel, once: ``out_h(x_i)`` and ``logZ_h(x_i)`` of every head.

:mod:`.dense` (fused flash / streamed kernels and the numpy reference), :mod:`.fastsum` (fast
summation for ``d <= 4``), :mod:`.dispatch` (which backend evaluates a call, :data:`BACKENDS`).

Naming scheme: a function ``<source>_stats`` returns one kernel pass, the pair ``(out, logZ)``
(normalised outputs ``out_h(x_i)`` and log-partitions ``log Z_h(x_i)``), computed from ``<source>``:

* :func:`dense_stats` (features ``q, k, v``, dense flash/stream kernels), :func:`reference_stats`
  (the same in plain numpy, for tests), :func:`fast_stats` (fast summation; a
  :class:`FastSumResult` carrying ``out`` and ``logZ``);
* :func:`head_stats` (tokens and :class:`~attnflow.Heads`; picks one of the above);
* :func:`attnflow.dynamics.fields.field_stats` (the same, as a :class:`~attnflow.dynamics.fields.FieldStats`, whose
  methods are the energy, mobility, slope and fields) and
  :meth:`attnflow.dynamics.infinite.GaussianHeads.law_stats` (the infinite-head closed forms).

``attention_stats``, ``attention_stats_reference`` and ``fast_attention_stats`` are the former
names of the first three, kept as aliases.
"""

from attnflow.kernels import dense, dispatch, fastsum
from attnflow.kernels.dense import (
    DEFAULT_BLOCK_ELEMENTS,
    KERNEL_BACKENDS,
    attention_stats,
    attention_stats_reference,
    dense_stats,
    reference_stats,
    resolve_backend,
)
from attnflow.kernels.dispatch import BACKENDS, head_stats, kernel_options
from attnflow.kernels.fastsum import FastSumResult, fast_attention_stats, fast_stats

__all__ = [
    "BACKENDS",
    "DEFAULT_BLOCK_ELEMENTS",
    "KERNEL_BACKENDS",
    "FastSumResult",
    "attention_stats",
    "attention_stats_reference",
    "dense",
    "dense_stats",
    "dispatch",
    "fast_attention_stats",
    "fast_stats",
    "fastsum",
    "head_stats",
    "kernel_options",
    "reference_stats",
    "resolve_backend",
]
