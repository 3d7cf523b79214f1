"""The summary ``attnflow show`` prints, written with the run as ``summary.json`` (issue 43).

``show`` of a finished run reads this small JSON file, the provenance and nothing else, so it
imports neither torch nor xarray (the final-state classification needs torch; xarray alone costs
about a second to import). The file is written by :func:`~attnflow.io.trajectory.write_summary` (called by
:func:`~attnflow.io.store.save_run`) before the manifest, so its digest is checked like every data file. Folders written before it existed (or
whose summary could not be computed) take the full path: load the dataset and compute.

:func:`run_summary` holds what does not depend on the times asked for (the whole diagnostic series,
time to clustering, EDI budget, final-state classification); :func:`show_record` picks the asked
times out of it. Both paths of ``show`` go through :func:`show_record`, so they print the same.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from attnflow.io.store import SUMMARY, read_json

__all__ = [
    "SUMMARY",
    "SUMMARY_FORMAT",
    "read_summary",
    "run_summary",
    "show_record",
    "time_to_cluster",
]
SUMMARY_FORMAT = "attnflow-summary/1"


def time_to_cluster(t: np.ndarray, clusters: np.ndarray, n_tokens: int) -> float:
    """First saved time from which the cluster count stays at its final value; NaN if it ends at ``N``."""
    final = clusters[-1]
    if n_tokens > 1 and final >= n_tokens:
        return math.nan
    changed = np.nonzero(clusters != final)[0]
    return float(t[0] if len(changed) == 0 else t[changed[-1] + 1])


def _clean(v: Any) -> Any:
    return None if v is None or (isinstance(v, float) and not math.isfinite(v)) else v


def run_summary(traj: Any, attrs: dict) -> dict:
    """The times-independent part of ``attnflow show``'s record of ``traj`` (a loaded
    :class:`~attnflow.io.trajectory.Trajectory`) and its dataset's attributes ``attrs``, JSON-ready.

    Parameters come from ``attrs``, else the config; attributes of the wrong type (a tampered folder)
    are treated as not recorded, never trusted.
    """
    cfg = traj.config or {}
    if "weights" not in cfg and isinstance(attrs.get("config"), str):
        try:
            parsed = json.loads(attrs["config"])
        except ValueError:
            parsed = None
        cfg = parsed if isinstance(parsed, dict) else cfg

    def section(name: str) -> dict:
        v = cfg.get(name) if isinstance(cfg, dict) else None
        return v if isinstance(v, dict) else {}

    def scalar(v: Any) -> Any:
        return v if isinstance(v, (int, float, str)) and not isinstance(v, bool) else None

    t = traj.t
    d = traj.diagnostics
    rec: dict[str, Any] = {
        "format": SUMMARY_FORMAT,
        "model": traj.model,
        "method": traj.method,
        "N": traj.N,
        "d": traj.d,
        "H": traj.H,
        "dt": traj.dt,
        "seed": traj.seed,
        "weights": scalar(attrs.get("weights_process", section("weights").get("process"))),
        "beta": scalar(attrs.get("beta", section("heads").get("beta"))),
        "cluster_eps": scalar(attrs.get("cluster_eps", section("diagnostics").get("cluster_eps"))),
        "t": [float(v) for v in t],
        "diagnostics": {name: [_clean(v.item()) for v in d[name]] for name in d},
        "time_to_clustering": None,
        "final_clusters": None,
        "edi": None,
        "ended_at": None,
    }
    if "clusters" in d:
        rec["final_clusters"] = int(d["clusters"][-1])
        rec["time_to_clustering"] = _clean(time_to_cluster(t, d["clusters"], traj.N))
    if traj.model == "gf" and traj.steps:
        from attnflow.analysis.edi import edi_budget

        b = edi_budget(traj)
        moved = b.total_dissipation > 0  # relative numbers are undefined for a flow at rest
        rec["edi"] = {
            "residual": float(b.total_residual),
            "relative_residual": float(b.relative_residual) if moved else None,
            "max_relative_residual": float(b.max_relative_residual) if moved else None,
            "total_dissipation": float(b.total_dissipation),
        }
    from attnflow.analysis.stationary import ended_at  # what the final state is (issue 29)

    summary, sentence = ended_at(traj, cluster_eps=rec["cluster_eps"])
    rec["ended_at"] = {"text": sentence, **(summary or {})}
    # Through JSON once, so that the record computed now and the one read back are the same values.
    return json.loads(json.dumps(rec, default=str))


def show_record(path: Path, summary: dict, provenance: dict, times: list[float] | None = None) -> dict:
    """``attnflow show``'s record of the run at ``path``: the saved times nearest to ``times``
    (default: first and last) picked out of ``summary`` (:func:`run_summary`), with the provenance."""
    t = np.asarray(summary["t"], dtype=np.float64)
    wanted = [float(t[0]), float(t[-1])] if times is None else times
    idx = list(dict.fromkeys(int(np.argmin(np.abs(t - w))) for w in wanted))  # nearest saved times, once each
    return {
        "path": str(path),
        **{k: summary[k] for k in ("model", "method", "N", "d", "H", "dt")},
        "t_start": float(t[0]),
        "t_end": float(t[-1]),
        "saved_times": len(t),
        **{k: summary[k] for k in ("seed", "weights", "beta", "cluster_eps")},
        "requested_times": None if times is None else wanted,
        "times": [float(t[k]) for k in idx],
        # counts stay as the dataset holds them
        "diagnostics": {name: [series[k] for k in idx] for name, series in summary["diagnostics"].items()},
        **{k: summary[k] for k in ("time_to_clustering", "final_clusters", "edi", "ended_at")},
        "wall_time_s": provenance.get("wall_time_s"),
        "attnflow_version": provenance.get("attnflow_version"),
        "git_commit": provenance.get("git_commit"),
    }


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def read_summary(path: str | Path) -> dict | None:
    """``summary.json`` of a run folder when present and well formed, else ``None`` (then ``show``
    computes the summary from the dataset). Call after the folder was verified against its manifest."""
    p = Path(path) / SUMMARY
    if not p.is_file() or p.is_symlink():
        return None
    try:
        s = read_json(p)
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    if not isinstance(s, dict) or s.get("format") != SUMMARY_FORMAT:
        return None
    t, diags = s.get("t"), s.get("diagnostics")
    if not (isinstance(t, list) and t and all(_is_number(v) for v in t)):
        return None
    if not isinstance(diags, dict) or not all(
        isinstance(k, str) and isinstance(v, list) and len(v) == len(t) and all(x is None or _is_number(x) for x in v)
        for k, v in diags.items()
    ):
        return None
    keys = ["model", "method", "N", "d", "H", "dt", "seed", "weights", "beta", "cluster_eps"]
    keys += ["time_to_clustering", "final_clusters", "edi", "ended_at"]
    if not all(k in s for k in keys):
        return None
    if not all(isinstance(s[k], (dict, type(None))) for k in ("edi", "ended_at")):
        return None
    return s
