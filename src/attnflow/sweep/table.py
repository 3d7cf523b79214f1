"""A sweep's results on disk: one JSON record per finished point, and the tidy tables built from them.

::

    DIR/
      sweep.yaml            the sweep file as run (resolved)
      points/<id>.json      one record per finished point (status ok or failed), written atomically
      trajectories/<id>/    full run folders, only with ``keep_trajectories: true``
      results.parquet       one row per point: parameters, seed, status, error, wall time, summaries
      timeseries.parquet    one row per (point, saved time): parameters, seed, t and every diagnostic

A record is written to a temporary name and renamed into place, so a killed worker leaves either
a whole record or none; the tables are rebuilt from the records at the end of every run.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from attnflow.core.errors import Hint, hinted
from attnflow.io.metadata import column_attrs
from attnflow.io.safety import atomic_write, open_regular
from attnflow.io.store import read_small_text
from attnflow.io.summary import time_to_cluster  # one home; re-exported here

POINTS = "points"
TRAJECTORIES = "trajectories"
RESULTS = "results.parquet"
TIMESERIES = "timeseries.parquet"
SPEC = "sweep.yaml"

#: The diagnostics summarised in the results table, each as ``<name>_end`` and ``<name>_mean``.
HEADLINE = ("energy", "slope", "clusters", "order_parameter", "metric_speed", "min_inner")


def point_path(out: Path, pid: str) -> Path:
    return Path(out) / POINTS / f"{pid}.json"


def write_record(out: Path, record: dict[str, Any]) -> Path:
    """Write one point's record atomically (temp file + rename) under ``out/points``."""
    final = point_path(out, record["point"])
    with atomic_write(final) as fh:  # never through a link planted in the folder
        fh.write(json.dumps(record, default=str))
    return final


def read_record(out: Path, pid: str) -> dict[str, Any] | None:
    """The record of point ``pid``, or ``None`` when it has not finished, is unreadable or is not a
    record of that point (a tampered record is run again, never trusted)."""
    p = point_path(out, pid)
    if p.is_symlink():
        return None
    try:
        rec = json.loads(read_small_text(p))
    except (OSError, ValueError):
        return None
    if not isinstance(rec, dict) or rec.get("point") != pid or rec.get("status") not in ("ok", "failed"):
        return None
    return rec if _well_formed(rec) else None


def _well_formed(rec: dict[str, Any]) -> bool:
    """Whether a record has the fields and types :func:`summarise` and :func:`assemble` read."""
    number = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
    if not (rec.get("error") is None or isinstance(rec["error"], str)):
        return False
    if not (rec.get("trajectory") is None or isinstance(rec["trajectory"], str)):
        return False
    if "wall_s" in rec and not (number(rec["wall_s"]) or rec["wall_s"] is None):
        return False
    if rec["status"] != "ok":
        return True
    t, diags, cfg = rec.get("t"), rec.get("diagnostics"), rec.get("config")
    if not (isinstance(t, list) and t and all(number(v) for v in t) and isinstance(diags, dict)):
        return False
    if not ({"slope", "clusters"} <= diags.keys() and isinstance(cfg, dict)):
        return False
    if not all(isinstance(v, list) and len(v) == len(t) and all(number(x) for x in v) for v in diags.values()):
        return False
    n = (cfg.get("tokens") or {}).get("n") if isinstance(cfg.get("tokens"), dict) else None
    return isinstance(n, int) and not isinstance(n, bool) and n > 0


def finished_ids(out: Path) -> set[str]:
    """Ids of every point with a record under ``out/points`` (cheap: file names only)."""
    d = Path(out) / POINTS
    if not d.is_dir():
        return set()
    return {n[:-5] for n in os.listdir(d) if n.endswith(".json") and not n.startswith(".")}


def time_average(t: np.ndarray, y: np.ndarray, window: float) -> float:
    """``1/|I| int_I y dt`` over the last fraction ``window`` of ``[t_0, t_end]`` (trapezoid rule)."""
    t0 = t[-1] - window * (t[-1] - t[0])
    keep = t >= t0 - 1e-12 * max(1.0, abs(t[-1]))
    tt, yy = t[keep], y[keep]
    if len(tt) < 2:
        return float(yy[-1])
    return float(np.trapezoid(yy, tt) / (tt[-1] - tt[0]))


def summarise(record: dict[str, Any], window: float = 0.5) -> dict[str, float]:
    """The headline numbers of one point: ``<diag>_end``, ``<diag>_mean`` (late window),
    ``slope_floor`` (late time average of ``|dF|^2``, docs/model.md) and ``t_cluster``."""
    out: dict[str, float] = {}
    if record.get("status") != "ok":
        return out
    t = np.asarray(record["t"], dtype=np.float64)
    diags = {k: np.asarray(v, dtype=np.float64) for k, v in record["diagnostics"].items()}
    for name in HEADLINE:
        if name in diags:
            out[f"{name}_end"] = float(diags[name][-1])
            out[f"{name}_mean"] = time_average(t, diags[name], window)
    out["slope_floor"] = time_average(t, diags["slope"] ** 2, window)
    n_tokens = int(record["config"]["tokens"]["n"])
    out["t_cluster"] = time_to_cluster(t, diags["clusters"], n_tokens)
    out["t_end"] = float(t[-1])
    return out


def _tidy(frame):
    """Parquet needs one type per column: a parameter mixing numbers and strings becomes strings."""
    for col in frame.columns:
        if frame[col].dtype == object:
            types = {type(v) for v in frame[col] if v is not None}
            if len(types) > 1 and not types <= {int, float}:
                frame[col] = frame[col].map(lambda v: None if v is None else str(v))
    return frame


def assemble(out: Path, points: list, window: float = 0.5) -> tuple[Any, Any]:
    """Build and write ``results.parquet`` and ``timeseries.parquet`` from the records of ``points``.

    Points without a record get a row with status ``pending``. Returns the two data frames.
    """
    import pandas as pd

    out = Path(out)
    rows, series = [], []
    for p in points:
        rec = read_record(out, p.id)
        row: dict[str, Any] = {"point": p.id, "index": p.index, **p.params, "seed": p.seed}
        if rec is None:
            row.update(status="pending", error=None, wall_s=math.nan)
        else:
            row.update(status=rec["status"], error=rec.get("error"), wall_s=rec.get("wall_s", math.nan))
            row.update(summarise(rec, window))
            row["trajectory"] = rec.get("trajectory")
            if rec["status"] == "ok":
                ts = pd.DataFrame({"t": rec["t"], **rec["diagnostics"]})
                for k, v in reversed(list({"point": p.id, **p.params, "seed": p.seed}.items())):
                    ts.insert(0, k, [v] * len(ts))
                series.append(ts)
        rows.append(row)
    table = _tidy(pd.DataFrame(rows))
    ts_table = _tidy(pd.concat(series, ignore_index=True)) if series else pd.DataFrame()
    params = sorted({k for p in points for k in p.params})
    for frame in (table, ts_table):  # kept in the parquet files' metadata (pandas DataFrame.attrs)
        frame.attrs["columns"] = column_attrs(list(frame.columns), params)
    _write_parquet(table, out / RESULTS)
    _write_parquet(ts_table, out / TIMESERIES)
    return table, ts_table


def _write_parquet(frame, path: Path) -> None:
    with atomic_write(path, "wb") as fh:
        frame.to_parquet(fh, index=False)


def load_sweep_results(out: str | os.PathLike, timeseries: bool = False):
    """The results table of a sweep folder (``timeseries=True``: the per-time table) as a DataFrame."""
    import pandas as pd

    p = Path(out) / (TIMESERIES if timeseries else RESULTS)
    if not p.is_file():
        raise hinted(
            FileNotFoundError(f"no sweep results at {str(p)!r}; run a sweep with out={str(out)!r} first"),
            Hint("out", str(out)),
        )
    with open_regular(p, out) as fh:  # checked, then read: never a pipe, never through a link
        return pd.read_parquet(fh)
