"""Readers a run folder may ask for, by name, from a fixed registry (never code named by data).

A dataset whose heads are stored compactly names the reader that rebuilds them in its
``heads_reader`` attribute. That attribute is data from a folder that may come from a stranger, so
it selects from :data:`HEADS_READERS` (a closed mapping of names to functions of this package) and
is never imported: any other value is refused with :class:`~attnflow.core.errors.UnsafeInputError`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from attnflow.core.errors import UnsafeInputError

#: The name ``attnflow hf run`` records for heads stored as per-layer factors (see
#: :func:`factored_heads`). It is the text of the old ``"module:function"`` reference, kept so that
#: folders written before the registry still read; it is compared as a name, never imported.
FACTORED = "attnflow.hf.folder:dense_heads"

#: The longest reader name accepted (anything longer is refused before it is compared).
MAX_NAME = 64


def factored_heads(ds: Any) -> tuple[np.ndarray, np.ndarray]:
    """``(A, V)`` ``(time, head, d, d)`` in float64 from per-layer factors: ``A_h = Q_h^T K_h``,
    ``V_h = VL_h VR_h``, the layer acting at each saved time in ``hf_layer_of_time``."""
    Q, K = ds["hf_Q"].values.astype(np.float64), ds["hf_K"].values.astype(np.float64)
    VL, VR = ds["hf_VL"].values.astype(np.float64), ds["hf_VR"].values.astype(np.float64)
    A = np.einsum("lhkd,lhke->lhde", Q, K)
    V = VL @ VR
    idx = np.asarray(ds["hf_layer_of_time"].values)
    if idx.dtype.kind not in "iu" or (idx.size and (idx.min() < 0 or idx.max() >= A.shape[0])):
        raise UnsafeInputError("hf_layer_of_time names layers the dataset does not hold")
    return A[idx], V[idx]


#: name -> reader of the heads a dataset stores compactly. Closed: a folder chooses, never adds.
HEADS_READERS: dict[str, Callable[[Any], tuple[np.ndarray, np.ndarray]]] = {FACTORED: factored_heads}


def heads_reader(name: object, where: str = "the dataset") -> Callable[[Any], tuple[np.ndarray, np.ndarray]]:
    """The registered reader called ``name``; :class:`UnsafeInputError` for anything else (a
    ``"module:function"`` that is not registered is never imported)."""
    if not isinstance(name, str) or len(name) > MAX_NAME or name not in HEADS_READERS:
        shown = repr(name)[:MAX_NAME] if isinstance(name, str) else type(name).__name__
        raise UnsafeInputError(
            f"{where} asks for the heads reader {shown}, which is not one of attnflow's "
            f"({', '.join(sorted(HEADS_READERS))}); a folder may choose a reader, never name code to run."
        )
    return HEADS_READERS[name]
