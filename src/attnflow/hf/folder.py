"""The folder of ``attnflow hf run``: a normal run folder plus the comparison with the real model.

Storage that scales: an imported model's heads are constant within a layer and of rank ``k``, so
``dataset.zarr`` holds them once per layer as factors (``hf_Q``, ``hf_K`` ``(block, head, rank,
dim)``, values ``hf_VL`` ``(block, head, dim, rank)`` times ``hf_VR``, in float32: a relative rounding
of about ``6e-8``; biases in float64) instead of dense ``A, V`` ``(time, head, d, d)`` at every saved
time. :func:`dense_heads` rebuilds ``A`` and ``V`` when the folder is loaded (the reader named in
the dataset's ``heads_reader`` attribute, a name in the closed registry
:data:`attnflow.io.readers.HEADS_READERS`), so :func:`attnflow.load` returns the usual trajectory.
For MiniLM (``d = 384``, 12 heads of size 32, 6 layers) that is 14 MB instead of 200 MB.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr
import yaml

from attnflow.core.trajectory import Trajectory
from attnflow.hf.flow import COMPARISON, Comparison
from attnflow.hf.plot import plot_comparison, plot_heads
from attnflow.io.readers import FACTORED, factored_heads
from attnflow.io.store import (
    CONFIG,
    DATASET,
    FIGURES,
    PROVENANCE,
    atomic_folder,
    provenance_record,
    trajectory_to_dataset,
    write_dataset,
)
from attnflow.viz.plotting import plot_run
from attnflow.weights.processes import Layers

#: The registered name of the reader that rebuilds dense heads from the factors (a key of
#: :data:`attnflow.io.readers.HEADS_READERS`, chosen by name, never imported).
HEADS_READER = FACTORED


def heads_dataset(flow: Layers, values: list[tuple], t: np.ndarray) -> xr.Dataset:
    """The per-layer factors of the flow's heads: ``A_h = Q_h^T K_h``, ``V_h = VL_h VR_h``."""
    data: dict[str, tuple[tuple[str, ...], Any]] = {
        "hf_Q": (
            ("block", "head", "rank", "dim"),
            np.stack([h.queries.numpy() for h in flow.layers]).astype(np.float32),
        ),
        "hf_K": (("block", "head", "rank", "dim"), np.stack([h.K.numpy() for h in flow.layers]).astype(np.float32)),
        "hf_VL": (("block", "head", "dim", "rank"), np.stack([v[0].numpy() for v in values]).astype(np.float32)),
        "hf_VR": (("block", "head", "rank", "dim"), np.stack([v[1].numpy() for v in values]).astype(np.float32)),
    }
    for name in ("bias_q", "bias_k", "bias_v"):
        parts = [getattr(h, name) for h in flow.layers]
        if any(p is not None for p in parts):
            width = "rank" if name != "bias_v" else "dim"
            size = flow.layers[0].K.shape[-2] if name != "bias_v" else flow.layers[0].d
            arr = np.stack([np.zeros((flow.layers[0].H, size)) if p is None else p.numpy() for p in parts])
            data[f"hf_{name}"] = (("block", "head", width), arr)
    # Which layer acts at each saved time: Layers is piecewise constant, the last time keeps the last layer.
    layer_of_time = np.minimum(np.floor(t).astype(np.int64), flow.L - 1)
    data["hf_layer_of_time"] = (("time",), layer_of_time)
    return xr.Dataset(data, attrs={"heads_reader": HEADS_READER})


#: ``(A, V)`` ``(time, head, d, d)`` in float64 from the factors of :func:`heads_dataset` (the registered reader).
dense_heads = factored_heads


def save_hf_run(
    traj: Trajectory,
    cmp: Comparison,
    path: str | Path,
    *,
    overwrite: bool = False,
    figures: bool = True,
    flow: Layers | None = None,
    values: list[tuple] | None = None,
) -> Path:
    """A run folder plus ``hf_comparison.zarr`` and the hf figures, written atomically.

    With ``flow`` and ``values`` (the folded heads and their value factors,
    :func:`~attnflow.hf.sphere.value_factors`) the heads are stored once per layer as factors (see
    the module docstring); without them, densely at every saved time (the generic writer).
    """
    if flow is None and values is None and cmp.heads is not None:
        flow, values = cmp.heads
    with atomic_folder(path, overwrite=overwrite) as tmp:
        ds = trajectory_to_dataset(traj)
        if flow is not None and values is not None:
            ds = ds.drop_vars([v for v in ("A", "V") if v in ds])
            ds = xr.merge([ds, heads_dataset(flow, values, traj.t)], combine_attrs="override")
            ds.attrs["heads_reader"] = HEADS_READER
        write_dataset(ds, tmp / DATASET)
        if traj.config is not None:
            (tmp / CONFIG).write_text(yaml.safe_dump(traj.config, sort_keys=False))
        write_dataset(cmp.to_xarray(), tmp / COMPARISON)
        if figures:
            plot_run(traj, tmp / FIGURES)
            plot_comparison(cmp, tmp / FIGURES / "hf_comparison.png")
            plot_heads(cmp, tmp / FIGURES / "hf_heads.png")
        (tmp / PROVENANCE).write_text(json.dumps(provenance_record(traj), indent=2, default=str))
    return Path(path)
