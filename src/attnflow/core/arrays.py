"""Array-type plumbing: accept numpy or torch, compute in torch, return the input's type.

Every public function converts its inputs once with :func:`to_tensor` and hands results back
through :func:`like`; nothing else in the package needs to know which array library a user has.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

ArrayLike = Any  # numpy.ndarray | torch.Tensor | nested sequences


def is_torch(x: Any) -> bool:
    return isinstance(x, torch.Tensor)


def to_tensor(x: ArrayLike, *, dtype: torch.dtype | None = None, device: Any = None) -> torch.Tensor:
    """Convert ``x`` to a torch tensor without copying when possible.

    Integer and Python-float inputs become float64, so that numpy users get double precision
    by default, as numpy would give them.
    """
    if isinstance(x, torch.Tensor):
        t = x
    else:
        arr = np.asarray(x)
        if not np.issubdtype(arr.dtype, np.floating):
            arr = arr.astype(np.float64)
        t = torch.from_numpy(np.ascontiguousarray(arr))
    if dtype is None and not t.is_floating_point():
        dtype = torch.float64
    if dtype is not None or device is not None:
        t = t.to(dtype=dtype or t.dtype, device=device or t.device)
    return t


def like(result: torch.Tensor, reference: ArrayLike) -> ArrayLike:
    """Return ``result`` in the array type of ``reference`` (numpy in, numpy out)."""
    if is_torch(reference):
        return result
    out = result.detach().cpu().numpy()
    return out[()] if out.ndim == 0 else out


def to_numpy(x: ArrayLike) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy()
    return np.asarray(x)
